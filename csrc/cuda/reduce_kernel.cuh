// reduce_kernel.cuh — phase 2 of a split (v2, and the CUDA v1 / decode split): combine a row's
// partitions of p.partition_size tokens by the log-sum-exp rule.
//
// Partition p of a row holds its max logit m_p, its exp sum s_p and its output normalised by s_p
// (attention_kernel.cuh). With (M, S) the merge of all (m_p, s_p) (compound_state.h merge_stats),
//   out = sum_p tmp_out_p * w_p,   w_p = s_p * exp(m_p - M) / S.
// The block folds the partitions' (m_p, s_p) per thread (strided), merges the threads' stats with
// the warp butterfly + fixed-order block reduction (warp_reduce.cuh), then computes the weights
// in chunks of kThreads partitions in shared memory (any partition count, fixed shared memory)
// and accumulates tmp_out with one thread per output dim.
//
// NOTE (docs/DESIGN.md): rows the attention kernel could not serve are written as NaN here: the
// rows row_check.cuh refuses, and a partition whose max_logits / exp_sums is NaN
// (a bad block id). seq_len == 0 gives zeros.
#pragma once

#include <cstdint>

#include "../core/compound_state.h"
#include "../core/params.h"
#include "cache_access.cuh"
#include "grid_dependency.cuh"
#include "row_check.cuh"
#include "warp_reduce.cuh"

namespace paged_attn {
namespace cuda {

// Grid: (num_seqs, num_heads); p.partition_size > 0.
// Block: kNumWarps * kWarpSize threads; head_size <= kMaxHeadSize.
template <typename Scalar, int kWarpSize, int kNumWarps, int kMaxHeadSize>
__global__ void __launch_bounds__(kNumWarps* kWarpSize)
    paged_attention_v2_reduce_kernel(const PagedAttentionParams p) {
  constexpr int kThreads = kNumWarps * kWarpSize;
  constexpr int kDimsPerThread = (kMaxHeadSize + kThreads - 1) / kThreads;
  __shared__ SoftmaxStats reduce_smem[kNumWarps];
  __shared__ float weights[kThreads];  // one chunk of partition weights
  wait_for_prerequisite_grids();  // PDL: phase 1's scratch complete (grid_dependency.cuh)

  const int seq = blockIdx.x;
  const int head = blockIdx.y;
  const int head_size = p.head_size;
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  Scalar* out = static_cast<Scalar*>(p.out) + row * head_size;  // [head_size]

  const int seq_len = p.seq_lens[seq];
  if (!row_fits(p, seq_len) || partitions_needed(seq_len, p.partition_size) > p.max_num_partitions) {
    for (int d = threadIdx.x; d < head_size; d += kThreads) out[d] = from_float<Scalar>(__int_as_float(0x7fc00000));
    return;
  }
  const int64_t needed = partitions_needed(seq_len, p.partition_size);
  if (needed == 0) {  // empty row: zeros, as the oracle
    for (int d = threadIdx.x; d < head_size; d += kThreads) out[d] = from_float<Scalar>(0.0f);
    return;
  }
  const int n = static_cast<int>(needed);
  const float* max_logits = p.max_logits + row * p.max_num_partitions;  // [max_num_partitions]
  const float* exp_sums = p.exp_sums + row * p.max_num_partitions;      // [max_num_partitions]
  // [max_num_partitions, head_size]
  const Scalar* tmp_out = static_cast<const Scalar*>(p.tmp_out) + row * p.max_num_partitions * head_size;

  // ---- global (M, S) over the partitions ----
  SoftmaxStats stats = empty_stats();
  bool bad = false;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const float m = max_logits[i];
    const float s = exp_sums[i];
    bad = bad || isnan(m) || isnan(s);
    MergeFactors f;
    stats = merge_stats(stats, SoftmaxStats{m, s}, f);
  }
  bad = __syncthreads_or(bad);
  stats = block_allreduce<kWarpSize, kNumWarps>(stats, StatsMergeOp{}, reduce_smem);
  if (bad) {  // uniform
    for (int d = threadIdx.x; d < head_size; d += kThreads) out[d] = from_float<Scalar>(__int_as_float(0x7fc00000));
    return;
  }
  const float inv_total = inv_sum(stats);

  // ---- out = sum_p w_p * tmp_out_p, weights in chunks of kThreads ----
  float acc[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) acc[k] = 0.0f;
  for (int c0 = 0; c0 < n; c0 += kThreads) {
    const int i = c0 + threadIdx.x;
    weights[threadIdx.x] = (i < n && stats.max != -INFINITY)
                               ? exp_sums[i] * expf(max_logits[i] - stats.max) * inv_total
                               : 0.0f;
    __syncthreads();
    const int chunk = min(kThreads, n - c0);
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = threadIdx.x + k * kThreads;
      if (d < head_size) {
        for (int c = 0; c < chunk; ++c)
          acc[k] += weights[c] * to_float(tmp_out[static_cast<int64_t>(c0 + c) * head_size + d]);
      }
    }
    __syncthreads();  // NOTE: the next chunk overwrites `weights`
  }
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = threadIdx.x + k * kThreads;
    if (d < head_size) out[d] = from_float<Scalar>(acc[k]);
  }
}

}  // namespace cuda
}  // namespace paged_attn
