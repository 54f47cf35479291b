// ops.cpp — THE registry of op schemas: every m.def of the paged_attn library is here.
//
// Kernels register themselves elsewhere: csrc/cpu/*.cpp (TORCH_LIBRARY_IMPL(paged_attn, CPU, m))
// and csrc/cuda/*.cu (TORCH_LIBRARY_IMPL(paged_attn, CUDA, m)); the Python package adds the fake
// (meta) kernels and a CompositeExplicitAutograd fallback for any other device.
//
// The strings must equal paged_attention_ext/schemas.py (tests/test_registry.py compares them).
// NOTE: each `.scale_tensor` overload is defined BEFORE its float twin: torch.ops picks the first
// overload that matches, and a tensor passed to a `float` argument would otherwise be converted
// through __float__ (a host sync) instead of reaching the tensor overload.
#include <torch/library.h>

TORCH_LIBRARY(paged_attn, m) {
  // The fake (meta) kernels live in Python: torch.compile / opcheck on an op whose fake kernel is
  // missing (this library loaded without the package) import that module or say it must be.
  m.set_python_module("paged_attention_ext._registration");
  m.def(
      "v1.scale_tensor(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "int num_kv_heads, float scale, Tensor block_tables, Tensor seq_lens, "
      "int block_size, int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype, "
      "Tensor k_scale, Tensor v_scale, int tp_rank=0, int blocksparse_local_blocks=0, "
      "int blocksparse_vert_stride=0, int blocksparse_block_size=64, "
      "int blocksparse_head_sliding_step=0) -> ()");
  m.def(
      "v1(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "int num_kv_heads, float scale, Tensor block_tables, Tensor seq_lens, "
      "int block_size, int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype=\"auto\", "
      "float k_scale=1.0, float v_scale=1.0, int tp_rank=0, "
      "int blocksparse_local_blocks=0, int blocksparse_vert_stride=0, "
      "int blocksparse_block_size=64, int blocksparse_head_sliding_step=0) -> ()");
  m.def(
      "v2.scale_tensor(Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, "
      "Tensor(d!) tmp_out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "int num_kv_heads, float scale, Tensor block_tables, Tensor seq_lens, "
      "int block_size, int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype, "
      "Tensor k_scale, Tensor v_scale, int tp_rank=0, int blocksparse_local_blocks=0, "
      "int blocksparse_vert_stride=0, int blocksparse_block_size=64, "
      "int blocksparse_head_sliding_step=0) -> ()");
  m.def(
      "v2(Tensor(a!) out, Tensor(b!) exp_sums, Tensor(c!) max_logits, Tensor(d!) tmp_out, "
      "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, float scale, "
      "Tensor block_tables, Tensor seq_lens, int block_size, int max_seq_len, "
      "Tensor? alibi_slopes, str kv_cache_dtype=\"auto\", float k_scale=1.0, "
      "float v_scale=1.0, int tp_rank=0, int blocksparse_local_blocks=0, "
      "int blocksparse_vert_stride=0, int blocksparse_block_size=64, "
      "int blocksparse_head_sliding_step=0) -> ()");
  m.def(
      "reshape_and_cache.scale_tensor(Tensor key, Tensor value, Tensor(a!) key_cache, "
      "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
      "Tensor v_scale) -> ()");
  m.def(
      "reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, "
      "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype=\"auto\", "
      "float k_scale=1.0, float v_scale=1.0) -> ()");
  // decode: NHD-ordered caches [num_blocks, block_size, num_kv_heads, head_size], any strides with
  // a contiguous last dim (HND passed as its transposed view); partitioning is internal.
  m.def(
      "decode.scale_tensor(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor seq_lens, float scale, Tensor? alibi_slopes, "
      "str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()");
  m.def(
      "decode(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
      "Tensor block_tables, Tensor seq_lens, float scale, Tensor? alibi_slopes, "
      "str kv_cache_dtype=\"auto\", float k_scale=1.0, float v_scale=1.0) -> ()");
  m.def(
      "reshape_and_cache_flash.scale_tensor(Tensor key, Tensor value, Tensor(a!) key_cache, "
      "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
      "Tensor v_scale) -> ()");
  m.def(
      "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
      "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype=\"auto\", "
      "float k_scale=1.0, float v_scale=1.0) -> ()");
}
