// compound_state.h — the softmax compound state (max, sum, weighted output) and its combine.
//
// Framework-free (no torch header): used by the CUDA warp/block reductions, the CPU kernel's
// online softmax and partition merge, and mirrored line for line by the PyTorch oracle
// (paged_attention_ext/reference.py: merge_stats / combine_partitions).
//
// A set of logits l_t with values v_t is summarised by
//   max = max_t l_t
//   sum = sum_t exp(l_t - max)
//   out = sum_t exp(l_t - max) * v_t          (UNnormalised; divide by sum to get the softmax output)
// The empty set is {max = -inf, sum = 0, out = 0}. Merging two summaries a, b:
//   m = max(a.max, b.max);  alpha = exp(a.max - m);  beta = exp(b.max - m)
//   sum = a.sum * alpha + b.sum * beta;   out = a.out * alpha + b.out * beta
// NOTE: when both are empty, m = -inf and exp(-inf - -inf) = exp(NaN): the merge special-cases
// that and returns the empty state, so empty lanes/partitions never produce NaN.
#pragma once

#include <cmath>

#include "host_device.h"

namespace paged_attn {

// (max, sum) of a set of logits; the weighted output is kept by the caller (its length is the
// head size or a lane's share of it) and rescaled with the factors merge_stats returns.
struct SoftmaxStats {
  float max;  // -inf for the empty set
  float sum;  // sum of exp(l - max); 0 for the empty set
};

PA_HOST_DEVICE SoftmaxStats empty_stats() { return SoftmaxStats{-INFINITY, 0.0f}; }

// Rescale factors for merging a and b: merged.out = a.out * scale_a + b.out * scale_b.
struct MergeFactors {
  float scale_a;
  float scale_b;
};

// Merge two summaries. Returns the merged stats; `f` receives the factors for the outputs.
PA_HOST_DEVICE SoftmaxStats merge_stats(SoftmaxStats a, SoftmaxStats b, MergeFactors& f) {
  const float m = fmaxf(a.max, b.max);
  if (m == -INFINITY) {  // both empty: stay empty, never exp(NaN)
    f.scale_a = 0.0f;
    f.scale_b = 0.0f;
    return empty_stats();
  }
  f.scale_a = expf(a.max - m);  // exp(-inf) = 0 for an empty side
  f.scale_b = expf(b.max - m);
  return SoftmaxStats{m, a.sum * f.scale_a + b.sum * f.scale_b};
}

// 1 / sum for normalising an output; 0 for the empty set (seq_len == 0 gives zeros, not NaN).
PA_HOST_DEVICE float inv_sum(SoftmaxStats s) { return s.sum > 0.0f ? 1.0f / s.sum : 0.0f; }

// A summary whose output vector has N elements held by one thread/lane (compile-time N, so it
// lives in registers on the GPU). The warp reduction combines these with merge().
template <int N>
struct CompoundState {
  SoftmaxStats stats;
  float out[N];

  PA_HOST_DEVICE void init() {
    stats = empty_stats();
PA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = 0.0f;
  }

  // this <- this (+) other
  PA_HOST_DEVICE void merge(const CompoundState& other) {
    MergeFactors f;
    stats = merge_stats(stats, other.stats, f);
PA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = out[i] * f.scale_a + other.out[i] * f.scale_b;
  }
};

// Phase 2 of v2 (and the CPU kernel's partition merge): partition p holds its max m_p, its exp sum
// s_p and its output NORMALISED by s_p. The combined output is
//   sum_p w_p * out_p,   w_p = s_p * exp(m_p - M) / sum_q s_q * exp(m_q - M),   M = max_p m_p.
// partition_weights writes w_p for p < n into `w` (n >= 1); empty partitions get weight 0,
// all-empty input gives all-zero weights.
PA_HOST_DEVICE void partition_weights(const float* max_logits, const float* exp_sums, int n,
                                      float* w) {
  float m = -INFINITY;
  for (int p = 0; p < n; ++p) m = fmaxf(m, max_logits[p]);
  float total = 0.0f;
  for (int p = 0; p < n; ++p) {
    w[p] = (m == -INFINITY) ? 0.0f : exp_sums[p] * expf(max_logits[p] - m);
    total += w[p];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int p = 0; p < n; ++p) w[p] *= inv;
}

}  // namespace paged_attn
