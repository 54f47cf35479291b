// overloads.h — the C++ signatures of the schemas in csrc/ops.cpp (v1, v2, reshape_and_cache,
// decode, reshape_and_cache_flash, each with k_scale / v_scale as `float` or, in the `.scale_tensor` overload, as a tensor),
// written once for every backend. A backend provides two entry points and registers these
// templates over them:
//
//   void attention(const char* op, const at::Tensor& out, const at::Tensor* exp_sums,
//                  const at::Tensor* max_logits, const at::Tensor* tmp_out,  // nullptr: v1
//                  const at::Tensor& query, const at::Tensor& key_cache,
//                  const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
//                  const at::Tensor& block_tables, const at::Tensor& seq_lens,
//                  int64_t block_size, int64_t max_seq_len,
//                  const std::optional<at::Tensor>& alibi_slopes,
//                  const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale,
//                  BlocksparseArgs blocksparse);
//   void cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
//              const at::Tensor& value_cache, const at::Tensor& slot_mapping,
//              const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale);
//
//   PAGED_ATTN_REGISTER_KERNELS(CPU, attention, cache, decode, cache_flash)
//
// (the TORCH_LIBRARY_IMPL block of that dispatch key; it records each kernel it registers in
// registered_kernels.h, which paged_attention_ext.build_info() reports).
//
// NOTE: outputs are `const at::Tensor&` (the handle is const, the data is written): the
// dispatcher wants one C++ signature per schema, whichever backend registers it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "registered_kernels.h"

#include "validate.h"

namespace paged_attn {
namespace overloads {

inline ScaleArg scale_of(const at::Tensor& t) { return ScaleArg{&t, 1.0}; }
inline ScaleArg scale_of(double v) { return ScaleArg{nullptr, v}; }

// Scale: `const at::Tensor&` (.scale_tensor overload) or `double`.
template <auto Attention, typename Scale>
void v1(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
        int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
        const std::string& kv_cache_dtype, Scale k_scale, Scale v_scale, int64_t tp_rank,
        int64_t bs_local_blocks, int64_t bs_vert_stride, int64_t bs_block_size,
        int64_t bs_head_sliding_step) {
  Attention("v1", out, nullptr, nullptr, nullptr, query, key_cache, value_cache, num_kv_heads,
            scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype,
            scale_of(k_scale), scale_of(v_scale),
            BlocksparseArgs{tp_rank, bs_local_blocks, bs_vert_stride, bs_block_size,
                            bs_head_sliding_step});
}

template <auto Attention, typename Scale>
void v2(const at::Tensor& out, const at::Tensor& exp_sums, const at::Tensor& max_logits,
        const at::Tensor& tmp_out, const at::Tensor& query, const at::Tensor& key_cache,
        const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
        const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
        int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
        const std::string& kv_cache_dtype, Scale k_scale, Scale v_scale, int64_t tp_rank,
        int64_t bs_local_blocks, int64_t bs_vert_stride, int64_t bs_block_size,
        int64_t bs_head_sliding_step) {
  Attention("v2", out, &exp_sums, &max_logits, &tmp_out, query, key_cache, value_cache,
            num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
            kv_cache_dtype, scale_of(k_scale), scale_of(v_scale),
            BlocksparseArgs{tp_rank, bs_local_blocks, bs_vert_stride, bs_block_size,
                            bs_head_sliding_step});
}

template <auto Cache, typename Scale>
void reshape_and_cache(const at::Tensor& key, const at::Tensor& value,
                       const at::Tensor& key_cache, const at::Tensor& value_cache,
                       const at::Tensor& slot_mapping, const std::string& kv_cache_dtype,
                       Scale k_scale, Scale v_scale) {
  Cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, scale_of(k_scale),
        scale_of(v_scale));
}

template <auto Decode, typename Scale>
void decode(const at::Tensor& out, const at::Tensor& query, const at::Tensor& key_cache,
            const at::Tensor& value_cache, const at::Tensor& block_tables,
            const at::Tensor& seq_lens, double scale,
            const std::optional<at::Tensor>& alibi_slopes, const std::string& kv_cache_dtype,
            Scale k_scale, Scale v_scale) {
  Decode("decode", out, query, key_cache, value_cache, block_tables, seq_lens, scale,
         alibi_slopes, kv_cache_dtype, scale_of(k_scale), scale_of(v_scale));
}

// m.impl(op, fn), recorded under the block's dispatch key (registered_kernels.h).
template <typename Fn>
void impl(torch::Library& m, const char* dispatch_key, const char* op, Fn fn) {
  m.impl(op, fn);
  record_kernel(dispatch_key, op);
}

// Registers both overloads of v1, v2 and reshape_and_cache for the library block's dispatch key.
template <auto Attention, auto Cache>
void register_ops(torch::Library& m, const char* key) {
  impl(m, key, "v1.scale_tensor", &v1<Attention, const at::Tensor&>);
  impl(m, key, "v1", &v1<Attention, double>);
  impl(m, key, "v2.scale_tensor", &v2<Attention, const at::Tensor&>);
  impl(m, key, "v2", &v2<Attention, double>);
  impl(m, key, "reshape_and_cache.scale_tensor", &reshape_and_cache<Cache, const at::Tensor&>);
  impl(m, key, "reshape_and_cache", &reshape_and_cache<Cache, double>);
}

// Registers both overloads of decode and reshape_and_cache_flash (token-major caches). Decode:
//   void decode(const char* op, const at::Tensor& out, const at::Tensor& query,
//               const at::Tensor& key_cache, const at::Tensor& value_cache,
//               const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
//               const std::optional<at::Tensor>& alibi_slopes,
//               const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale);
// FlashCache: the signature of `cache` above.
template <auto Decode, auto FlashCache>
void register_token_major_ops(torch::Library& m, const char* key) {
  impl(m, key, "decode.scale_tensor", &decode<Decode, const at::Tensor&>);
  impl(m, key, "decode", &decode<Decode, double>);
  impl(m, key, "reshape_and_cache_flash.scale_tensor",
       &reshape_and_cache<FlashCache, const at::Tensor&>);
  impl(m, key, "reshape_and_cache_flash", &reshape_and_cache<FlashCache, double>);
}

}  // namespace overloads
}  // namespace paged_attn

// The TORCH_LIBRARY_IMPL block of dispatch key KEY (CPU, CUDA) registering every op of the library
// over a backend's entry points; the key is written once, for torch and for the record.
#define PAGED_ATTN_REGISTER_KERNELS(KEY, Attention, Cache, Decode, FlashCache)             \
  TORCH_LIBRARY_IMPL(paged_attn, KEY, m) {                                                 \
    paged_attn::overloads::register_ops<Attention, Cache>(m, #KEY);                        \
    paged_attn::overloads::register_token_major_ops<Decode, FlashCache>(m, #KEY);          \
  }
