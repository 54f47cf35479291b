// blocksparse.h — which (query head, cache block) pairs a blocksparse call attends
// (docs/CONTRACT.md, "Blocksparse": vLLM's IS_BLOCK_SPARSE kernel path). Framework-free, host and
// device. Decided per cache block, by the sparse block of the block's first token.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace paged_attn {

struct BlocksparseParams {
  int64_t vert_stride = 0;        // <= 1: dense attention (the other fields are unused)
  int64_t block_size = 64;        // tokens per sparse block (> 0 when active)
  int64_t local_blocks = 0;       // >= 0
  int64_t head_sliding_step = 0;  // >= 0: the vertical pattern slides per query head; < 0: per KV head
  int64_t tp_rank = 0;            // >= 0: heads are counted across tensor-parallel ranks
};

PA_HOST_DEVICE bool blocksparse_active(const BlocksparseParams& b) { return b.vert_stride > 1; }

// (offset_h mod vert_stride) of query head `head` (this rank's numbering): the vertical pattern's
// shift. All operands are < 2^31 (checked), reduced before multiplying: exact in 64 bits.
PA_HOST_DEVICE int64_t blocksparse_offset(const BlocksparseParams& b, int num_heads,
                                          int num_kv_heads, int head) {
  const int64_t vs = b.vert_stride;
  const int64_t global = b.head_sliding_step >= 0
                             ? b.tp_rank * num_heads + head
                             : b.tp_rank * num_kv_heads + head / (num_heads / num_kv_heads);
  const int64_t step = b.head_sliding_step >= 0 ? b.head_sliding_step : -b.head_sliding_step;
  return ((global % vs) * (step % vs) + 1) % vs;
}

// Whether the head with that offset attends cache block `block` (index in the row's block
// table) of a row of seq_len tokens (>= 1) in blocks of cache_block_size tokens.
PA_HOST_DEVICE bool blocksparse_attends(const BlocksparseParams& b, int64_t offset,
                                        int seq_len, int cache_block_size, int64_t block) {
  const int64_t k = block * cache_block_size / b.block_size;  // sparse block of its first token
  const int64_t q = (seq_len - 1) / b.block_size;             // the query's sparse block
  return (k % b.vert_stride + offset) % b.vert_stride == 0 || k > q - b.local_blocks;
}

}  // namespace paged_attn
