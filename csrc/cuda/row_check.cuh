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

// false: the row is bad (seq_len < 0, past the block table's capacity, longer than
// kMaxRowTokens, or, for a split (p.partition_size > 0), needing more partitions than the
// scratch holds): nothing of it is read and its out rows become NaN.
__device__ __forceinline__ bool row_is_served(const PagedAttentionParams& p, int seq_len) {
  const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  if (seq_len < 0 || seq_len > kMaxRowTokens || seq_len > capacity) return false;
  if (p.partition_size <= 0) return true;
  const int64_t needed = (static_cast<int64_t>(seq_len) + p.partition_size - 1) / p.partition_size;
  return needed <= p.max_num_partitions;
}

}  // namespace cuda
}  // namespace paged_attn
