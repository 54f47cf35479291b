// paged_attention_cpu.h — the CPU launchers behind the entry points of bindings_cpu.cpp. They take
// params only (every check, the data checks included, ran before) and read no tensor.
#pragma once

#include "../core/params.h"
#include "attention_kernel.h"

namespace paged_attn {
namespace cpu {

// Runs v1 or decode (is_v2 false: writes p.out) or v2 (also exp_sums / max_logits / tmp_out) on
// checked params with `kernel`, the variant chosen for this call (kernel_choice.h).
void paged_attention(const PagedAttentionParams& p, bool is_v2, PartitionKernel kernel);

// reshape_and_cache / reshape_and_cache_flash on checked params (slots in range).
void reshape_and_cache(const ReshapeAndCacheParams& p);

}  // namespace cpu
}  // namespace paged_attn
