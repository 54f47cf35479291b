// kernel_variants.cpp — THE list of CPU kernel variants this build holds, best first (where a
// variant's slower_here says otherwise for the CPU at hand, kernel_choice.cpp ranks it after
// the next one): the launcher runs the first one the CPU supports (capped by the framework's CPU capability) unless
// PAGED_ATTN_CPU_KERNEL names another. Adding an ISA: its isa_<name>.cpp and one line here.
#include "attention_kernel.h"
#include "kernel_common.h"
#include "work_items.h"

namespace paged_attn {
namespace cpu {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PA_X86_64 1
PA_DECLARE_KERNEL_VARIANT(amx)
PA_DECLARE_KERNEL_VARIANT(avx512_bf16)
PA_DECLARE_KERNEL_VARIANT(avx512)
PA_DECLARE_KERNEL_VARIANT(avx2)
namespace avx512_bf16 {
const char* slower_here();
}
#endif
#if defined(__aarch64__)
#define PA_AARCH64 1
PA_DECLARE_KERNEL_VARIANT(neon)
#endif
PA_DECLARE_KERNEL_VARIANT(scalar)

namespace {
const KernelVariant kVariants[] = {
#ifdef PA_X86_64
    // bf16 caches on AMX tiles (amx_tiles.h); everything else runs avx512's code
    {"amx", IsaLevel::kAvx512, amx::cpu_supports, amx::attention_partition, nullptr,
     "bf16 caches with 3+ query heads per KV head and blocks of a multiple of 16 tokens (vLLM's "
     "layout: head size <= 256, a multiple of 16) on AMX tiles; other calls run avx512's code"},
    {"avx512-bf16", IsaLevel::kAvx512, avx512_bf16::cpu_supports, avx512_bf16::attention_partition,
     avx512_bf16::slower_here, nullptr},
    {"avx512", IsaLevel::kAvx512, avx512::cpu_supports, avx512::attention_partition, nullptr, nullptr},
    {"avx2-fma", IsaLevel::kAvx2, avx2::cpu_supports, avx2::attention_partition, nullptr, nullptr},
#endif
#ifdef PA_AARCH64
    {"neon", IsaLevel::kBaseline, neon::cpu_supports, neon::attention_partition, nullptr, nullptr},
#endif
    {"scalar", IsaLevel::kBaseline, scalar::cpu_supports, scalar::attention_partition, nullptr, nullptr},
};
}  // namespace

const KernelVariant* kernel_variants(int* count) {
  *count = static_cast<int>(sizeof(kVariants) / sizeof(kVariants[0]));
  return kVariants;
}

// Every variant's scratch (kernel_common.h's ScratchLayout).
size_t kernel_scratch_floats(const PagedAttentionParams& p, int kv_heads_per_item) {
  return static_cast<size_t>(
      ScratchLayout(p.num_heads / p.num_kv_heads * kv_heads_per_item, p.head_size, p.block_size)
          .total);
}

}  // namespace cpu
}  // namespace paged_attn
