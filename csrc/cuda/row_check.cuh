// row_check.cuh — which rows the CUDA kernels serve: the one rule the attention kernels (phase 1,
// one pass) and the reduce kernel (phase 2) must agree on, since phase 2 turns the rows phase 1
// did not serve into NaN (docs/CUDA.md "Robustness").
#pragma once

#include <cstdint>

#include "../core/params.h"

namespace paged_attn {
namespace cuda {

// Token positions are int32 and the attention kernels' loops step up to two blocks of threads
// (<= 2 x 1024) past a row's end before they stop: rows up to this length keep every position
// they form below INT32_MAX. A longer row is only possible with a block table of 2^27+ entries
// repeating blocks.
constexpr int kMaxRowTokens = INT32_MAX - 2048;

// Whether a row of seq_len tokens fits the kernels: 0 <= seq_len <= kMaxRowTokens and within the
// block table's capacity (max_blocks_per_seq * block_size). A split (p.partition_size > 0) also
// needs partitions_needed(seq_len, p.partition_size) <= p.max_num_partitions. A row that fails
// is bad: nothing of it is read and its out rows become NaN.
__device__ __forceinline__ bool row_fits(const PagedAttentionParams& p, int seq_len) {
  const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  return seq_len >= 0 && seq_len <= kMaxRowTokens && static_cast<int64_t>(seq_len) <= capacity;
}
// Partitions of partition_size (> 0) tokens a row of seq_len (>= 0) tokens needs.
__device__ __forceinline__ int64_t partitions_needed(int seq_len, int partition_size) {
  return (static_cast<int64_t>(seq_len) + partition_size - 1) / partition_size;
}

}  // namespace cuda
}  // namespace paged_attn
