// attention_kernel.cuh — the paged attention kernel: one pass over the whole row writing `out`
// (p.partition_size == 0: v1, decode) or phase 1 of a split (one partition of p.partition_size
// tokens per thread block writing the scratch: v2 with 512, v1 / decode split by
// core/split_plan.h); decode reads token-major caches (p.kv_form, core/kv_layout.h: the same
// code, K and V addressed through their layouts).
// Raw pointers + PagedAttentionParams only.
//
// Algorithm. One thread block serves one (sequence, KV head, partition) and ALL the query heads
// that read that KV head (in passes of kHeadTile heads; one pass when the GQA ratio <= 8), so K
// and V are read from memory once per KV head.
//   1. The pass's query rows, times `scale`, go to shared memory as fp32.
//   2. The block's kNumWarps warps walk the token range in tiles of kWarpSize tokens (tile i goes
//      to warp i % kNumWarps). QK: lane l owns token t = tile + l, reads that token's key with
//      16-byte loads along head_size (vLLM's K [.., head_size/x, block_size, x]: one x-chunk
//      per load; token-major: the token's contiguous row) and computes one logit per query head
//      against the shared-memory queries.
//   3. Each warp keeps an online softmax per head: a warp-uniform running max (butterfly max of
//      the tile), a per-lane running exp sum, and the UNnormalised output, lane l owning dims
//      l + kWarpSize * j. P.V: the tile's probabilities go through shared memory; each lane reads
//      its dims' V rows (vLLM's V [.., head_size, block_size]) kVVec tokens at a time with one
//      vector load (token-major V, or a block size not a multiple of kVVec: one element per
//      token and dim, consecutive lanes reading consecutive dims) and multiplies them in.
//   4. End of range: each warp merges its lanes' (max, sum) with a butterfly (warp_reduce.cuh),
//      then the warps' compound states (max, sum, output) are merged through shared memory in warp
//      order 0, 1, ... (compound_state.h). One pass writes out = output / sum; a split writes
//      the partition's max_logits, exp_sums and tmp_out = output / sum (reduce_kernel.cuh
//      combines).
//
// NOTE (robustness, docs/DESIGN.md): the block table and lengths are never trusted.
//   - A row whose seq_len is < 0, > max_blocks_per_seq * block_size, or (split) needs more than
//     max_num_partitions partitions reads nothing: one pass writes NaN to its out rows, a split
//     writes nothing and the reduce kernel writes NaN.
//   - A used block id outside [0, num_blocks) is never dereferenced; the block's outputs become
//     NaN (split: max_logits / exp_sums NaN, which the reduce kernel turns into a NaN row).
//   - Tokens >= the range end are never read for K, and their V values are ZEROED before the
//     multiply (0 * NaN = NaN: a probability of 0 is not enough when unused slots hold NaN).
//   - Block offsets are int64 (block_id * k_layout.block_stride overflows int32 on large pools).
//   - max_seq_len is not used: the range comes from seq_lens alone.
//
// Blocksparse (docs/CONTRACT.md, core/blocksparse.h): per token, a bit mask of the pass's heads
// that attend its cache block. A head whose bit is clear gets a -inf logit (probability 0); a
// block no head of the pass attends is never read, K nor V (it may hold NaN). A head with nothing
// attended in the range ends with the empty state (max -inf, sum 0, output 0): one pass writes
// 0, a split writes max_logits -inf, exp_sums 0, tmp_out 0 (weight 0 in the reduce).
#pragma once

#include <cstdint>

#include "../core/compound_state.h"
#include "../core/params.h"
#include "cache_access.cuh"
#include "fast_math.cuh"
#include "grid_dependency.cuh"
#include "row_check.cuh"
#include "kernel_families.h"
#include "warp_reduce.cuh"

namespace paged_attn {
namespace cuda {

__device__ __forceinline__ float quiet_nan() { return __int_as_float(0x7fc00000); }

// The tokens [tok_begin, tok_end) that the thread block of (seq, kv_head, part) serves, for both
// attention kernels (the robustness NOTE at the top). false: it serves none, because the row is
// bad (row_check.cuh: a one-pass block has then written NaN to its KV head's out rows) or because a split's partition lies past the row (nothing to write). Uniform across the
// block.
template <typename Scalar, int kThreads>
__device__ __forceinline__ bool block_token_range(const PagedAttentionParams& p, int seq,
                                                  int kv_head, int part, int seq_len,
                                                  int& tok_begin, int& tok_end) {
  static_assert(2 * kThreads <= INT32_MAX - kMaxRowTokens, "token positions stay int32");
  const int partition_size = p.partition_size;
  const bool is_split = partition_size > 0;
  bool row_ok = row_fits(p, seq_len);
  if (is_split) row_ok = row_ok && partitions_needed(seq_len, partition_size) <= p.max_num_partitions;
  if (!row_ok) {
    if (!is_split) {  // one pass: this KV head's query heads are consecutive rows of out
      const int group = p.num_heads / p.num_kv_heads;
      Scalar* rows = static_cast<Scalar*>(p.out) +
                     (static_cast<int64_t>(seq) * p.num_heads + kv_head * group) * p.head_size;
      for (int i = threadIdx.x; i < group * p.head_size; i += kThreads)
        rows[i] = from_float<Scalar>(quiet_nan());
    }
    return false;
  }
  // NOTE: int64: part * partition_size + partition_size may pass INT_MAX on a row near it.
  const int64_t part_begin = is_split ? static_cast<int64_t>(part) * partition_size : 0;
  if (is_split && part_begin >= seq_len) return false;
  tok_begin = static_cast<int>(part_begin);
  tok_end = is_split
                ? static_cast<int>(min(static_cast<int64_t>(seq_len), part_begin + partition_size))
                : seq_len;
  return true;
}

// Shared memory of one thread block (static; <= 44.3 KB at head size 256, kHeadTile 8).
template <int kMaxDims, int kHeadTile, int kWarpSize, int kNumWarps>
struct AttentionSmem {
  float q[kHeadTile][kMaxDims];                  // the pass's query rows * scale, zero-padded
  float probs[kNumWarps][kHeadTile][kWarpSize];  // per warp: one tile's probabilities
  float out[kNumWarps][kHeadTile][kMaxDims];     // per warp: unnormalised output at the end
  SoftmaxStats stats[kNumWarps][kHeadTile];      // per warp: (max, exp sum) at the end
  int64_t sparse_offset[kHeadTile];              // blocksparse: blocksparse_offset of each slot
  float slope[kHeadTile];                        // ALiBi slope of each slot (0: none)
};

// Writes dim d of query head `head0 + g`'s result for the block of (seq, part): `total` is the
// merge of the block's warps; one pass writes out = output / sum * v_scale, a split writes the
// partition's tmp_out row (and, from d == 0, its max_logits / exp_sums). any_bad: NaN everywhere.
template <typename Scalar>
__device__ __forceinline__ void write_head_result(const PagedAttentionParams& p, int seq,
                                                  int head, int part, int d,
                                                  const CompoundState<1>& total, bool any_bad,
                                                  float v_scale) {
  const int64_t row = static_cast<int64_t>(seq) * p.num_heads + head;
  const float value = any_bad ? quiet_nan() : total.out[0] * inv_sum(total.stats) * v_scale;
  if (p.partition_size == 0) {
    static_cast<Scalar*>(p.out)[row * p.head_size + d] = from_float<Scalar>(value);
  } else {
    const int64_t prow = row * p.max_num_partitions + part;
    static_cast<Scalar*>(p.tmp_out)[prow * p.head_size + d] = from_float<Scalar>(value);
    if (d == 0) {
      p.max_logits[prow] = any_bad ? quiet_nan() : total.stats.max;
      p.exp_sums[prow] = any_bad ? quiet_nan() : total.stats.sum;
    }
  }
}

// acc + a.x * b[0] + a.y * b[1] + a.z * b[2] + a.w * b[3] as four chained FMAs (the sum written
// out compiles to a multiply, three FMAs and an add).
__device__ __forceinline__ float fma4(float4 a, const float* b, float acc) {
  acc = fmaf(a.x, b[0], acc);
  acc = fmaf(a.y, b[1], acc);
  acc = fmaf(a.z, b[2], acc);
  return fmaf(a.w, b[3], acc);
}

// Bit g set: tile slot g (< num_tile_heads) attends cache block `block` (index in the row's block
// table) of a row of seq_len tokens; every bit when the call is dense.
template <int kHeadTile>
__device__ __forceinline__ uint32_t attending_heads(const PagedAttentionParams& p,
                                                   const int64_t* sparse_offset,
                                                   int num_tile_heads, int seq_len,
                                                   int64_t block) {
  if (!blocksparse_active(p.blocksparse)) return ~0u;
  // the block's place in the pattern: two 64-bit divisions, once for every head
  const BlocksparseBlock where = blocksparse_block(p.blocksparse, seq_len, p.block_size, block);
  uint32_t mask = 0;
#pragma unroll 1  // NOTE: one copy: unrolled it costs the large tiles registers (spills)
  for (int g = 0; g < num_tile_heads; ++g)
    if (blocksparse_attends(p.blocksparse, sparse_offset[g], where)) mask |= 1u << g;
  return mask;
}

// Grid: (num_seqs, num_kv_heads, num_partitions)  [one pass: num_partitions = 1]
// Block: kNumWarps * kWarpSize threads.
// p.partition_size > 0: a split (block z handles tokens [z * size, (z + 1) * size) and writes
//                       the scratch; v2: 512), 0: one pass (the block handles the whole row and
//                       writes `out`).
// Scalar: query / out / tmp_out type. kCache: "auto" (cache elements are Scalar) or an fp8
// format (cache elements are uint8_t bytes). kDimsPerLane = ceil(head_size / kWarpSize) (head_size itself is runtime).
// kHeadTile: query heads per pass (>= the GQA ratio when it is <= 8).
// Resident blocks per SM promised to ptxas (__launch_bounds__ min blocks), which caps registers at
// 65536 / (128 * n): 3 (168 registers, 12 warps per SM) for the small tiles, else 1 (255: the
// large tiles' accumulators need nearly all of them). NOTE: with no promise ptxas aims too low
// for the small tiles, and a promise of 4 (128 registers) is too few for tiles with 8 heads or 8
// dims per lane: both spill. build/cuda_resource_report.txt shows registers and spills per kernel.
template <int kDimsPerLane, int kHeadTile>
constexpr int attention_min_blocks() {
  return (kDimsPerLane <= 4 && kDimsPerLane * kHeadTile <= 16) ? 3 : 1;
}

// The kernel's body (paged_attention_kernel below is the kernel).
template <typename Scalar, CacheKind kCache, int kDimsPerLane, int kHeadTile, int kWarpSize,
          int kNumWarps>
__device__ __forceinline__ void baseline_attention(const PagedAttentionParams& p) {
  using CacheT = typename CacheElement<Scalar, kCache>::type;
  constexpr int kThreads = kNumWarps * kWarpSize;
  constexpr int kMaxDims = kDimsPerLane * kWarpSize;
  constexpr bool kFp8 = kCache != CacheKind::kAuto;
  // NOTE: the fp8 format is a template parameter: a runtime e4m3/e5m2 branch in the decode needs
  // registers the small tiles do not have (ptxas spills).
  constexpr bool e5m2 = kCache == CacheKind::kFp8E5M2;
  constexpr int kX = 16 / static_cast<int>(sizeof(CacheT));          // K elements per 16 B
  constexpr int kVVec = sizeof(CacheT) == 4 ? 4 : 8;                  // V tokens per load
  constexpr int kVBytes = kVVec * static_cast<int>(sizeof(CacheT));  // 16 or 8 bytes
  static_assert(kX % 4 == 0 && kVVec % 4 == 0 && kWarpSize % kVVec == 0, "vector widths");
  static_assert(kThreads >= kHeadTile, "a thread per head slot writes smem.slope");

  __shared__ __align__(16) AttentionSmem<kMaxDims, kHeadTile, kWarpSize, kNumWarps> smem;
  allow_dependent_launch();  // PDL: the split's reduce may be launched (grid_dependency.cuh)

  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int part = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int head_size = p.head_size;
  const int block_size = p.block_size;
  const int group = p.num_heads / p.num_kv_heads;  // query heads per KV head
  const int seq_len = p.seq_lens[seq];

  // ---- row validity (data-dependent; see NOTE at the top) ----
  int tok_begin = 0, tok_end = 0;
  if (!block_token_range<Scalar, kThreads>(p, seq, kv_head, part, seq_len, tok_begin, tok_end))
    return;  // uniform across the block: no barrier has been reached

  const int32_t* table_row = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const CacheT* k_head = static_cast<const CacheT*>(p.key_cache) +
                         static_cast<int64_t>(kv_head) * p.k_layout.head_stride;
  const CacheT* v_head = static_cast<const CacheT*>(p.value_cache) +
                         static_cast<int64_t>(kv_head) * p.v_layout.head_stride;
  const Scalar* q_row = static_cast<const Scalar*>(p.query) + static_cast<int64_t>(seq) * p.q_seq_stride;
  float k_scale = 1.0f, v_scale = 1.0f;  // "auto" caches ignore the scales (docs/DESIGN.md)
  if (kFp8) {
    k_scale = p.k_scale_ptr != nullptr ? *p.k_scale_ptr : p.k_scale;
    v_scale = p.v_scale_ptr != nullptr ? *p.v_scale_ptr : p.v_scale;
  }
  // Cache addressing (core/kv_layout.h). K: token t of a block starts at t * token_stride; its
  // i-th 16-byte vector (kX dims) lies i * k_vec_stride further: the next x-chunk in vLLM's K,
  // the next kX dims of the token's contiguous row in a token-major cache. V: dim d of a token
  // lies d * v_dim_stride from its start (vLLM's V: block_size; token-major: 1).
  const bool token_major = p.kv_form == KvForm::kTokenMajor;
  const int64_t k_vec_stride = token_major ? kX : p.k_layout.chunk_stride;
  const int64_t v_dim_stride = token_major ? 1 : p.v_layout.chunk_stride;
  // vLLM's V holds kVVec consecutive tokens of a dim in one vector when block_size % kVVec == 0
  // (8, 16, 32, ...); other block sizes and token-major caches take the per-token path.
  const bool v_vectorized = !token_major && block_size % kVVec == 0;
  const int num_k_vecs = head_size / kX;
  const CudaShuffleXor<kWarpSize> shuffle;
  bool bad_block = false;  // a used block id outside [0, num_blocks) was met

  for (int head_first = 0; head_first < group; head_first += kHeadTile) {
    const int num_tile_heads = min(kHeadTile, group - head_first);
    const int head0 = kv_head * group + head_first;  // query head of tile slot 0

    // ---- 1. query rows -> shared memory (slots >= num_tile_heads and dims >= head_size: 0) ----
    for (int i = threadIdx.x; i < kHeadTile * kMaxDims; i += kThreads) {
      const int g = i / kMaxDims;
      const int d = i % kMaxDims;
      float q = 0.0f;
      if (g < num_tile_heads && d < head_size)
        q = to_float(q_row[static_cast<int64_t>(head0 + g) * p.q_head_stride + d]) * p.scale;
      smem.q[g][d] = q;
    }
    if (blocksparse_active(p.blocksparse) && threadIdx.x < num_tile_heads)
      smem.sparse_offset[threadIdx.x] =
          blocksparse_offset(p.blocksparse, p.num_heads, p.num_kv_heads, head0 + threadIdx.x);
    // NOTE: the slopes in shared memory, not registers: 8 registers fewer over the token loop
    // (with them in registers, float with 6 dims per lane and 8 heads spills on sm_100)
    if (threadIdx.x < kHeadTile)
      smem.slope[threadIdx.x] = (p.alibi_slopes != nullptr && threadIdx.x < num_tile_heads)
                                    ? p.alibi_slopes[head0 + threadIdx.x]
                                    : 0.0f;
    __syncthreads();

    // ---- per-warp online softmax state ----
    float run_max[kHeadTile];                // warp-uniform
    float lane_sum[kHeadTile];               // this lane's share of the exp sum
    float acc[kHeadTile][kDimsPerLane];      // output dims lane + kWarpSize * j
#pragma unroll
    for (int g = 0; g < kHeadTile; ++g) {
      run_max[g] = -INFINITY;
      lane_sum[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) acc[g][j] = 0.0f;
    }

    for (int tile = tok_begin + warp * kWarpSize; tile < tok_end; tile += kNumWarps * kWarpSize) {
      // ---- 2. QK: lane owns token t ----
      const int t = tile + lane;
      float logit[kHeadTile];
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) logit[g] = -INFINITY;
      uint32_t heads_mask = 0;  // the heads attending token t's block (0: t not read)
      if (t < tok_end) {
        const int64_t block_id = table_row[t / block_size];
        if (block_id < 0 || block_id >= p.num_blocks) {
          bad_block = true;
        } else {
          heads_mask = attending_heads<kHeadTile>(p, smem.sparse_offset, num_tile_heads, seq_len,
                                                  t / block_size);
        }
        if (heads_mask != 0) {
          const CacheT* k_tok = k_head + block_id * p.k_layout.block_stride +
                                static_cast<int64_t>(t % block_size) * p.k_layout.token_stride;
          float dot[kHeadTile];
#pragma unroll
          for (int g = 0; g < kHeadTile; ++g) dot[g] = 0.0f;
#pragma unroll 2
          for (int i = 0; i < num_k_vecs; ++i) {
            float k[kX];
            load_to_float<CacheT, 16>(k_tok + i * k_vec_stride, e5m2, k);
#pragma unroll
            for (int g = 0; g < kHeadTile; ++g) {
              const float4* q4 = reinterpret_cast<const float4*>(&smem.q[g][i * kX]);
#pragma unroll
              for (int c = 0; c < kX / 4; ++c) {
                const float4 qv = q4[c];  // same address in all lanes: a broadcast
                dot[g] = fma4(qv, &k[4 * c], dot[g]);
              }
            }
          }
          const float alibi_pos = static_cast<float>(t - seq_len + 1);  // 0 at the last token
#pragma unroll
          for (int g = 0; g < kHeadTile; ++g)
            logit[g] = (heads_mask >> g) & 1u ? dot[g] * k_scale + smem.slope[g] * alibi_pos
                                               : -INFINITY;
        }
      }

      // ---- 3. online softmax update ----
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) {
        const float tile_max = butterfly_allreduce<kWarpSize>(logit[g], MaxOp{}, shuffle);
        MergeFactors f;
        const SoftmaxStats merged =
            merge_stats(SoftmaxStats{run_max[g], 0.0f}, SoftmaxStats{tile_max, 0.0f}, f);
        const float prob = merged.max == -INFINITY ? 0.0f : fast_exp(logit[g] - merged.max);
        lane_sum[g] = lane_sum[g] * f.scale_a + prob;
#pragma unroll
        for (int j = 0; j < kDimsPerLane; ++j) acc[g][j] *= f.scale_a;
        run_max[g] = merged.max;
        smem.probs[warp][g][lane] = prob;
      }
      __syncwarp();

      // ---- P.V: lane owns dims lane + kWarpSize * j; kVVec tokens per step ----
#pragma unroll 1  // NOTE: not unrolled: unrolling multiplies compile time, saves no registers
      for (int s0 = 0; s0 < kWarpSize; s0 += kVVec) {
        const int t0 = tile + s0;
        if (t0 >= tok_end) break;  // warp-uniform
        float v[kDimsPerLane][kVVec];
        if (v_vectorized) {
          const int64_t block_id = table_row[t0 / block_size];  // same block for all kVVec
          if (block_id < 0 || block_id >= p.num_blocks) {
            bad_block = true;
            continue;  // warp-uniform; never dereference a bad id
          }
          // lane s0 holds token t0's mask; 0: no head of the pass attends the block, every
          // probability is 0 and V is not read
          if (__shfl_sync(0xffffffffu, heads_mask, s0) == 0) continue;  // warp-uniform
          const CacheT* v_base =
              v_head + block_id * p.v_layout.block_stride + static_cast<int64_t>(t0 % block_size);
#pragma unroll
          for (int j = 0; j < kDimsPerLane; ++j) {
            const int d = lane + j * kWarpSize;
            if (d < head_size) {
              load_to_float<CacheT, kVBytes>(v_base + static_cast<int64_t>(d) * block_size,
                                             e5m2, v[j]);
            } else {
#pragma unroll
              for (int e = 0; e < kVVec; ++e) v[j][e] = 0.0f;
            }
          }
        } else {
#pragma unroll
          for (int e = 0; e < kVVec; ++e) {
            const int te = t0 + e;
            int64_t block_id = -1;
            // lane s0 + e holds token te's mask (0 past the range, for a bad id, and for a block
            // no head of the pass attends: then V is not read)
            const uint32_t te_mask = __shfl_sync(0xffffffffu, heads_mask, s0 + e);
            if (te < tok_end) {
              block_id = table_row[te / block_size];
              if (block_id < 0 || block_id >= p.num_blocks) {
                bad_block = true;
                block_id = -1;
              } else if (te_mask == 0) {
                block_id = -1;
              }
            }
            const CacheT* v_tok = v_head +
                                  (block_id < 0 ? 0 : block_id) * p.v_layout.block_stride +
                                  static_cast<int64_t>(te % block_size) * p.v_layout.token_stride;
#pragma unroll
            for (int j = 0; j < kDimsPerLane; ++j) {
              const int d = lane + j * kWarpSize;
              v[j][e] = (block_id >= 0 && d < head_size)
                            ? load_one(v_tok + d * v_dim_stride, e5m2)
                            : 0.0f;
            }
          }
        }
        // NOTE: zero the V values of tokens past the range (their slots may hold NaN).
#pragma unroll
        for (int e = 0; e < kVVec; ++e) {
          if (t0 + e >= tok_end) {
#pragma unroll
            for (int j = 0; j < kDimsPerLane; ++j) v[j][e] = 0.0f;
          }
        }
#pragma unroll
        for (int g = 0; g < kHeadTile; ++g) {
          const float4* p4 = reinterpret_cast<const float4*>(&smem.probs[warp][g][s0]);
#pragma unroll
          for (int c = 0; c < kVVec / 4; ++c) {
            const float4 pr = p4[c];
#pragma unroll
            for (int j = 0; j < kDimsPerLane; ++j)
              acc[g][j] = fma4(pr, &v[j][4 * c], acc[g][j]);
          }
        }
      }
      __syncwarp();  // NOTE: the next tile overwrites probs only after every lane has read them
    }

    // ---- 4a. warp: merge the lanes' (max, sum); publish the warp's compound state ----
#pragma unroll
    for (int g = 0; g < kHeadTile; ++g) {
      const SoftmaxStats st = butterfly_allreduce<kWarpSize>(SoftmaxStats{run_max[g], lane_sum[g]},
                                                             StatsMergeOp{}, shuffle);
      if (lane == 0) smem.stats[warp][g] = st;  // valid in all lanes; lane 0's is the one kept
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) smem.out[warp][g][lane + j * kWarpSize] = acc[g][j];
    }
    const bool any_bad = __syncthreads_or(bad_block);

    // ---- 4b. block: merge the warps' states in warp order, normalise, write ----
    for (int i = threadIdx.x; i < num_tile_heads * head_size; i += kThreads) {
      const int g = i / head_size;
      const int d = i % head_size;
      CompoundState<1> total;
      total.init();
#pragma unroll
      for (int w = 0; w < kNumWarps; ++w) {
        CompoundState<1> warp_state;
        warp_state.stats = smem.stats[w][g];
        warp_state.out[0] = smem.out[w][g][d];
        total.merge(warp_state);
      }
      write_head_result<Scalar>(p, seq, head0 + g, part, d, total, any_bad, v_scale);
    }
    __syncthreads();  // NOTE: the next pass rewrites smem.q / out / stats
  }
}

// The baseline kernel, where this arch's device code holds it (kernel_families.h); elsewhere a
// trap that the kernel choice never launches.
template <typename Scalar, CacheKind kCache, int kDimsPerLane, int kHeadTile, int kWarpSize,
          int kNumWarps>
__global__ void __launch_bounds__(kNumWarps* kWarpSize,
                                  attention_min_blocks<kDimsPerLane, kHeadTile>())
    paged_attention_kernel(const PagedAttentionParams p) {
  if constexpr (PAGED_ATTN_DEVICE_CODE_HAS_BASELINE) {
    baseline_attention<Scalar, kCache, kDimsPerLane, kHeadTile, kWarpSize, kNumWarps>(p);
  } else {
    __trap();
  }
}

}  // namespace cuda
}  // namespace paged_attn
