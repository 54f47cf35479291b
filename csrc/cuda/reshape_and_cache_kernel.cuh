// reshape_and_cache_kernel.cuh — scatter new tokens' K and V into the paged caches, for
// reshape_and_cache (vLLM's layouts) and reshape_and_cache_flash (token-major caches) alike: the
// element address is the cache's KvLayout (core/kv_layout.h).
//
// Token i with slot s = slot_mapping[i] (s = block * block_size + offset; s < 0 is padding):
//   K element (block, offset, h, d) = enc(key[i, h, d])    e.g. vLLM's key_cache[block, h, d / x, offset, d % x]
//   V element (block, offset, h, d) = enc(value[i, h, d])  e.g. vLLM's value_cache[block, h, d, offset],
//                                                          token-major cache[block, offset, h, d]
// enc: a plain copy for "auto" caches; fp8(v / scale) saturated for fp8 caches (scale from the
// tensor on the device when given: no host sync).
// NOTE: a slot >= num_blocks * block_size is skipped (never written out of bounds); the CPU
// backend and api.reshape_and_cache(..., validate=True) report it as an error.
#pragma once

#include <cstdint>

#include "../core/params.h"
#include "cache_access.cuh"

namespace paged_attn {
namespace cuda {

// Grid: (num_tokens)   Block: kThreads threads striding over num_kv_heads * head_size.
// e5m2: the fp8 format when CacheT is uint8_t (a uniform flag: the loop is store-bound).
template <typename Scalar, typename CacheT, int kThreads>
__global__ void __launch_bounds__(kThreads)
    reshape_and_cache_kernel(const ReshapeAndCacheParams p, const bool e5m2 = false) {
  constexpr bool kFp8 = sizeof(CacheT) == 1;
  const int64_t token = blockIdx.x;
  const int64_t slot = p.slot_mapping[token];
  if (slot < 0 || slot >= p.num_blocks * p.block_size) return;  // padding / out of range
  const int64_t block = slot / p.block_size;
  const int64_t offset = slot % p.block_size;
  float k_scale = 1.0f, v_scale = 1.0f;
  if (kFp8) {
    k_scale = p.k_scale_ptr != nullptr ? *p.k_scale_ptr : p.k_scale;
    v_scale = p.v_scale_ptr != nullptr ? *p.v_scale_ptr : p.v_scale;
  }
  const Scalar* key = static_cast<const Scalar*>(p.key) + token * p.key_token_stride;
  const Scalar* value = static_cast<const Scalar*>(p.value) + token * p.value_token_stride;
  CacheT* k_block = static_cast<CacheT*>(p.key_cache) + block * p.k_layout.block_stride;
  CacheT* v_block = static_cast<CacheT*>(p.value_cache) + block * p.v_layout.block_stride;
  const int head_size = p.head_size;
  const int n = p.num_kv_heads * head_size;
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const int h = i / head_size;
    const int d = i % head_size;
    const float k = to_float(key[static_cast<int64_t>(h) * p.key_head_stride + d]);
    const float v = to_float(value[static_cast<int64_t>(h) * p.value_head_stride + d]);
    k_block[p.k_layout.slice(0, h) + p.k_layout.in_slice(offset, d)] =
        store_cast<CacheT>(k, k_scale, e5m2);
    v_block[p.v_layout.slice(0, h) + p.v_layout.in_slice(offset, d)] =
        store_cast<CacheT>(v, v_scale, e5m2);
  }
}

}  // namespace cuda
}  // namespace paged_attn
