// reshape_and_cache_cpu.cpp — CPU reshape_and_cache and reshape_and_cache_flash: token i's
// key / value [num_kv_heads, head_size] go to slot slot_mapping[i] = block * block_size + offset
// of the caches, wherever the params' layouts (core/kv_layout.h) put (block, offset, head, dim):
// vLLM's K / V for reshape_and_cache, token-major caches for reshape_and_cache_flash.
// A negative slot is padding and is skipped. "auto" copies the elements bit for bit; fp8 stores
// fp8(x / scale) with core/fp8.h's saturating encode (bit-exact with torch's clamp + cast).
//
// Each (token, head) row of head_size elements is written as the layout's contiguous runs of
// `chunk` elements (a whole row for token-major caches, x for vLLM's K, 1 for vLLM's V), with
// the element conversion a template argument: no per-element division or dispatch (the
// element-at-a-time version wrote 0.5 GB/s, 15x below torch's index_copy_).
#include <ATen/Parallel.h>

#include <cstdint>

#include "../core/fp8.h"
#include "cache_element.h"
#include "paged_attention_cpu.h"
#include "threads_per_call.h"

namespace paged_attn {
namespace cpu {
namespace {

// "auto": the query dtype's bits, copied (T: an unsigned integer of the element's size).
template <typename T>
struct BitCopy {
  using storage = T;
  using cache_storage = T;
  T operator()(T v) const { return v; }
};

// fp8: fp8(decode(x) / scale), saturating. Tag: the query dtype (cache_element.h).
template <typename Tag, uint8_t (*kEncode)(float)>
struct Fp8Encode {
  using storage = typename Tag::storage;
  using cache_storage = uint8_t;
  float scale;
  uint8_t operator()(storage v) const { return kEncode(Tag::decode(v) / scale); }  // as torch
};

// One (token, head) row: src[0, D) -> the layout's runs starting at dst (the slot's element 0).
template <typename Convert>
inline void write_row(const Convert& convert, const typename Convert::storage* src,
                      typename Convert::cache_storage* dst, const KvLayout& layout, int D) {
  const int64_t chunk = layout.chunk;
  for (int64_t c = 0; c < D / chunk; ++c, src += chunk, dst += layout.chunk_stride)
    for (int64_t i = 0; i < chunk; ++i) dst[i] = convert(src[i]);
}

template <typename Convert>
void write_tokens(const ReshapeAndCacheParams& p, const Convert& key_convert,
                  const Convert& value_convert, int64_t min_bytes) {
  using Src = typename Convert::storage;
  using Dst = typename Convert::cache_storage;
  const auto* key = static_cast<const Src*>(p.key);
  const auto* value = static_cast<const Src*>(p.value);
  auto* key_cache = static_cast<Dst*>(p.key_cache);
  auto* value_cache = static_cast<Dst*>(p.value_cache);
  const int D = p.head_size, bs = p.block_size;
  const int64_t bytes = 2 * p.num_tokens * p.num_kv_heads * p.head_size *
                        cache_element_bytes(p.scalar_kind, p.cache_kind);  // K and V written
  const int64_t grain = items_per_thread(p.num_tokens, bytes, min_bytes);
  at::parallel_for(0, p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slot_mapping[t];
      if (slot < 0) continue;  // padding
      const int64_t block = slot / bs, offset = slot % bs;
      for (int h = 0; h < p.num_kv_heads; ++h) {  // NOTE: 64-bit offsets
        write_row(key_convert, key + t * p.key_token_stride + h * p.key_head_stride,
                  key_cache + p.k_layout.offset(block, offset, h, 0), p.k_layout, D);
        write_row(value_convert, value + t * p.value_token_stride + h * p.value_head_stride,
                  value_cache + p.v_layout.offset(block, offset, h, 0), p.v_layout, D);
      }
    }
  });
}

template <typename Tag>
void write_fp8(const ReshapeAndCacheParams& p, float k_scale, float v_scale, int64_t min_bytes) {
  if (p.cache_kind == CacheKind::kFp8E4M3) {
    using E = Fp8Encode<Tag, fp8::float_to_e4m3>;
    return write_tokens(p, E{k_scale}, E{v_scale}, min_bytes);
  }
  using E = Fp8Encode<Tag, fp8::float_to_e5m2>;
  write_tokens(p, E{k_scale}, E{v_scale}, min_bytes);
}

}  // namespace

void reshape_and_cache(const ReshapeAndCacheParams& p, int64_t min_bytes_per_thread) {
  if (p.cache_kind == CacheKind::kAuto) {
    if (scalar_bytes(p.scalar_kind) == 4)
      return write_tokens(p, BitCopy<uint32_t>{}, BitCopy<uint32_t>{}, min_bytes_per_thread);
    return write_tokens(p, BitCopy<uint16_t>{}, BitCopy<uint16_t>{}, min_bytes_per_thread);
  }
  const float k_scale = p.k_scale_ptr != nullptr ? *p.k_scale_ptr : p.k_scale;
  const float v_scale = p.v_scale_ptr != nullptr ? *p.v_scale_ptr : p.v_scale;
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: return write_fp8<F32>(p, k_scale, v_scale, min_bytes_per_thread);
    case ScalarKind::kFloat16: return write_fp8<F16>(p, k_scale, v_scale, min_bytes_per_thread);
    case ScalarKind::kBFloat16: return write_fp8<BF16>(p, k_scale, v_scale, min_bytes_per_thread);
  }
}

}  // namespace cpu
}  // namespace paged_attn
