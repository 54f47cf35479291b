// attention_dims.h — the attention kernels of one (query dtype, cache kind, kDimsPerLane) group,
// declared without kernel code. attention_launch.cuh's launchers call these for the group of the
// call's head size; each generated attention_<dtype>_<cache>_d<N>.cu file instantiates the
// definitions (attention_dims.cuh) of one group. One translation unit per group keeps the
// heaviest file of a build small: a pair's kernels in one file took ~90 s of one core for sm_90
// alone (docs/BUILD.md), the longest step of a parallel build on a many-core machine.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/params.h"

namespace paged_attn {
namespace cuda {

// kDimsPerLane = dims_per_lane(head size) (dispatch.cuh). Each member launches, on grid
// (num_seqs, num_kv_heads, partitions), its family's kernel for the GQA ratio
// p.num_heads / p.num_kv_heads (dispatch_head_tile). Preconditions: launch.h's.
template <ScalarKind kScalar, CacheKind kCache, int kDimsPerLane>
struct AttentionDims {
  // attention_kernel.cuh
  static void baseline(const dim3& grid, const PagedAttentionParams& p, cudaStream_t stream);
  // attention_kernel_pipelined.cuh with CUDA-core math
  static void pipelined(const dim3& grid, const PagedAttentionParams& p, cudaStream_t stream);
  // the pipelined kernel on tensor cores where uses_tensor_cores() takes the head tile, else
  // with CUDA-core math; true when the tensor-core kernel was launched
  static bool mma(const dim3& grid, const PagedAttentionParams& p, cudaStream_t stream);
};

}  // namespace cuda
}  // namespace paged_attn
