// warp_reduce.cuh — butterfly all-reduce across the lanes of a warp, and a block all-reduce on
// top of it, in the manner of CUB's warp_reduce_shfl / block_reduce_warp_reductions.
//
// The lane exchange is an injected policy (`Shuffle`), so the SAME butterfly code runs on the GPU
// (CudaShuffleXor: __shfl_xor_sync) and on the host with simulated lanes
// (tests/test_warp_reduce_host.py runs it with 32 and 64 lanes against a sequential merge).
//
// A Shuffle policy is a callable `T operator()(const T& mine, int lane_mask)` that returns the
// value `mine` of lane (this_lane ^ lane_mask); every lane of the warp calls it together.
//
// The warp width is a template parameter (32 on NVIDIA, 64 on warp-64 targets); nothing in here
// is sized by a literal 32.
#pragma once

#include "../core/compound_state.h"

namespace paged_attn {

// ---------------------------------------------------------------------------------------------
// Reduction operators (host + device). Each is associative; MaxOp / SumOp are commutative bit for
// bit, the merges are commutative up to rounding (FMA contraction may order a*x + b*y).
// ---------------------------------------------------------------------------------------------
struct MaxOp {
  PA_HOST_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};

struct SumOp {
  PA_HOST_DEVICE float operator()(float a, float b) const { return a + b; }
};

// (max, sum) merge of softmax statistics (compound_state.h merge_stats; empty = {-inf, 0}).
struct StatsMergeOp {
  PA_HOST_DEVICE SoftmaxStats operator()(SoftmaxStats a, SoftmaxStats b) const {
    MergeFactors f;
    return merge_stats(a, b, f);
  }
};

// Full compound-state merge (max, sum, N output elements).
template <int N>
struct CompoundMergeOp {
  PA_HOST_DEVICE CompoundState<N> operator()(CompoundState<N> a, const CompoundState<N>& b) const {
    a.merge(b);
    return a;
  }
};

// ---------------------------------------------------------------------------------------------
// Butterfly all-reduce over aligned groups of kLanes lanes (kLanes = kWarpSize: the whole warp).
// log2(kLanes) steps; at step `mask`, lane i combines its value with lane i ^ mask's.
//
// Result: valid in EVERY lane of the group (an all-reduce). For MaxOp / SumOp every lane holds
// the same bits; for the merges lanes may differ in the last bits (each lane folds the same set in
// a different order): broadcast one lane's value when bit-identical results matter.
// Empty lanes (SoftmaxStats {-inf, 0}) are the identity of the merges and never produce NaN.
// ---------------------------------------------------------------------------------------------
template <int kWarpSize, int kLanes = kWarpSize, typename T, typename Op, typename Shuffle>
PA_HOST_DEVICE T butterfly_allreduce(T value, Op op, const Shuffle& shuffle) {
  static_assert(kWarpSize == 32 || kWarpSize == 64, "warp width must be 32 or 64");
  static_assert(kLanes >= 1 && kLanes <= kWarpSize && (kLanes & (kLanes - 1)) == 0,
                "kLanes must be a power of two no larger than the warp");
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int mask = kLanes / 2; mask > 0; mask >>= 1) {
    value = op(value, shuffle(value, mask));
  }
  return value;
}

#if defined(__CUDACC__) || defined(PAGED_ATTN_CUDA_HOST_SIM)  // the latter: tests/cuda_sim
// ---------------------------------------------------------------------------------------------
// The device shuffle policy: __shfl_xor_sync over the full warp, field by field for the structs.
// NOTE: all kWarpSize lanes must call it together (full mask).
// ---------------------------------------------------------------------------------------------
template <int kWarpSize>
struct CudaShuffleXor {
  static_assert(kWarpSize == 32 || kWarpSize == 64, "warp width must be 32 or 64");
#if !defined(__HIP_PLATFORM_AMD__)
  static_assert(kWarpSize == 32, "NVIDIA warps have 32 lanes");
#endif

  __device__ __forceinline__ float operator()(float v, int lane_mask) const {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask, kWarpSize);
  }
  __device__ __forceinline__ SoftmaxStats operator()(const SoftmaxStats& v, int lane_mask) const {
    return SoftmaxStats{(*this)(v.max, lane_mask), (*this)(v.sum, lane_mask)};
  }
  template <int N>
  __device__ __forceinline__ CompoundState<N> operator()(const CompoundState<N>& v,
                                                         int lane_mask) const {
    CompoundState<N> r;
    r.stats = (*this)(v.stats, lane_mask);
#pragma unroll
    for (int i = 0; i < N; ++i) r.out[i] = (*this)(v.out[i], lane_mask);
    return r;
  }
};

// ---------------------------------------------------------------------------------------------
// Block all-reduce: each warp butterflies, lane 0 of warp w stores its result in smem[w], and
// every thread then folds smem[0], smem[1], ..., smem[kNumWarps-1] in that FIXED order, so all
// threads of the block get the same bits run after run.
// Preconditions: blockDim.x == kNumWarps * kWarpSize, every thread calls it (it has barriers).
// smem: kNumWarps elements of shared memory. Result: valid in every thread of the block.
// NOTE: ends with a barrier so the caller may reuse smem at once.
// ---------------------------------------------------------------------------------------------
template <int kWarpSize, int kNumWarps, typename T, typename Op>
__device__ __forceinline__ T block_allreduce(T value, Op op, T* smem) {
  const CudaShuffleXor<kWarpSize> shuffle;
  value = butterfly_allreduce<kWarpSize>(value, op, shuffle);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) smem[warp] = value;
  __syncthreads();
  T result = smem[0];
#pragma unroll
  for (int w = 1; w < kNumWarps; ++w) result = op(result, smem[w]);
  __syncthreads();
  return result;
}
#endif  // __CUDACC__ || PAGED_ATTN_CUDA_HOST_SIM

}  // namespace paged_attn
