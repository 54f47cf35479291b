// work_items.cpp — see work_items.h.
#include "work_items.h"

#include <unistd.h>

#include <algorithm>

#include "../core/params.h"

namespace paged_attn {
namespace cpu {
namespace {

int partitions_of(int seq_len) { return (seq_len + kPartitionSize - 1) / kPartitionSize; }

// L2 bytes per core as the C library reports them; 1 MiB where it does not.
int64_t l2_bytes() {
  static const int64_t bytes = [] {
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long n = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (n > 0) return static_cast<int64_t>(n);
#endif
    return int64_t{1} << 20;
  }();
  return bytes;
}

// KV heads of a token adjacent in both caches (NHD), so that a group of them is one run.
bool heads_adjacent(const PagedAttentionParams& p) {
  return p.kv_form == KvForm::kTokenMajor && p.num_kv_heads > 1 &&
         p.k_layout.head_stride == p.head_size && p.v_layout.head_stride == p.head_size;
}

// The most KV heads whose V of one partition fits half the L2 (a divisor of num_kv_heads).
int l2_heads(const PagedAttentionParams& p, int longest) {
  const int64_t v_bytes = static_cast<int64_t>(std::min(longest, kPartitionSize)) * p.head_size *
                          cache_element_bytes(p.scalar_kind, p.cache_kind);
  int best = 1;
  for (int n = 2; n <= p.num_kv_heads; ++n)
    if (p.num_kv_heads % n == 0 && n * v_bytes <= l2_bytes() / 2) best = n;
  return best;
}

}  // namespace

SeqLengths seq_lengths(const PagedAttentionParams& p) {
  SeqLengths lens;
  for (int s = 0; s < p.num_seqs; ++s) {
    lens.longest = std::max(lens.longest, p.seq_lens[s]);
    lens.tokens += p.seq_lens[s];
    lens.partitions += partitions_of(p.seq_lens[s]);
  }
  return lens;
}

int kv_heads_per_item(const PagedAttentionParams& p, const SeqLengths& lens, int threads) {
  const int most = heads_adjacent(p) ? l2_heads(p, lens.longest) : 1;
  if (most == 1) return 1;
  for (int n = most; n > 1; --n)  // the largest divisor leaving two items per thread
    if (p.num_kv_heads % n == 0 &&
        lens.partitions * (p.num_kv_heads / n) >= 2 * static_cast<int64_t>(std::max(threads, 1)))
      return n;
  return 1;
}

std::vector<PartitionTask> work_items(const PagedAttentionParams& p, int kv_heads_per_item) {
  std::vector<PartitionTask> tasks;
  for (int s = 0; s < p.num_seqs; ++s)
    for (int part = 0; part < partitions_of(p.seq_lens[s]); ++part)
      for (int kh = 0; kh < p.num_kv_heads; kh += kv_heads_per_item)
        tasks.push_back(PartitionTask{s, kh, part, kv_heads_per_item});
  return tasks;
}

}  // namespace cpu
}  // namespace paged_attn
