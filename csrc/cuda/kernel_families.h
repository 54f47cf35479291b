// kernel_families.h — which attention kernel families each arch's device code holds: THE rule,
// for the kernels (an empty body that traps where a family is not compiled), the kernel choice
// (kernel_choice.cu never picks a family the running code lacks) and build_info().
//
//   code for sm_80 and newer: the pipelined kernel and its tensor-core form (built around
//     cp.async, ldmatrix and mma.sync, sm_80's), and the baseline only in builds asked for it
//     (-DPAGED_ATTN_CUDA_BASELINE: PAGED_ATTN_CUDA_BASELINE=1 at build time, which CI and the GPU
//     check use; it is the reference PAGED_ATTN_CUDA_KERNEL=baseline measures against);
//   code below sm_80 (sm_75, a T4; PTX older than compute_80): the baseline only, the one kernel
//     the choice runs there.
// A family left out keeps its symbols (the host code is shared by every arch) with a body of one
// trap, so a build pays for it neither in compile time nor in size (docs/BUILD.md).
// Plain C++: the host simulation and tests/test_kernel_choice_host.py compile it too.
#pragma once

namespace paged_attn {
namespace cuda {

constexpr int kMinPipelinedArch = 80;  // cp.async, ldmatrix, mma.sync with bf16: sm_80

#ifdef PAGED_ATTN_CUDA_BASELINE
constexpr bool kBaselineOnEveryArch = true;
#else
constexpr bool kBaselineOnEveryArch = false;
#endif

// code_arch: major * 10 + minor of the code that runs (probe_kernel_image in launch.h).
constexpr bool baseline_compiled_for(int code_arch) {
  return kBaselineOnEveryArch || code_arch < kMinPipelinedArch;
}
constexpr bool pipelined_compiled_for(int code_arch) { return code_arch >= kMinPipelinedArch; }

}  // namespace cuda
}  // namespace paged_attn

// For the kernels' bodies (#if): 1 where this compilation pass holds the family's code. The host
// pass and the host simulation (no __CUDA_ARCH__) see every body; the host pass compiles none of
// them (only the launch stubs).
#if defined(__CUDA_ARCH__)
#define PAGED_ATTN_DEVICE_CODE_HAS_BASELINE \
  (::paged_attn::cuda::baseline_compiled_for(__CUDA_ARCH__ / 10))
#define PAGED_ATTN_DEVICE_CODE_HAS_PIPELINED \
  (::paged_attn::cuda::pipelined_compiled_for(__CUDA_ARCH__ / 10))
#else
#define PAGED_ATTN_DEVICE_CODE_HAS_BASELINE true
#define PAGED_ATTN_DEVICE_CODE_HAS_PIPELINED true
#endif
