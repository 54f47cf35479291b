// isa_avx512.cpp — two variants of the CPU kernel on the AVX-512 vector layer (avx512_layer.h):
// "avx512-bf16" (a bf16 cache's QK and PV on vdpbf16ps, CPUs with AVX512_BF16) and "avx512".
// The algorithm is partition_kernel.h; the layer only supplies primitives (contract there).
#include "kernel_common.h"
#include "x86_f16c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// Everything below is compiled for AVX-512 and runs only after cpu_supports().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside _mm512_reduce_* / masks
#endif

#define PA_ISA avx512
#include "avx512_layer.h"

namespace paged_attn {
namespace cpu {
namespace avx512 {

// The layer as it is: no addition.
struct Isa : Avx512Layer {};

}  // namespace avx512
}  // namespace cpu
}  // namespace paged_attn

#include "partition_kernel.h"
#undef PA_ISA

PA_DEFINE_ENTRY_POINT(avx512, avx512, /*bf16_dot=*/false)
PA_DEFINE_ENTRY_POINT(avx512_bf16, avx512, /*bf16_dot=*/true)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace paged_attn {
namespace cpu {

namespace avx512 {
bool cpu_supports() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         x86_has_f16c();
}
}  // namespace avx512

namespace avx512_bf16 {
bool cpu_supports() { return avx512::cpu_supports() && __builtin_cpu_supports("avx512bf16"); }

// The bf16 dot product (vdpbf16ps: 32 multiply-adds per instruction) beat avx512's fp32 FMAs
// on bf16 caches on the AMD EPYC measured (Zen 4: 12-15% less compute per token), but cost
// 10-35% more on the Intel Xeon measured (Sapphire Rapids class, whose two FMA ports already do
// 32 multiply-adds a cycle; docs/CPU_KERNEL.md, "Which CPU gets which kernel"). So it leads
// only on AMD; other vendors get the FMAs unless PAGED_ATTN_CPU_KERNEL=avx512-bf16.
const char* slower_here() {
  __builtin_cpu_init();
  if (__builtin_cpu_is("amd")) return nullptr;
  return "its bf16 dot product is slower than avx512's FMAs on non-AMD cores (measured on an "
         "Intel Xeon)";
}
}  // namespace avx512_bf16

}  // namespace cpu
}  // namespace paged_attn

#endif  // x86-64
