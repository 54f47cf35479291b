// attention_launch.cuh — definitions of launch_paged_attention (baseline, pipelined and
// tensor-core pipelined kernels) / launch_v2_reduce (launch.h):
// the dispatch of dispatch.cuh's lists onto kernel instantiations. Included only by the
// attention_<dtype>_<cache>.cu files, which instantiate one (dtype, cache) pair each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "attention_kernel.cuh"
#include "attention_kernel_pipelined.cuh"
#include "dispatch.cuh"
#include "launch.h"
#include "reduce_kernel.cuh"

namespace paged_attn {
namespace cuda {

// Both attention kernels' grid (num_seqs, num_kv_heads, partitions) and template shape:
// launch(grid, IntC<kDimsPerLane>, IntC<kHeadTile>) for p's head size and GQA ratio.
template <typename Launch>
void dispatch_attention_shape(const PagedAttentionParams& p, Launch&& launch) {
  const dim3 grid(p.num_seqs, p.num_kv_heads, p.partition_size > 0 ? p.max_num_partitions : 1);
  const int group = p.num_heads / p.num_kv_heads;
  dispatch_head_size(p.head_size, [&](auto dims_per_lane) {
    dispatch_head_tile(group, [&](auto head_tile) { launch(grid, dims_per_lane, head_tile); });
  });
}

template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  dispatch_attention_shape(p, [&](const dim3& grid, auto dims_per_lane, auto head_tile) {
    constexpr int kDimsPerLane = decltype(dims_per_lane)::value;
    constexpr int kHeadTile = decltype(head_tile)::value;
    paged_attention_kernel<Scalar, kCache, kDimsPerLane, kHeadTile, kWarpSize, kNumWarps>
        <<<grid, kThreads, 0, stream>>>(p);
  });
}

// One instantiation of the pipelined kernel (attention_kernel_pipelined.cuh), whose shared
// memory is dynamic: above 48 KiB the kernel must be allowed it first, once per device (the
// driver's answer is cached here, so a launch costs no extra runtime call). A refusal is left
// for the caller's launch check (cudaGetLastError), as a failed launch is.
template <typename Scalar, CacheKind kCache, int kDimsPerLane, int kHeadTile, bool kMma>
void launch_pipelined_instance(const dim3& grid, const PagedAttentionParams& p,
                               cudaStream_t stream) {
  using CacheT = typename CacheElement<Scalar, kCache>::type;
  constexpr int kSmem =
      PipelineConfig<CacheT, kDimsPerLane, kHeadTile, kWarpSize, kNumWarps, kMma>::kSmemBytes;
  auto* kernel = paged_attention_pipelined_kernel<Scalar, kCache, kDimsPerLane, kHeadTile,
                                                  kWarpSize, kNumWarps, kMma>;
  if constexpr (kSmem > 48 * 1024) {
    static std::array<std::atomic<bool>, kMaxDevices> allowed{};  // per device
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return;
    if (!allowed[device].load(std::memory_order_acquire)) {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) !=
          cudaSuccess)
        return;
      allowed[device].store(true, std::memory_order_release);  // a racing thread sets it too
    }
  }
  kernel<<<grid, kThreads, kSmem, stream>>>(p);
}

// NOTE: the pipelined kernel needs partitions of whole 32-token tiles: v2's kPartitionSize
// (checked in PipelineConfig) and the v1 / decode split's sizes, multiples of the tile_tokens
// ops_cuda.cu gives plan_split (kThreads, asserted here).
static_assert(kThreads % kWarpSize == 0, "split partitions are whole 32-token tiles");

// The same dispatch onto the pipelined kernel with CUDA-core math.
template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention_pipelined(const PagedAttentionParams& p, cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  dispatch_attention_shape(p, [&](const dim3& grid, auto dims_per_lane, auto head_tile) {
    launch_pipelined_instance<Scalar, kCache, decltype(dims_per_lane)::value,
                              decltype(head_tile)::value, false>(grid, p, stream);
  });
}

// The pipelined kernel with the GQA group on tensor cores where uses_tensor_cores() takes the
// shape, else with CUDA-core math; true when the tensor-core kernel was launched.
template <ScalarKind kScalar, CacheKind kCache>
bool launch_paged_attention_mma(const PagedAttentionParams& p, cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  bool on_tensor_cores = false;
  dispatch_attention_shape(p, [&](const dim3& grid, auto dims_per_lane, auto head_tile) {
    constexpr bool kMma = uses_tensor_cores(kScalar, decltype(head_tile)::value);
    launch_pipelined_instance<Scalar, kCache, decltype(dims_per_lane)::value,
                              decltype(head_tile)::value, kMma>(grid, p, stream);
    on_tensor_cores = kMma;
  });
  return on_tensor_cores;
}

template <ScalarKind kScalar>
void launch_v2_reduce(const PagedAttentionParams& p, cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  const dim3 grid(p.num_seqs, p.num_heads);
  paged_attention_v2_reduce_kernel<Scalar, kWarpSize, kNumWarps, kMaxHeadSize>
      <<<grid, kThreads, 0, stream>>>(p);
}

}  // namespace cuda
}  // namespace paged_attn
