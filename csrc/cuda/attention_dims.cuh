// attention_dims.cuh — the definitions of AttentionDims (attention_dims.h): the dispatch of the
// GQA ratio onto the kernel instantiations of one (dtype, cache, kDimsPerLane) group. Included
// only by the generated attention_<dtype>_<cache>_d<N>.cu files, which instantiate one group each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <atomic>

#include "attention_dims.h"
#include "attention_kernel.cuh"
#include "attention_kernel_pipelined.cuh"
#include "dispatch.cuh"
#include "launch.h"

namespace paged_attn {
namespace cuda {

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
// ops_cuda.cpp gives plan_split (kThreads, asserted here).
static_assert(kThreads % kWarpSize == 0, "split partitions are whole 32-token tiles");

template <ScalarKind kScalar, CacheKind kCache, int kDimsPerLane>
void AttentionDims<kScalar, kCache, kDimsPerLane>::baseline(const dim3& grid,
                                                            const PagedAttentionParams& p,
                                                            cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  dispatch_head_tile(p.num_heads / p.num_kv_heads, [&](auto head_tile) {
    paged_attention_kernel<Scalar, kCache, kDimsPerLane, decltype(head_tile)::value, kWarpSize,
                           kNumWarps><<<grid, kThreads, 0, stream>>>(p);
  });
}

template <ScalarKind kScalar, CacheKind kCache, int kDimsPerLane>
void AttentionDims<kScalar, kCache, kDimsPerLane>::pipelined(const dim3& grid,
                                                             const PagedAttentionParams& p,
                                                             cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  dispatch_head_tile(p.num_heads / p.num_kv_heads, [&](auto head_tile) {
    launch_pipelined_instance<Scalar, kCache, kDimsPerLane, decltype(head_tile)::value, false>(
        grid, p, stream);
  });
}

template <ScalarKind kScalar, CacheKind kCache, int kDimsPerLane>
bool AttentionDims<kScalar, kCache, kDimsPerLane>::mma(const dim3& grid,
                                                       const PagedAttentionParams& p,
                                                       cudaStream_t stream) {
  using Scalar = typename ScalarOf<kScalar>::type;
  bool on_tensor_cores = false;
  dispatch_head_tile(p.num_heads / p.num_kv_heads, [&](auto head_tile) {
    constexpr bool kMma = uses_tensor_cores(kScalar, decltype(head_tile)::value);
    launch_pipelined_instance<Scalar, kCache, kDimsPerLane, decltype(head_tile)::value, kMma>(
        grid, p, stream);
    on_tensor_cores = kMma;
  });
  return on_tensor_cores;
}

}  // namespace cuda
}  // namespace paged_attn
