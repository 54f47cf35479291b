// fast_math.cuh — the exponential of the kernels' softmax probabilities.
#pragma once

namespace paged_attn {
namespace cuda {

// e^x for a probability exp(logit - running max), x <= 0: __expf is the hardware's base-2
// exponential of x * log2(e) (2 instructions; expf's exact range reduction costs ~10 per call,
// once per token and head). Its error, 2 + floor(1.173 |x|) ulp by the CUDA programming guide,
// grows only where the probability is already below e^-17 of the row's largest. The host
// simulation (tests/cuda_sim) defines __expf as std::exp.
__device__ __forceinline__ float fast_exp(float x) { return __expf(x); }

}  // namespace cuda
}  // namespace paged_attn
