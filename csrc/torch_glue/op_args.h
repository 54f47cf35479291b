// op_args.h — the ops' C++ argument lists, each written once, in schema order (the schema text is
// paged_attention_ext/schemas.py; csrc/ops.cpp defines it). From each list come the overloads'
// function types (overloads.h: what the dispatcher calls) and the struct that carries one call's
// arguments to make_*_params (validate.h).
//
// A list is X(type, name) per argument; a list that starts an op's parameter list names its
// first argument with FIRST(type, name) instead (no comma goes before it). `Scale` is the type of
// k_scale / v_scale: `double` (default overload) or `const at::Tensor&` (.scale_tensor
// overload); the structs hold either as a ScaleArg.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

// v1 and v2 after their outputs (v1: out; v2: out, exp_sums, max_logits, tmp_out).
#define PAGED_ATTN_ATTENTION_INPUTS(X, Scale)       \
  X(const at::Tensor&, query)                       \
  X(const at::Tensor&, key_cache)                   \
  X(const at::Tensor&, value_cache)                 \
  X(int64_t, num_kv_heads)                          \
  X(double, scale)                                  \
  X(const at::Tensor&, block_tables)                \
  X(const at::Tensor&, seq_lens)                    \
  X(int64_t, block_size)                            \
  X(int64_t, max_seq_len)                           \
  X(const std::optional<at::Tensor>&, alibi_slopes) \
  X(const std::string&, kv_cache_dtype)             \
  X(Scale, k_scale)                                 \
  X(Scale, v_scale)                                 \
  X(int64_t, tp_rank)                               \
  X(int64_t, blocksparse_local_blocks)              \
  X(int64_t, blocksparse_vert_stride)               \
  X(int64_t, blocksparse_block_size)                \
  X(int64_t, blocksparse_head_sliding_step)

// decode (token-major caches; sizes come from the tensors).
#define PAGED_ATTN_DECODE_ARGS(FIRST, X, Scale)     \
  FIRST(const at::Tensor&, out)                     \
  X(const at::Tensor&, query)                       \
  X(const at::Tensor&, key_cache)                   \
  X(const at::Tensor&, value_cache)                 \
  X(const at::Tensor&, block_tables)                \
  X(const at::Tensor&, seq_lens)                    \
  X(double, scale)                                  \
  X(const std::optional<at::Tensor>&, alibi_slopes) \
  X(const std::string&, kv_cache_dtype)             \
  X(Scale, k_scale)                                 \
  X(Scale, v_scale)

// reshape_and_cache and reshape_and_cache_flash (one argument list, two cache layouts).
#define PAGED_ATTN_CACHE_ARGS(FIRST, X, Scale) \
  FIRST(const at::Tensor&, key)                \
  X(const at::Tensor&, value)                  \
  X(const at::Tensor&, key_cache)              \
  X(const at::Tensor&, value_cache)            \
  X(const at::Tensor&, slot_mapping)           \
  X(const std::string&, kv_cache_dtype)        \
  X(Scale, k_scale)                            \
  X(Scale, v_scale)

namespace paged_attn {

// k_scale / v_scale as either overload passes them: a 1-element float32 tensor (read by the
// kernel through a pointer, no host sync) or a plain double.
struct ScaleArg {
  ScaleArg(const at::Tensor& t) : tensor(&t) {}  // NOLINT: implicit, from either overload
  ScaleArg(double v) : value(v) {}               // NOLINT
  const at::Tensor* tensor = nullptr;            // non-null for the .scale_tensor overload
  double value = 1.0;
};

#define PAGED_ATTN_ARG_FIELD(type, name) type name;

// One v1 or v2 call: the outputs, then PAGED_ATTN_ATTENTION_INPUTS.
struct AttentionArgs {
  const at::Tensor& out;
  const at::Tensor* exp_sums;    // v2's scratch; nullptr for v1
  const at::Tensor* max_logits;  // v2; nullptr for v1
  const at::Tensor* tmp_out;     // v2; nullptr for v1
  PAGED_ATTN_ATTENTION_INPUTS(PAGED_ATTN_ARG_FIELD, ScaleArg)
};

// One decode call.
struct DecodeArgs {
  PAGED_ATTN_DECODE_ARGS(PAGED_ATTN_ARG_FIELD, PAGED_ATTN_ARG_FIELD, ScaleArg)
};

// One reshape_and_cache or reshape_and_cache_flash call.
struct CacheArgs {
  PAGED_ATTN_CACHE_ARGS(PAGED_ATTN_ARG_FIELD, PAGED_ATTN_ARG_FIELD, ScaleArg)
};

#undef PAGED_ATTN_ARG_FIELD

}  // namespace paged_attn
