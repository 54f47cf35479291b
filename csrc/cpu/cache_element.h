// cache_element.h — scalar decode of one KV-cache (or query-dtype) element to float, for every
// cache kind the CPU kernel reads (fp32, fp16, bf16 as raw bits; fp8 e4m3fn / e5m2 bytes via
// core/fp8.h).
// Framework-free. The scale of fp8 caches is applied by the caller.
#pragma once

#include <cstdint>

#include "../core/fp8.h"
#include "../core/params.h"

namespace paged_attn {
namespace cpu {

inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {  // zero / subnormal: man * 2^-24, exact
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  const uint32_t bits = exp == 0x1Fu ? (0x7F800000u | (man << 13))            // inf / NaN
                                     : (((exp + 112u) << 23) | (man << 13));  // normal
  return fp8::bits_to_float(sign | bits);
}

inline float bf16_bits_to_float(uint16_t b) {
  return fp8::bits_to_float(static_cast<uint32_t>(b) << 16);
}

// Storage tags: the element type in memory and how it decodes.
struct F32 {
  using storage = float;
  static float decode(float v) { return v; }
};
struct F16 {
  using storage = uint16_t;
  static float decode(uint16_t v) { return half_bits_to_float(v); }
};
struct BF16 {
  using storage = uint16_t;
  static float decode(uint16_t v) { return bf16_bits_to_float(v); }
};
struct E4M3 {
  using storage = uint8_t;
  static float decode(uint8_t v) { return fp8::e4m3_to_float(v); }
};
struct E5M2 {
  using storage = uint8_t;
  static float decode(uint8_t v) { return fp8::e5m2_to_float(v); }
};

}  // namespace cpu
}  // namespace paged_attn
