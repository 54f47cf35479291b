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

// Where cache block `block` (index in the row's block table) of a row of seq_len tokens (>= 1)
// in blocks of cache_block_size tokens stands in the pattern: the part of the decision that is
// the same for every head. k: the sparse block of the cache block's first token; q: the
// query's (the row's last token's) sparse block.
struct BlocksparseBlock {
  int64_t stride_phase;  // k mod vert_stride
  bool local;            // k > q - local_blocks: within the local window
};
PA_HOST_DEVICE BlocksparseBlock blocksparse_block(const BlocksparseParams& b, int seq_len,
                                                  int cache_block_size, int64_t block) {
  const int64_t k = block * cache_block_size / b.block_size;
  const int64_t q = (seq_len - 1) / b.block_size;
  return BlocksparseBlock{k % b.vert_stride, k > q - b.local_blocks};
}

// Whether the head with that offset (blocksparse_offset: in [0, vert_stride)) attends the block:
// local, or (k + offset) mod vert_stride == 0. Both terms of the phase are below vert_stride, so
// their sum is 0 mod vert_stride exactly when it is 0 or vert_stride: no division per head.
PA_HOST_DEVICE bool blocksparse_attends(const BlocksparseParams& b, int64_t offset,
                                        const BlocksparseBlock& block) {
  const int64_t phase = block.stride_phase + offset;
  return block.local || phase == 0 || phase == b.vert_stride;
}
PA_HOST_DEVICE bool blocksparse_attends(const BlocksparseParams& b, int64_t offset,
                                        int seq_len, int cache_block_size, int64_t block) {
  return blocksparse_attends(b, offset, blocksparse_block(b, seq_len, cache_block_size, block));
}

}  // namespace paged_attn
