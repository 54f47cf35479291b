// overloads.h — the C++ functions the dispatcher calls for every schema of csrc/ops.cpp (v1, v2,
// reshape_and_cache, decode, reshape_and_cache_flash, each with k_scale / v_scale as `double` or,
// in the `.scale_tensor` overload, as a tensor), for every backend. Their parameter lists come
// from op_args.h; each one turns its arguments into params (validate.h's make_*_params: every
// shape / dtype / device check, no data read) and hands them to the backend, which provides two
// entry points:
//
//   void attention(const char* op, const PagedAttentionParams& p, bool is_v2, c10::Device device);
//       v1, decode (is_v2 false: write p.out) and v2 (also exp_sums / max_logits / tmp_out);
//       p.kv_form says which cache layout (vLLM's or token-major)
//   void cache(const char* op, const ReshapeAndCacheParams& p, c10::Device device);
//       reshape_and_cache and reshape_and_cache_flash (the layouts are in p)
//
// (`device`: where the tensors are; `op`: the name error messages start with), and registers them:
//
//   PAGED_ATTN_REGISTER_KERNELS(CPU, attention, cache)
//
// (the TORCH_LIBRARY_IMPL block of that dispatch key; it records each kernel it registers in
// registered_kernels.h, which paged_attention_ext.build_info() reports).
//
// NOTE: outputs are `const at::Tensor&` (the handle is const, the data is written): the
// dispatcher wants one C++ signature per schema, whichever backend registers it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/library.h>

#include "op_args.h"
#include "registered_kernels.h"
#include "validate.h"

namespace paged_attn {
namespace overloads {

// An op_args.h list as a parameter list (FIRST, X), or as the arguments that fill its struct.
#define PA_PARAM_FIRST(type, name) type name
#define PA_PARAM(type, name) , type name
#define PA_ARG_FIRST(type, name) name
#define PA_ARG(type, name) , name

// Scale: `const at::Tensor&` (.scale_tensor overload) or `double`.
template <auto Attention, typename Scale>
void v1(const at::Tensor& out PAGED_ATTN_ATTENTION_INPUTS(PA_PARAM, Scale)) {
  const AttentionArgs args{out, nullptr, nullptr,
                           nullptr PAGED_ATTN_ATTENTION_INPUTS(PA_ARG, Scale)};
  Attention("v1", make_attention_params("v1", args), /*is_v2=*/false, query.device());
}

template <auto Attention, typename Scale>
void v2(const at::Tensor& out, const at::Tensor& exp_sums, const at::Tensor& max_logits,
        const at::Tensor& tmp_out PAGED_ATTN_ATTENTION_INPUTS(PA_PARAM, Scale)) {
  const AttentionArgs args{out, &exp_sums, &max_logits,
                           &tmp_out PAGED_ATTN_ATTENTION_INPUTS(PA_ARG, Scale)};
  Attention("v2", make_attention_params("v2", args), /*is_v2=*/true, query.device());
}

template <auto Attention, typename Scale>
void decode(PAGED_ATTN_DECODE_ARGS(PA_PARAM_FIRST, PA_PARAM, Scale)) {
  const DecodeArgs args{PAGED_ATTN_DECODE_ARGS(PA_ARG_FIRST, PA_ARG, Scale)};
  Attention("decode", make_decode_params("decode", args), /*is_v2=*/false, query.device());
}

template <auto Cache, typename Scale>
void reshape_and_cache(PAGED_ATTN_CACHE_ARGS(PA_PARAM_FIRST, PA_PARAM, Scale)) {
  const CacheArgs args{PAGED_ATTN_CACHE_ARGS(PA_ARG_FIRST, PA_ARG, Scale)};
  Cache("reshape_and_cache", make_cache_params("reshape_and_cache", args), key.device());
}

template <auto Cache, typename Scale>
void reshape_and_cache_flash(PAGED_ATTN_CACHE_ARGS(PA_PARAM_FIRST, PA_PARAM, Scale)) {
  const CacheArgs args{PAGED_ATTN_CACHE_ARGS(PA_ARG_FIRST, PA_ARG, Scale)};
  Cache("reshape_and_cache_flash", make_flash_cache_params("reshape_and_cache_flash", args),
        key.device());
}

#undef PA_PARAM_FIRST
#undef PA_PARAM
#undef PA_ARG_FIRST
#undef PA_ARG

// m.impl(op, fn), recorded under the block's dispatch key (registered_kernels.h).
template <typename Fn>
void impl(torch::Library& m, const char* dispatch_key, const char* op, Fn fn) {
  m.impl(op, fn);
  record_kernel(dispatch_key, op);
}

// Registers both overloads of every op for the library block's dispatch key, in schema order.
template <auto Attention, auto Cache>
void register_ops(torch::Library& m, const char* key) {
  using Tensor = const at::Tensor&;
  impl(m, key, "v1.scale_tensor", &v1<Attention, Tensor>);
  impl(m, key, "v1", &v1<Attention, double>);
  impl(m, key, "v2.scale_tensor", &v2<Attention, Tensor>);
  impl(m, key, "v2", &v2<Attention, double>);
  impl(m, key, "reshape_and_cache.scale_tensor", &reshape_and_cache<Cache, Tensor>);
  impl(m, key, "reshape_and_cache", &reshape_and_cache<Cache, double>);
  impl(m, key, "decode.scale_tensor", &decode<Attention, Tensor>);
  impl(m, key, "decode", &decode<Attention, double>);
  impl(m, key, "reshape_and_cache_flash.scale_tensor", &reshape_and_cache_flash<Cache, Tensor>);
  impl(m, key, "reshape_and_cache_flash", &reshape_and_cache_flash<Cache, double>);
}

}  // namespace overloads
}  // namespace paged_attn

// The TORCH_LIBRARY_IMPL block of dispatch key KEY (CPU, CUDA) registering every op of the library
// over a backend's two entry points; the key is written once, for torch and for the record.
#define PAGED_ATTN_REGISTER_KERNELS(KEY, Attention, Cache)               \
  TORCH_LIBRARY_IMPL(paged_attn, KEY, m) {                               \
    paged_attn::overloads::register_ops<Attention, Cache>(m, #KEY);      \
  }
