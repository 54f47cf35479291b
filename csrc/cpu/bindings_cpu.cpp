// bindings_cpu.cpp — registers the CPU kernels for both overloads of every paged_attn op
// (schemas: csrc/ops.cpp; the overloads' signatures: torch_glue/overloads.h). The entry
// points only turn arguments into params (torch_glue/validate.h) and call the launcher
// (paged_attention_cpu.h).
#include <torch/library.h>

#include <optional>
#include <string>

#include "../torch_glue/overloads.h"
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

void cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
           const at::Tensor& value_cache, const at::Tensor& slot_mapping,
           const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale) {
  const char* op = "reshape_and_cache";
  const ReshapeAndCacheParams p = make_cache_params(op, key, value, key_cache, value_cache,
                                                    slot_mapping, kv_cache_dtype, k_scale,
                                                    v_scale);
  reshape_and_cache(op, p);
}

void decode(const char* op, const at::Tensor& out, const at::Tensor& query,
            const at::Tensor& key_cache, const at::Tensor& value_cache,
            const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
            const std::optional<at::Tensor>& alibi_slopes, const std::string& kv_cache_dtype,
            ScaleArg k_scale, ScaleArg v_scale) {
  const PagedAttentionParams p =
      make_decode_params(op, out, query, key_cache, value_cache, block_tables, seq_lens, scale,
                         alibi_slopes, kv_cache_dtype, k_scale, v_scale);
  paged_attention(op, p, query, out, nullptr);
}

void cache_flash(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
                 const at::Tensor& value_cache, const at::Tensor& slot_mapping,
                 const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale) {
  const char* op = "reshape_and_cache_flash";
  const ReshapeAndCacheParams p = make_flash_cache_params(
      op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale);
  reshape_and_cache(op, p);
}

}  // namespace
}  // namespace cpu
}  // namespace paged_attn

PAGED_ATTN_REGISTER_KERNELS(CPU, paged_attn::cpu::attention, paged_attn::cpu::cache,
                            paged_attn::cpu::decode, paged_attn::cpu::cache_flash)
