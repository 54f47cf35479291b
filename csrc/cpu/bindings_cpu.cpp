// bindings_cpu.cpp — registers the CPU kernels for both overloads of every paged_attn op
// (schemas: csrc/ops.cpp; the overloads, which turn arguments into params: torch_glue/overloads.h).
// The two entry points run the checks that read tensor data (block ids, lengths, slots: host
// memory the params point into), then the launchers, which get params only.
#include <torch/library.h>

#include <string>

#include "../torch_glue/overloads.h"
#include "../torch_glue/validate.h"
#include "kernel_choice.h"
#include "paged_attention_cpu.h"
#include "threads_per_call.h"

namespace paged_attn {
namespace cpu {
namespace {

// The K / V bytes per thread of this call (threads_per_call.h); a bad
// PAGED_ATTN_CPU_KV_BYTES_PER_THREAD is a ValueError.
int64_t bytes_per_thread(const char* op) {
  std::string error;
  const int64_t min_bytes = min_kv_bytes_per_thread(&error);
  TORCH_CHECK_VALUE(min_bytes > 0, "paged_attn.", op, ": ", error);
  return min_bytes;
}

// v1, v2 and decode.
void attention(const char* op, const PagedAttentionParams& p, bool is_v2, c10::Device) {
  check_attention_data(op, p, is_v2);
  std::string choice_error;
  const KernelVariant* variant = choose_variant(&choice_error);
  TORCH_CHECK_VALUE(variant != nullptr, "paged_attn.", op, ": ", choice_error);
  paged_attention(p, is_v2, variant->run, bytes_per_thread(op));
}

// reshape_and_cache and reshape_and_cache_flash.
void cache(const char* op, const ReshapeAndCacheParams& p, c10::Device) {
  check_cache_data(op, p);
  reshape_and_cache(p, bytes_per_thread(op));
}

}  // namespace
}  // namespace cpu
}  // namespace paged_attn

PAGED_ATTN_REGISTER_KERNELS(CPU, paged_attn::cpu::attention, paged_attn::cpu::cache)
