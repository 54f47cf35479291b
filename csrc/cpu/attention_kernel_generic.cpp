// attention_kernel_generic.cpp — portable scalar CPU kernel for one work item (sequence, KV head,
// 512-token partition); see attention_kernel.h. The correctness baseline and the fallback on CPUs
// without AVX-512.
//
// Algorithm, per work item (G = query heads sharing the KV head):
//   1. logits[g][i] = qk_scale * dot(q_g, k_i) + alibi_g * (t_i - seq_len + 1), for the partition's
//      tokens t_i (K read once per token, used by all G heads);
//   2. m_g = max_i logits[g][i];  p[g][i] = exp(logits - m_g);  s_g = sum_i p[g][i];
//   3. out_g = sum_i p[g][i] * v_i / s_g (V read once per token, used by all G heads).
// (m_g, s_g, out_g) is the partition's compound state (core/compound_state.h) with out normalised.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention_kernel.h"
#include "cache_element.h"

namespace paged_attn {
namespace cpu {
namespace {

template <typename Cache>
void run_partition(const PagedAttentionParams& p, const KernelInputs& in, PartitionTask task,
                   float* scratch) {
  using T = typename Cache::storage;
  const int G = p.num_heads / p.num_kv_heads;
  const int D = p.head_size, bs = p.block_size, x = p.x;
  const int seq_len = p.seq_lens[task.seq];
  const int t_begin = task.partition * kPartitionSize;
  const int t_end = std::min(seq_len, t_begin + kPartitionSize);
  const int n = t_end - t_begin;
  const int32_t* table = p.block_tables + static_cast<int64_t>(task.seq) * p.max_blocks_per_seq;
  const T* K = static_cast<const T*>(p.key_cache);
  const T* V = static_cast<const T*>(p.value_cache);
  const int64_t head_off = static_cast<int64_t>(task.kv_head) * p.kv_head_stride;
  const int h0 = task.kv_head * G;
  const float* q = in.query + (static_cast<int64_t>(task.seq) * p.num_heads + h0) * D;  // [G, D]

  float* logits = scratch;  // [G, kPartitionSize]
  for (int i = 0; i < n; ++i) {
    const int t = t_begin + i;
    const int64_t block = table[t / bs];  // NOTE: 64-bit block offset
    const T* k = K + block * p.kv_block_stride + head_off + (t % bs) * x;  // + (d / x) * bs * x
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
      for (int d = 0; d < D; ++d) dot += q[g * D + d] * Cache::decode(k[(d / x) * bs * x + d % x]);
      const float bias = p.alibi_slopes ? p.alibi_slopes[h0 + g] * (t - seq_len + 1) : 0.0f;
      logits[g * kPartitionSize + i] = in.qk_scale * dot + bias;
    }
  }

  std::vector<float> acc(D);
  for (int g = 0; g < G; ++g) {
    float* l = logits + g * kPartitionSize;
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) m = std::max(m, l[i]);
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      l[i] = std::exp(l[i] - m);
      sum += l[i];
    }
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int i = 0; i < n; ++i) {  // only tokens < seq_len: NaN in later slots never read
      const int t = t_begin + i;
      const int64_t block = table[t / bs];
      const T* v = V + block * p.kv_block_stride + head_off + (t % bs);  // + d * bs
      for (int d = 0; d < D; ++d) acc[d] += l[i] * Cache::decode(v[static_cast<int64_t>(d) * bs]);
    }
    const int64_t row = (static_cast<int64_t>(task.seq) * p.num_heads + h0 + g) *
                            in.num_partitions + task.partition;
    in.max_logits[row] = m;
    in.exp_sums[row] = sum;
    const float norm = in.v_scale / sum;  // sum >= 1 (the max term is exp(0))
    for (int d = 0; d < D; ++d) in.part_out[row * D + d] = acc[d] * norm;
  }
}

}  // namespace

void attention_partition_generic(const PagedAttentionParams& p, const KernelInputs& in,
                                 PartitionTask task, const PartitionTask* /*next*/,
                                 float* scratch) {
  switch (p.cache_kind) {
    case CacheKind::kFp8E4M3:
      return run_partition<E4M3>(p, in, task, scratch);
    case CacheKind::kFp8E5M2:
      return run_partition<E5M2>(p, in, task, scratch);
    case CacheKind::kAuto:
      break;
  }
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32:
      return run_partition<F32>(p, in, task, scratch);
    case ScalarKind::kFloat16:
      return run_partition<F16>(p, in, task, scratch);
    case ScalarKind::kBFloat16:
      return run_partition<BF16>(p, in, task, scratch);
  }
}

}  // namespace cpu
}  // namespace paged_attn
