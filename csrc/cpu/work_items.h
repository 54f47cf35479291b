// work_items.h — the work items of one CPU attention call (attention_kernel.h's PartitionTask):
// one per (sequence, 512-token partition holding tokens, group of KV heads), partition-major.
// Framework-free: the launcher (paged_attention_cpu.cpp) and the torch-free cross driver
// (tests/cross/driver.cpp) build their items here.
//
// A group is one KV head, except on a token-major cache whose KV heads of a token are adjacent
// (NHD: [blocks, block_size, kv_heads, head_size]). There a KV head's slice of a block is
// block_size runs of one head's dims, a row-length apart, and items of one head each read a
// strip of every token row: the memory sees short strided runs, the hardware prefetchers none
// of the stream. An item of kv_heads adjacent heads reads the heads' dims of a token as one run
// (a whole block when all heads: HND's contiguous slices, by other means). Its V comes into L2
// during the first head's PV (a software stream, or amx: the hardware prefetchers) and waits
// there for the others' (partition_kernel.h): at most half the L2 of partition V per item
// (kv_heads_per_item).
#pragma once

#include <cstdint>
#include <vector>

#include "attention_kernel.h"

namespace paged_attn {
namespace cpu {

// What the launcher needs of the sequence lengths, read once per call.
struct SeqLengths {
  int longest = 0;
  int64_t tokens = 0;      // summed over the sequences
  int64_t partitions = 0;  // 512-token partitions holding tokens, summed
};
SeqLengths seq_lengths(const PagedAttentionParams& p);

// KV heads per work item for these params on `threads` threads: 1, or (NHD as above) the most
// heads, a divisor of num_kv_heads, whose partition V fits the L2 share and that still leave at
// least two items per thread.
int kv_heads_per_item(const PagedAttentionParams& p, const SeqLengths& lens, int threads);

// Partition-major items (the KV head groups of one partition are consecutive, so a thread reads
// each block's heads one after another), each partition holding at least one token.
std::vector<PartitionTask> work_items(const PagedAttentionParams& p, int kv_heads_per_item);

}  // namespace cpu
}  // namespace paged_attn
