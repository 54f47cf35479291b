// attention_launch.cuh — definitions of launch_paged_attention (baseline, pipelined and
// tensor-core pipelined kernels) / launch_v2_reduce (launch.h): the dispatch of the head size
// onto the AttentionDims group that holds its kernels (attention_dims.h; the kernels themselves
// are instantiated in the generated attention_<dtype>_<cache>_d<N>.cu files). Included only by
// the generated attention_<dtype>_<cache>.cu files, which instantiate one pair's launchers each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "attention_dims.h"
#include "dispatch.cuh"
#include "launch.h"
#include "reduce_kernel.cuh"

namespace paged_attn {
namespace cuda {

// The attention kernels' grid (num_seqs, num_kv_heads, partitions) and the head size's
// kDimsPerLane: launch(grid, IntC<kDimsPerLane>).
template <typename Launch>
void dispatch_attention_dims(const PagedAttentionParams& p, Launch&& launch) {
  const dim3 grid(p.num_seqs, p.num_kv_heads, p.partition_size > 0 ? p.max_num_partitions : 1);
  dispatch_head_size(p.head_size, [&](auto dims_per_lane) { launch(grid, dims_per_lane); });
}

template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  dispatch_attention_dims(p, [&](const dim3& grid, auto dims_per_lane) {
    AttentionDims<kScalar, kCache, decltype(dims_per_lane)::value>::baseline(grid, p, stream);
  });
}

template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention_pipelined(const PagedAttentionParams& p, cudaStream_t stream) {
  dispatch_attention_dims(p, [&](const dim3& grid, auto dims_per_lane) {
    AttentionDims<kScalar, kCache, decltype(dims_per_lane)::value>::pipelined(grid, p, stream);
  });
}

template <ScalarKind kScalar, CacheKind kCache>
bool launch_paged_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  bool on_tensor_cores = false;
  dispatch_attention_dims(p, [&](const dim3& grid, auto dims_per_lane) {
    on_tensor_cores =
        AttentionDims<kScalar, kCache, decltype(dims_per_lane)::value>::mma(grid, p, stream);
  });
  return on_tensor_cores;
}

template <ScalarKind kScalar>
cudaError_t launch_v2_reduce(const PagedAttentionParams& p, cudaStream_t stream,
                             bool programmatic) {
  using Scalar = typename ScalarOf<kScalar>::type;
  const dim3 grid(p.num_seqs, p.num_heads);
  const auto kernel = paged_attention_v2_reduce_kernel<Scalar, kWarpSize, kNumWarps, kMaxHeadSize>;
#if CUDART_VERSION >= 12000
  if (programmatic) {
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, p);
  }
#endif
  (void)programmatic;
  kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace paged_attn
