// paged_attention_cpu.h — the CPU launchers behind the op registrations in bindings_cpu.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include "../core/params.h"

namespace paged_attn {
namespace cpu {

// Runs v1 or decode (tmp_out == nullptr) or v2 on validated params (make_*_params already ran;
// the data checks run here). query / out / tmp_out: the tensors the params point into.
void paged_attention(const char* op, const PagedAttentionParams& p, const at::Tensor& query,
                     const at::Tensor& out, const at::Tensor* tmp_out);

// reshape_and_cache on validated params (the data check runs here).
void reshape_and_cache(const char* op, const ReshapeAndCacheParams& p);

}  // namespace cpu
}  // namespace paged_attn
