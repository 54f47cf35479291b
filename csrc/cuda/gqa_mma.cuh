// gqa_mma.cuh — one warp's attention math for the query heads of a GQA group on tensor cores
// (mma.sync, sm_80+): QK and P.V of up to kMmaHeads query heads that share one KV head, with the
// online softmax between them, for one tile of tokens already in shared memory. The pipelined
// kernel (attention_kernel_pipelined.cuh) calls it for 16-bit queries with GQA ratio >= 4.
//
// Why: with the CUDA-core math every query head of the group costs its own FMAs per K and V
// element; at GQA 8 that is ~16 FLOP per cache byte (bf16), near the FP32 issue limit of an SM
// at HBM speed. On tensor cores the whole group costs two mma.sync per 16 dims and 8 tokens.
//
// The math, per tile of kTileTokens tokens (blocks of 8), heads on the MMA's N = 8 side:
//   QK:  S (heads x tokens) = Q (heads x dims) . K^T (dims x tokens): mma m16n8k16, A = the
//        queries (rows 0-7 the heads, rows 8-15 zero), B = the K rows of 8 tokens, 16 dims per
//        mma; fp32 accumulate. Lane (g, t) gets S[head g][tokens 2t, 2t+1] of each 8-token block.
//   softmax: running max per head (the 4 lanes of head g agree through two xor shuffles), the
//        probabilities exp(s - max) in fp32, a per-lane partial sum.
//   PV:  O^T (dims x heads) += V^T (dims x tokens) . P^T (tokens x heads): mma m16n8k8, A = V
//        (16 dims x 8 tokens), B = the probabilities rounded to the 16-bit type (what vLLM's
//        kernels do before P.V); lane (g, t)'s S values are exactly its B fragment, so P never
//        leaves the registers. The accumulator keeps (dim, head) pairs; the rescale of a head's
//        column when its max grows takes the factor from that head's lanes by shuffle.
// Scale, ALiBi, masking and fp8 scales are the caller's (the `logit` functor); the output is
// O^T unnormalised with this warp's (max, sum) per head, for the caller's merge.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 / mma.m16n8k8", 16-bit A and B,
// fp32 C / D), for lane l with g = l / 4 (groupID) and t = l % 4 (threadID_in_group), as
// (row, col) of the matrix; a 32-bit register holds two 16-bit elements, the first in its low
// half:
//   m16n8k16 A (16 x 16), 4 registers: (g, 2t..2t+1) (g+8, 2t..2t+1) (g, 2t+8..) (g+8, 2t+8..)
//   m16n8k16 B (16 x 8),  2 registers: (2t..2t+1, g) (2t+8..2t+9, g)
//   m16n8k8  A (16 x 8),  2 registers: (g, 2t..2t+1) (g+8, 2t..2t+1)
//   m16n8k8  B (8 x 8),   1 register:  (2t..2t+1, g)
//   C / D (16 x 8), 4 floats: (g, 2t) (g, 2t+1) (g+8, 2t) (g+8, 2t+1)
//
// Like warp_reduce.cuh the lane operations are an injected policy, so the SAME code runs on the
// GPU (CudaMmaOps in mma_ops.cuh: mma.sync, __shfl_sync) and on the host with
// simulated lanes and an MMA that follows the layouts above (tests/test_gqa_mma_host.py). An Ops
// policy provides, every lane of the warp calling together:
//   uint32_t pack(float lo, float hi)              two floats -> two 16-bit MMA elements (RN)
//   void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2])    c += a . b
//   void mma1688(float c[4], const uint32_t a[2], uint32_t b)              c += a . b
//   float shfl_xor(float v, int lane_mask), float shfl(float v, int src_lane)
//   float exp(float x)                             e^x for x <= 0 (the probabilities)
#pragma once

#include <cstdint>

#include "../core/compound_state.h"

namespace paged_attn {

constexpr int kMmaHeads = 8;  // query heads per pass on tensor cores (the MMA's N)

// kMaxDims: head-size capacity (a multiple of 16); kTileTokens: tokens per tile (a multiple of 8).
template <int kMaxDims, int kTileTokens, typename Ops>
struct GqaMmaWarp {
  static_assert(kMaxDims % 16 == 0 && kTileTokens % 8 == 0, "whole MMA tiles");
  static constexpr int kSteps = kMaxDims / 16;     // 16-dim slices: QK's K steps, PV's M tiles
  static constexpr int kBlocks = kTileTokens / 8;  // 8-token blocks per tile

  int g;                   // this lane's head (row of S, column of P^T)
  int t;                   // this lane's pair of tokens / heads within a block
  uint32_t q[kSteps][2];   // A of QK, the non-zero registers: head g, dims 16s+2t.., 16s+8+2t..
  float acc[kSteps][4];    // O^T: (dim 16s + g, heads 2t, 2t+1), (dim 16s + g + 8, same heads)
  float run_max;           // head g's running max (the same on its 4 lanes)
  float lane_sum;          // head g's sum of exp over this lane's tokens

  PA_HOST_DEVICE void init(int lane) {
    g = lane / 4;
    t = lane % 4;
    run_max = -INFINITY;
    lane_sum = 0.0f;
PA_UNROLL
    for (int s = 0; s < kSteps; ++s) {
      q[s][0] = q[s][1] = 0u;
PA_UNROLL
      for (int i = 0; i < 4; ++i) acc[s][i] = 0.0f;
    }
  }

  // query(head, dim) -> float: the query element, 0 for heads or dims that are not there.
  template <typename Query>
  PA_HOST_DEVICE void load_query(const Ops& ops, Query query) {
PA_UNROLL
    for (int s = 0; s < kSteps; ++s) {
      const int d = 16 * s + 2 * t;
      q[s][0] = ops.pack(query(g, d), query(g, d + 1));
      q[s][1] = ops.pack(query(g, d + 8), query(g, d + 9));
    }
  }

  // One tile. head_size <= kMaxDims, even. Functors (s even: slices s and s + 1, kSteps is even):
  //   k_frags(block, s, uint32_t kb[4]) -> the B fragments of K for slices s, s + 1 of 8-token
  //       block `block`: kb[2j + i] = the 16-bit pair K[8 block + g][d], K[8 block + g][d + 1]
  //       with d = 16 (s + j) + 2t + 8i; pairs at or past head_size (up to kMaxDims) must be
  //       zeros: a NaN there would reach the dot product, whatever the query holds
  //   v_frags(block, s, uint32_t va[4]) -> the A fragments of V^T for slices s, s + 1:
  //       va[2j + i] = the pair V[8 block + 2t][d], V[8 block + 2t + 1][d] with
  //       d = 16 (s + j) + g + 8i (dims at or past head_size may hold anything; they reach only
  //       accumulator rows that are never read)
  //   logit(head, token, dot) -> the logit of q[head] . k[token] = dot (fp32), or -inf where the
  //                         head does not attend the token (head is always this lane's g)
  // Tokens with a -inf logit for every head must still read as finite V (0 in shared memory):
  // 0 * NaN would reach the accumulator. The kernel loads the fragments with ldmatrix (16-bit
  // caches) or builds them from element pairs (fragments_from_pairs below).
  // kQkChains: QK's chains of dependent MMAs per block, 2 (even and odd slices apart, then
  // added: for fragments that arrive fast, by ldmatrix) or 1 (for fragments decoded pair by
  // pair, whose decode hides the MMA latency: four accumulator registers fewer per block).
  template <int kQkChains = 2, typename KFrags, typename VFrags, typename Logit>
  PA_HOST_DEVICE void tile(const Ops& ops, int head_size, KFrags k_frags, VFrags v_frags,
                           Logit logit) {
    static_assert(kQkChains == 1 || kQkChains == 2, "one or two QK chains");
    // ---- QK: S[g][8b + 2t + i] = logit[b][i] ----
    float logits[kBlocks][2];
PA_UNROLL
    for (int b = 0; b < kBlocks; ++b) {
      float c_even[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float c_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
PA_UNROLL
      for (int s = 0; s < kSteps; s += 2) {
        if (16 * s >= head_size) break;  // the same on every lane
        uint32_t kb[4];
        k_frags(b, s, kb);
        const uint32_t qa0[4] = {q[s][0], 0u, q[s][1], 0u};
        ops.mma16816(c_even, qa0, kb);
        if (16 * (s + 1) < head_size) {
          const uint32_t qa1[4] = {q[s + 1][0], 0u, q[s + 1][1], 0u};
          ops.mma16816(kQkChains == 2 ? c_odd : c_even, qa1, kb + 2);
        }
      }
      const float dot0 = kQkChains == 2 ? c_even[0] + c_odd[0] : c_even[0];
      const float dot1 = kQkChains == 2 ? c_even[1] + c_odd[1] : c_even[1];
      logits[b][0] = logit(g, 8 * b + 2 * t, dot0);
      logits[b][1] = logit(g, 8 * b + 2 * t + 1, dot1);
    }

    // ---- online softmax of head g ----
    float tile_max = -INFINITY;
PA_UNROLL
    for (int b = 0; b < kBlocks; ++b) tile_max = fmaxf(tile_max, fmaxf(logits[b][0], logits[b][1]));
    tile_max = fmaxf(tile_max, ops.shfl_xor(tile_max, 1));
    tile_max = fmaxf(tile_max, ops.shfl_xor(tile_max, 2));
    MergeFactors f;
    const SoftmaxStats merged =
        merge_stats(SoftmaxStats{run_max, 0.0f}, SoftmaxStats{tile_max, 0.0f}, f);
    run_max = merged.max;
    float probs[kBlocks][2];
    float tile_sum = 0.0f;
PA_UNROLL
    for (int b = 0; b < kBlocks; ++b) {
PA_UNROLL
      for (int i = 0; i < 2; ++i) {
        probs[b][i] = run_max == -INFINITY ? 0.0f : ops.exp(logits[b][i] - run_max);
        tile_sum += probs[b][i];
      }
    }
    lane_sum = lane_sum * f.scale_a + tile_sum;
    // the accumulator's columns are heads 2t and 2t + 1: their factors from lanes 8t and 8t + 4
    const float scale_lo = ops.shfl(f.scale_a, 8 * t);
    const float scale_hi = ops.shfl(f.scale_a, 8 * t + 4);
    // NOTE: no branch around the rescale when no max grew: with one, ptxas recomputed the
    // kernel's loop invariants in every tile, more instructions than the 32 multiplies it skips
PA_UNROLL
    for (int s = 0; s < kSteps; ++s) {
      acc[s][0] *= scale_lo;
      acc[s][1] *= scale_hi;
      acc[s][2] *= scale_lo;
      acc[s][3] *= scale_hi;
    }

    // ---- PV: O^T[16s + g (+8)][2t, 2t+1] += V^T . P^T ----
PA_UNROLL
    for (int b = 0; b < kBlocks; ++b) {
      const uint32_t pb = ops.pack(probs[b][0], probs[b][1]);  // B: tokens 2t, 2t+1 of head g
PA_UNROLL
      for (int s = 0; s < kSteps; s += 2) {
        if (16 * s >= head_size) break;  // the same on every lane
        uint32_t va[4];
        v_frags(b, s, va);
        ops.mma1688(acc[s], va, pb);
        if (16 * (s + 1) < head_size) ops.mma1688(acc[s + 1], va + 2, pb);
      }
    }
  }

  // This warp's (max, sum) of head g, the same on its 4 lanes.
  PA_HOST_DEVICE SoftmaxStats head_stats(const Ops& ops) const {
    float sum = lane_sum + ops.shfl_xor(lane_sum, 1);
    sum += ops.shfl_xor(sum, 2);
    return SoftmaxStats{run_max, sum};
  }

  // The accumulator element i of slice s holds output (dim, head) = (out_dim(s, i), out_head(i)).
  PA_HOST_DEVICE int out_dim(int s, int i) const { return 16 * s + g + 8 * (i / 2); }
  PA_HOST_DEVICE int out_head(int i) const { return 2 * t + i % 2; }
};

// tile's fragment functors built from element-pair reads, each lane reading its own pairs (the
// pipelined kernel's fp8 caches, the host test):
//   k_pair(token, dim) -> the pair K[token][dim], K[token][dim + 1]
//   v_pair(dim, token) -> the pair V[token][dim], V[token + 1][dim]
// for this lane's (g, t) = (lane / 4, lane % 4); every dim < kMaxDims is read.
template <typename KPair, typename VPair>
struct FragmentsFromPairs {
  int g, t;
  KPair k_pair;
  VPair v_pair;
  PA_HOST_DEVICE void k_frags(int block, int s, uint32_t kb[4]) const {
PA_UNROLL
    for (int r = 0; r < 4; ++r) kb[r] = k_pair(8 * block + g, 16 * (s + r / 2) + 8 * (r % 2) + 2 * t);
  }
  PA_HOST_DEVICE void v_frags(int block, int s, uint32_t va[4]) const {
PA_UNROLL
    for (int r = 0; r < 4; ++r) va[r] = v_pair(16 * (s + r / 2) + 8 * (r % 2) + g, 8 * block + 2 * t);
  }
};

}  // namespace paged_attn
