// bindings_cpu.cpp — registers the CPU kernels for both overloads of every paged_attn op
// (schemas: csrc/ops.cpp). Each wrapper only turns arguments into params (torch_glue/validate.h)
// and calls the launcher (paged_attention_cpu.h).
#include <torch/library.h>

#include <optional>
#include <string>

#include "../torch_glue/validate.h"
#include "paged_attention_cpu.h"

namespace paged_attn {
namespace cpu {
namespace {

void attention(const char* op, const at::Tensor& out, const at::Tensor* exp_sums,
               const at::Tensor* max_logits, const at::Tensor* tmp_out, const at::Tensor& query,
               const at::Tensor& key_cache, const at::Tensor& value_cache, int64_t num_kv_heads,
               double scale, const at::Tensor& block_tables, const at::Tensor& seq_lens,
               int64_t block_size, int64_t max_seq_len,
               const std::optional<at::Tensor>& alibi_slopes, const std::string& kv_cache_dtype,
               ScaleArg k_scale, ScaleArg v_scale, BlocksparseArgs blocksparse) {
  const PagedAttentionParams p = make_attention_params(
      op, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
      block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
      v_scale, blocksparse);
  paged_attention(op, p, query, out, tmp_out);
}

ScaleArg scale_of(const at::Tensor& t) { return ScaleArg{&t, 1.0}; }
ScaleArg scale_of(double v) { return ScaleArg{nullptr, v}; }

// v1 / v2 for either overload: Scale is `const at::Tensor&` (.scale_tensor) or `double`.
template <typename Scale>
void v1(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
        int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
        const std::string& kv_cache_dtype, Scale k_scale, Scale v_scale, int64_t tp_rank,
        int64_t bs_local_blocks, int64_t bs_vert_stride, int64_t bs_block_size,
        int64_t bs_head_sliding_step) {
  attention("v1", out, nullptr, nullptr, nullptr, query, key_cache, value_cache, num_kv_heads,
            scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
            scale_of(k_scale), scale_of(v_scale),
            BlocksparseArgs{tp_rank, bs_local_blocks, bs_vert_stride, bs_block_size,
                            bs_head_sliding_step});
}

template <typename Scale>
void v2(const at::Tensor& out, const at::Tensor& exp_sums, const at::Tensor& max_logits,
        const at::Tensor& tmp_out, const at::Tensor& query, const at::Tensor& key_cache,
        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
        int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
        const std::string& kv_cache_dtype, Scale k_scale, Scale v_scale, int64_t tp_rank,
        int64_t bs_local_blocks, int64_t bs_vert_stride, int64_t bs_block_size,
        int64_t bs_head_sliding_step) {
  attention("v2", out, &exp_sums, &max_logits, &tmp_out, query, key_cache, value_cache,
            num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
            kv_cache_dtype, scale_of(k_scale), scale_of(v_scale),
            BlocksparseArgs{tp_rank, bs_local_blocks, bs_vert_stride, bs_block_size,
                            bs_head_sliding_step});
}

template <typename Scale>
void cache_write(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                 const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                 const std::string& kv_cache_dtype, Scale k_scale, Scale v_scale) {
  const char* op = "reshape_and_cache";
  const ReshapeAndCacheParams p = make_cache_params(op, key, value, key_cache, value_cache,
                                                    slot_mapping, kv_cache_dtype,
                                                    scale_of(k_scale), scale_of(v_scale));
  reshape_and_cache(op, p);
}

}  // namespace
}  // namespace cpu
}  // namespace paged_attn

TORCH_LIBRARY_IMPL(paged_attn, CPU, m) {
  using namespace paged_attn::cpu;
  m.impl("v1.scale_tensor", &v1<const at::Tensor&>);
  m.impl("v1", &v1<double>);
  m.impl("v2.scale_tensor", &v2<const at::Tensor&>);
  m.impl("v2", &v2<double>);
  m.impl("reshape_and_cache.scale_tensor", &cache_write<const at::Tensor&>);
  m.impl("reshape_and_cache", &cache_write<double>);
}
