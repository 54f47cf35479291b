// paged_attention_cpu.h — the CPU launchers behind the entry points of bindings_cpu.cpp. They take
// params only (every check, the data checks included, ran before) and read no tensor.
#pragma once

#include <cstdint>

#include "../core/params.h"
#include "attention_kernel.h"

namespace paged_attn {
namespace cpu {

// Runs v1 or decode (is_v2 false: writes p.out) or v2 (also exp_sums / max_logits / tmp_out) on
// checked params with `kernel`, the variant chosen for this call (kernel_choice.h), on one thread
// per min_kv_bytes_per_thread of K / V it reads (threads_per_call.h), at most torch's.
void paged_attention(const PagedAttentionParams& p, bool is_v2, PartitionKernel kernel,
                     int64_t min_kv_bytes_per_thread);

// reshape_and_cache / reshape_and_cache_flash on checked params (slots in range), on one thread
// per min_bytes_per_thread of K / V written (threads_per_call.h), at most torch's.
void reshape_and_cache(const ReshapeAndCacheParams& p, int64_t min_bytes_per_thread);

}  // namespace cpu
}  // namespace paged_attn
