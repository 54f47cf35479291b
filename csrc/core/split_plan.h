// split_plan.h — how many partitions the CUDA v1 / decode ops cut each row's KV range into, and
// how long each is (docs/CUDA.md "Splitting the KV range"). Framework-free host code (no CUDA,
// no torch): tests/test_split_plan.py compiles it with the host compiler.
//
// The attention kernel runs one thread block per (sequence, KV head, partition). Without a split
// a call has num_seqs * num_kv_heads blocks, each walking a whole row: with GQA / tensor
// parallelism, small batches or a single long row that is far fewer blocks than the GPU holds
// (8 blocks for one row of 8 KV heads on 132 SMs). The plan splits each row into partitions
// (phase 1 writes each partition's (max, exp sum, output), the reduce kernel merges them, as v2)
// until the grid has about blocks_per_sm (default kSplitBlocksPerSm) blocks per SM.
//
// NOTE: decided from SHAPES only (the block table's width, never seq_lens): no host sync, and a
// CUDA graph captured once stays valid when the lengths change. Every row that fits the block
// table fits the plan's partitions; the price is that the size follows the table's capacity, so
// rows much shorter than the table fill only their first partitions.
#pragma once

#include <algorithm>
#include <cstdint>

namespace paged_attn {

// Aim: at least this many thread blocks per SM. The kernel keeps 1-3 blocks resident per SM
// (registers, build/cuda_resource_report.txt), so 8 is 2.7-8 waves: the last wave's idle SMs are
// a small share of the call, and a latency-bound kernel gets every resident slot filled. The
// default of SplitShape::blocks_per_sm; PAGED_ATTN_CUDA_SPLIT sets another (kernel_choice.h).
constexpr int kSplitBlocksPerSm = 8;
// A partition spans at least this many tiles (a tile: one token per thread of the block), so
// each warp walks at least this many 32-token tiles between its prologue (queries to shared
// memory) and its epilogue (the block merge and the scratch writes). The default of
// SplitShape::min_partition_tiles (PAGED_ATTN_CUDA_SPLIT may set another).
constexpr int kMinPartitionTiles = 2;
// CUDA grid dimension z (the partitions).
constexpr int kMaxSplitPartitions = 65535;

// What the plan is decided from.
struct SplitShape {
  int64_t num_seqs;
  int64_t num_kv_heads;
  int64_t row_capacity;  // max_blocks_per_seq * block_size: the longest row the table holds
  int64_t sm_count;      // the device's multiprocessors
  int64_t tile_tokens;   // tokens one step of the block's warps covers (kNumWarps * kWarpSize)
  int64_t blocks_per_sm = kSplitBlocksPerSm;     // the aim; 0: never split
  int64_t min_partition_tiles = kMinPartitionTiles;  // >= 1
};

// num_partitions == 1: one pass per row (partition_size 0, no scratch). Else partition z of a
// row holds tokens [z * partition_size, (z + 1) * partition_size), with
//   partition_size % tile_tokens == 0, partition_size >= min_partition_tiles * tile_tokens,
//   (num_partitions - 1) * partition_size < row_capacity <= num_partitions * partition_size
// (every row the table holds fits, and a full row leaves no partition empty), and
//   2 <= num_partitions <= kMaxSplitPartitions.
struct SplitPlan {
  int num_partitions;
  int partition_size;
  bool split() const { return num_partitions > 1; }
};

namespace split_detail {
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0
}  // namespace split_detail

// The rule (docs/CUDA.md): rows = num_seqs * num_kv_heads, target = blocks_per_sm * SMs.
//   - rows >= target: the rows fill the GPU, one pass (no scratch, no reduce).
//   - a table of at most min_partition_tiles tiles: one pass (nothing to cut).
//   - else wanted = ceil(target / rows) partitions per row; the size is capacity / wanted rounded
//     DOWN to a whole tile (so rows * count >= target), at least min_partition_tiles tiles; the
//     count is ceil(capacity / size), so every row the table holds fits and a full row leaves no
//     partition empty. Rounding down at most doubles the count (size > capacity / (2 wanted)),
//     which is why wanted is capped at half the grid limit.
inline SplitPlan plan_split(const SplitShape& s) {
  using split_detail::ceil_div;
  constexpr SplitPlan kOnePass{1, 0};
  const int64_t rows = s.num_seqs * s.num_kv_heads;
  const int64_t target =
      std::max<int64_t>(s.sm_count, 1) * std::max<int64_t>(s.blocks_per_sm, 0);
  if (rows <= 0 || rows >= target || s.tile_tokens <= 0) return kOnePass;
  // NOTE: seq_lens are int32: tokens past INT32_MAX are never used, and the size stays an int.
  const int64_t capacity = std::min<int64_t>(s.row_capacity, INT32_MAX);
  const int64_t min_size = s.tile_tokens * std::max<int64_t>(s.min_partition_tiles, 1);
  if (capacity <= min_size) return kOnePass;
  const int64_t wanted = std::min<int64_t>(ceil_div(target, rows), kMaxSplitPartitions / 2);
  const int64_t size = std::max(capacity / wanted / s.tile_tokens * s.tile_tokens, min_size);
  const int64_t count = ceil_div(capacity, size);  // >= 2: capacity > min_size, size < capacity
  return SplitPlan{static_cast<int>(count), static_cast<int>(size)};
}

}  // namespace paged_attn
