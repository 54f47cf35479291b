// fast_math.cuh — the exponential of the kernels' softmax probabilities.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace paged_attn {
namespace cuda {

// e^x for a probability exp(logit - running max), x <= 0, as the hardware's base-2 exponential
// of x * log2(e) with subnormal results flushed to zero (ex2.approx.ftz: a multiply and one
// MUFU.EX2, where expf's exact range reduction and __expf's subnormal handling take 6-10
// instructions, once per token and head). The flush only zeroes probabilities below 2^-126 of the
// row's largest; ex2.approx's relative error is about 2^-22, plus the rounding of x * log2(e)
// (relative 2^-24 of x). The host simulation (tests/cuda_sim) computes the same base-2
// exponential with the flush and an error of 2^-22 relative, its sign varying with x.
__device__ __forceinline__ float fast_exp(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)
  const float y = std::exp2(x * 1.4426950408889634f);
  if (std::fpclassify(y) == FP_SUBNORMAL) return 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return y * ((bits * 2654435761u) >> 31 ? 1.0f + 0x1p-22f : 1.0f - 0x1p-22f);
#else
  return std::exp(x);
#endif
}

}  // namespace cuda
}  // namespace paged_attn
