// grid_dependency.cuh — programmatic dependent launch (PDL, sm_90+): the split's reduce kernel
// may start while the attention kernel before it in the stream is still finishing.
//
// Without PDL a kernel starts only after the one before it has completed: between phase 1 of a
// split and its reduce the GPU drains the last blocks, then launches the reduce (a few
// microseconds, which at batch 8 x 1k is a large share of the call). With PDL
// (ops_cuda.cpp launches the reduce with cudaLaunchAttributeProgrammaticStreamSerialization when
// PAGED_ATTN_CUDA_PDL=1 and the code was compiled for sm_90+) the reduce grid is launched once
// every block of the attention kernel has called allow_dependent_launch(), and each reduce block
// waits in wait_for_prerequisite_grids() until the attention kernel has completed and its writes
// are visible. So the reduce reads no scratch before phase 1 has written all of it: the wait is
// the reduce kernel's first statement.
//
// Both are no-ops where the code is compiled below sm_90 (no griddepcontrol instruction), in the
// host simulation, and in a kernel launched without the attribute.
#pragma once

namespace paged_attn {
namespace cuda {

// In the attention kernels, at their start: every block of this grid has been scheduled once all
// have called it, so a dependent grid launched now only takes what the last wave leaves free.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// In the reduce kernel, before anything else: returns once the grids this one depends on (the
// attention kernel of the same call) have completed and their memory operations are visible.
__device__ __forceinline__ void wait_for_prerequisite_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace paged_attn
