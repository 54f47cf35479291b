// reshape_and_cache_cpu.cpp — CPU reshape_and_cache and reshape_and_cache_flash: token i's
// key / value [num_kv_heads, head_size] go to slot slot_mapping[i] = block * block_size + offset
// of the caches, wherever the params' layouts (core/kv_layout.h) put (block, offset, head, dim):
// vLLM's K / V for reshape_and_cache, token-major caches for reshape_and_cache_flash.
// A negative slot is padding and is skipped. "auto" copies the elements bit for bit; fp8 stores
// fp8(x / scale) with core/fp8.h's saturating encode (bit-exact with torch's clamp + cast).
#include <ATen/Parallel.h>

#include <cstring>

#include "../core/fp8.h"
#include "cache_element.h"
#include "paged_attention_cpu.h"

namespace paged_attn {
namespace cpu {
namespace {

// Stores element src[src_index] (query dtype) as cache[cache_index] (cache element type).
struct CacheWriter {
  const ReshapeAndCacheParams& p;
  float scale;  // fp8 only

  void write(void* cache, int64_t cache_index, const void* src, int64_t src_index) const {
    if (p.cache_kind == CacheKind::kAuto) {
      const int es = scalar_bytes(p.scalar_kind);
      std::memcpy(static_cast<char*>(cache) + cache_index * es,
                  static_cast<const char*>(src) + src_index * es, es);
      return;
    }
    const float v = scalar_to_float(p.scalar_kind, src, src_index) / scale;  // as torch: x / scale
    static_cast<uint8_t*>(cache)[cache_index] = p.cache_kind == CacheKind::kFp8E4M3
                                                    ? fp8::float_to_e4m3(v)
                                                    : fp8::float_to_e5m2(v);
  }
};

}  // namespace

void reshape_and_cache(const ReshapeAndCacheParams& p) {
  const float k_scale = p.k_scale_ptr != nullptr ? *p.k_scale_ptr : p.k_scale;
  const float v_scale = p.v_scale_ptr != nullptr ? *p.v_scale_ptr : p.v_scale;
  const CacheWriter key_writer{p, k_scale};
  const CacheWriter value_writer{p, v_scale};
  const int D = p.head_size, bs = p.block_size;
  at::parallel_for(0, p.num_tokens, 64, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = p.slot_mapping[t];
      if (slot < 0) continue;  // padding
      const int64_t block = slot / bs, offset = slot % bs;
      for (int h = 0; h < p.num_kv_heads; ++h) {
        const int64_t k_dst = p.k_layout.slice(block, h);  // NOTE: 64-bit
        const int64_t v_dst = p.v_layout.slice(block, h);
        const int64_t k_src = t * p.key_token_stride + h * p.key_head_stride;
        const int64_t v_src = t * p.value_token_stride + h * p.value_head_stride;
        for (int d = 0; d < D; ++d) {
          key_writer.write(p.key_cache, k_dst + p.k_layout.in_slice(offset, d), p.key, k_src + d);
          value_writer.write(p.value_cache, v_dst + p.v_layout.in_slice(offset, d), p.value,
                             v_src + d);
        }
      }
    }
  });
}

}  // namespace cpu
}  // namespace paged_attn
