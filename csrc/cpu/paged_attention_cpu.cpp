// paged_attention_cpu.cpp — CPU launcher of v1 / v2 / decode on checked params: work items, the
// parallel run of the partition kernel (attention_kernel.h) and the log-sum-exp merge of
// partitions.
//
// Phase 1: one work item per (sequence, KV head, 512-token partition) holding tokens, spread over
//          threads with at::parallel_for; each writes the partition's (max, exp sum, output
//          normalised by its sum) for the KV head's G query heads. v2 writes max / sum straight
//          into max_logits / exp_sums; v1 uses small internal arrays (it partitions the same way,
//          only for parallelism, so its `out` equals v2's).
// Phase 2: per (sequence, head), weights from core/compound_state.h's partition_weights, out =
//          sum_p w_p * out_p rounded once to the query dtype; v2 also stores tmp_out (query dtype)
//          for the partitions p < ceil(seq_len / 512). Rows with seq_len == 0 get zeros. With
//          one partition and fp32 `out`, phase 1 writes `out` itself ("direct").
#include "paged_attention_cpu.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "../core/compound_state.h"
#include "attention_kernel.h"
#include "cache_element.h"
#include "threads_per_call.h"
#include "work_items.h"

namespace paged_attn {
namespace cpu {
namespace {

int partitions_of(int seq_len) { return (seq_len + kPartitionSize - 1) / kPartitionSize; }

// Float buffers of one call (the query copy, v1's partition statistics, the partition outputs),
// each kept by the calling thread for its next call (one per kBuffer). Fresh, they are pages
// malloc may map per call, each 4 KiB faulted in on first touch: ~480 faults, ~15% of a bf16
// call of 64 sequences x 256 tokens in cache (docs/CPU_KERNEL.md). A buffer of more than
// kKeepFloats is the call's own (its faults are small beside the K / V the call reads).
constexpr size_t kKeepFloats = size_t{8} << 20;  // 32 MiB

template <int kBuffer>
float* call_buffer(size_t floats, std::unique_ptr<float[]>* own) {
  thread_local std::vector<float> kept;
  if (floats > kKeepFloats) {
    own->reset(new float[floats]);
    return own->get();
  }
  if (kept.size() < floats) kept.resize(floats);
  return kept.data();
}

// Scale of an fp8 cache: the tensor overload's CPU float, else the double; 1 for "auto".
float cache_scale(const PagedAttentionParams& p, const float* ptr, float value) {
  if (p.cache_kind == CacheKind::kAuto) return 1.0f;
  return ptr != nullptr ? *ptr : value;
}

// K and V bytes the call reads.
int64_t kv_bytes(const PagedAttentionParams& p, const SeqLengths& lens) {
  return 2 * lens.tokens * p.num_kv_heads * p.head_size *
         cache_element_bytes(p.scalar_kind, p.cache_kind);
}

// q [num_seqs * num_heads, head_size] = the query (any seq / head strides, storage tag F32, F16
// or BF16 of cache_element.h) as fp32.
template <typename Tag>
void copy_query_rows(const PagedAttentionParams& p, float* q) {
  const auto* query = static_cast<const typename Tag::storage*>(p.query);
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads, D = p.head_size;
  for (int64_t row = 0; row < rows; ++row) {
    const auto* src =
        query + row / p.num_heads * p.q_seq_stride + row % p.num_heads * p.q_head_stride;
    for (int64_t d = 0; d < D; ++d) q[row * D + d] = Tag::decode(src[d]);
  }
}

// The query is read in place when it is contiguous fp32 [num_seqs, num_heads, head_size].
bool query_is_float_rows(const PagedAttentionParams& p) {
  const int64_t D = p.head_size;
  return p.scalar_kind == ScalarKind::kFloat32 && (p.num_heads <= 1 || p.q_head_stride == D) &&
         (p.num_seqs <= 1 || p.q_seq_stride == p.num_heads * D);
}

// The query as contiguous fp32 rows: p.query itself (query_is_float_rows), else copied to `copy`.
const float* query_as_float(const PagedAttentionParams& p, float* copy) {
  if (query_is_float_rows(p)) return static_cast<const float*>(p.query);
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: copy_query_rows<F32>(p, copy); break;
    case ScalarKind::kFloat16: copy_query_rows<F16>(p, copy); break;
    case ScalarKind::kBFloat16: copy_query_rows<BF16>(p, copy); break;
  }
  return copy;
}

// dst[0, n) = src rounded to the output dtype. bf16 as c10::BFloat16 rounds (to nearest even, NaN
// to a quiet NaN), in integer arithmetic the compiler vectorizes (its scalar conversion was most
// of the merge's time for bf16 rows).
inline void store_row(const float* src, float* dst, int64_t n) { std::copy_n(src, n, dst); }
inline void store_row(const float* src, c10::Half* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<c10::Half>(src[i]);
}
inline void store_row(const float* src, c10::BFloat16* dst, int64_t n) {
  auto* bits = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof(u));
    const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    bits[i] = static_cast<uint16_t>(src[i] != src[i] ? 0x7FC0u : rounded);
  }
}

// acc[0, n) += w * x[0, n) (distinct arrays: vectorized).
inline void add_scaled(float w, const float* __restrict x, float* __restrict acc, int n) {
  for (int i = 0; i < n; ++i) acc[i] += w * x[i];
}

template <typename scalar_t>
void merge_partitions(const PagedAttentionParams& p, const KernelInputs& in, bool is_v2) {
  const int D = p.head_size, P = in.num_partitions;
  auto* out = static_cast<scalar_t*>(p.out);
  auto* tmp_out = static_cast<scalar_t*>(p.tmp_out);
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
  // Rows per thread: enough to be worth a thread wake-up (~64k floats of partition outputs).
  const int64_t grain = std::max<int64_t>(16, (1 << 16) / (static_cast<int64_t>(P) * D));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> w(P), acc(D);
    for (int64_t row = begin; row < end; ++row) {
      const int n = partitions_of(p.seq_lens[row / p.num_heads]);
      const float* part = in.part_out + row * P * D;  // [P, D]
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (n > 0) {
        partition_weights(in.max_logits + row * P, in.exp_sums + row * P, n, w.data());
        for (int q = 0; q < n; ++q) add_scaled(w[q], part + q * D, acc.data(), D);
      }
      store_row(acc.data(), out + row * D, D);
      if (is_v2) store_row(part, tmp_out + row * P * D, static_cast<int64_t>(n) * D);
    }
  });
}

}  // namespace

void paged_attention(const PagedAttentionParams& p, bool is_v2, PartitionKernel kernel,
                     int64_t min_kv_bytes_per_thread) {
  // No output elements, nothing to write (and a GQA group of 0 heads to divide by).
  if (p.num_seqs == 0 || p.num_heads == 0 || p.head_size == 0) return;
  // Work items with at least one token, so threads get equal counts of real work.
  const SeqLengths lens = seq_lengths(p);
  const int P = is_v2 ? p.max_num_partitions : std::max(1, partitions_of(lens.longest));
  // Partition-major (work_items.h): a thread reads each block's heads one after another, and
  // the next item's prefetch lands in the same blocks (docs/CPU_KERNEL.md, "Performance: where
  // the time goes").
  const int heads_per_item = kv_heads_per_item(p, lens, at::get_num_threads());
  const std::vector<PartitionTask> tasks = work_items(p, heads_per_item);

  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;
  // One partition per row and an fp32 `out`: a partition's output, normalised by its own sum, IS
  // the row's output (weight 1), so the kernel writes `out` and phase 2 only zeroes the rows of
  // sequences with no tokens (v2: and copies the other rows to tmp_out, its partition 0).
  const bool direct = P == 1 && p.scalar_kind == ScalarKind::kFloat32;
  // The query copy, v1 / decode's partition max and sum ([2, rows, P]), the partition outputs.
  const size_t query_floats = query_is_float_rows(p) ? 0 : rows * p.head_size;
  const size_t stats_floats = is_v2 ? 0 : 2 * rows * P;
  const size_t part_floats = direct ? 0 : rows * P * p.head_size;
  std::unique_ptr<float[]> own_query, own_stats, own_part;
  const float* query = query_as_float(p, call_buffer<0>(query_floats, &own_query));
  float* const stats = call_buffer<1>(stats_floats, &own_stats);
  float* const part_out = call_buffer<2>(part_floats, &own_part);

  KernelInputs in;
  in.query = query;
  in.qk_scale = p.scale * cache_scale(p, p.k_scale_ptr, p.k_scale);
  in.v_scale = cache_scale(p, p.v_scale_ptr, p.v_scale);
  in.max_logits = is_v2 ? p.max_logits : stats;
  in.exp_sums = is_v2 ? p.exp_sums : stats + rows * P;
  in.part_out = direct ? static_cast<float*>(p.out) : part_out;  // [rows, P, D]
  in.num_partitions = P;

  const size_t scratch_floats = kernel_scratch_floats(p, heads_per_item);
  const int64_t n_tasks = static_cast<int64_t>(tasks.size());
  const int64_t grain = items_per_thread(n_tasks, kv_bytes(p, lens), min_kv_bytes_per_thread);
  at::parallel_for(0, n_tasks, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(scratch_floats);
    for (int64_t i = begin; i < end; ++i)
      kernel(p, in, tasks[i], i + 1 < end ? &tasks[i + 1] : nullptr, scratch.data());
  });

  if (direct) {
    const int64_t seq_floats = static_cast<int64_t>(p.num_heads) * p.head_size;
    for (int s = 0; s < p.num_seqs; ++s) {
      float* out = static_cast<float*>(p.out) + s * seq_floats;
      if (p.seq_lens[s] == 0)
        std::fill_n(out, seq_floats, 0.0f);
      else if (is_v2)
        std::copy_n(out, seq_floats, static_cast<float*>(p.tmp_out) + s * seq_floats);
    }
    return;
  }
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: return merge_partitions<float>(p, in, is_v2);
    case ScalarKind::kFloat16: return merge_partitions<c10::Half>(p, in, is_v2);
    case ScalarKind::kBFloat16: return merge_partitions<c10::BFloat16>(p, in, is_v2);
  }
}

}  // namespace cpu
}  // namespace paged_attn
