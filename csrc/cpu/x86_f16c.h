// x86_f16c.h — does this x86-64 CPU have F16C (the fp16 <-> fp32 conversions the avx2-fma and
// avx512 layers decode fp16 caches with)? Asked through CPUID leaf 1 (ECX bit 29) because
// __builtin_cpu_supports("f16c") is a compile error in clang 14 ("invalid cpu feature string");
// the other features keep __builtin_cpu_supports, which also checks that the OS saves AVX state.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>

namespace paged_attn {
namespace cpu {

inline bool x86_has_f16c() {
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  return (ecx & (1u << 29)) != 0;
}

}  // namespace cpu
}  // namespace paged_attn

#endif  // x86-64
