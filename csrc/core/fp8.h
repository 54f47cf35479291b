// fp8.h — float8_e4m3fn and float8_e5m2 bytes <-> float, host and device, no torch header.
//
// Decode is exact (every fp8 value is a float). Encode is the saturating round-to-nearest-even
// that torch computes for `x.clamp(-max, max).to(torch.float8_e4m3fn / float8_e5m2)`:
//   - NaN stays NaN (e4m3fn: 0x7F | sign; e5m2: 0x7F | sign, both "all ones" NaN patterns),
//   - +-inf and |x| > max saturate to +-max (448 for e4m3fn, 57344 for e5m2),
//   - everything else rounds to nearest, ties to even, subnormals included.
// The rounding is done on the integer bits (no float arithmetic), so it does not depend on the
// FPU's flush-to-zero / denormals-are-zero modes. tests/test_fp8.py checks all 256 decodes and
// many encodes bit for bit against torch.
//
// Formats: e4m3fn = 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity, NaN = S.1111.111.
//          e5m2   = 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like (inf, NaN), i.e.
//                   the top byte of an fp16.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace paged_attn {
namespace fp8 {

PA_HOST_DEVICE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __uint_as_float(u);
#else
  union {
    uint32_t u;
    float f;
  } c;
  c.u = u;
  return c.f;
#endif
}

PA_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  return __float_as_uint(f);
#else
  union {
    uint32_t u;
    float f;
  } c;
  c.f = f;
  return c.u;
#endif
}

// Decode a small float with E exponent bits (bias B) and M mantissa bits. `ieee_specials`:
// the all-ones exponent means inf (mantissa 0) / NaN (e5m2); otherwise only the all-ones
// pattern is NaN and there is no infinity (e4m3fn).
template <int E, int M, int B>
PA_HOST_DEVICE float decode_small_float(uint8_t byte, bool ieee_specials) {
  const uint32_t sign = static_cast<uint32_t>(byte >> 7) << 31;
  const uint32_t exp = (byte >> M) & ((1u << E) - 1u);
  const uint32_t man = byte & ((1u << M) - 1u);
  uint32_t bits;
  if (ieee_specials && exp == (1u << E) - 1u) {
    bits = man == 0 ? 0x7F800000u : 0x7FC00000u;  // inf / NaN
  } else if (!ieee_specials && exp == (1u << E) - 1u && man == (1u << M) - 1u) {
    bits = 0x7FC00000u;  // NaN (e4m3fn has no infinity)
  } else if (exp == 0) {
    // subnormal: man * 2^(1 - B - M), exact as a float product by a power of two
    const float unit = bits_to_float(static_cast<uint32_t>(127 + 1 - B - M) << 23);
    const float mag = static_cast<float>(man) * unit;
    return sign ? -mag : mag;
  } else {
    bits = ((exp + 127u - B) << 23) | (man << (23 - M));
  }
  return bits_to_float(sign | bits);
}

PA_HOST_DEVICE float e4m3_to_float(uint8_t byte) { return decode_small_float<4, 3, 7>(byte, false); }
PA_HOST_DEVICE float e5m2_to_float(uint8_t byte) { return decode_small_float<5, 2, 15>(byte, true); }

// Round |x| (given as float bits without sign, not NaN, at most the format's max) to the format
// with M mantissa bits and bias B, nearest-even. Returns the code without the sign bit.
template <int M, int B>
PA_HOST_DEVICE uint32_t round_magnitude(uint32_t a) {
  const int min_normal_exp = 1 - B;  // unbiased
  const int fexp = static_cast<int>(a >> 23);  // biased float exponent (0: float subnormal)
  if (fexp - 127 >= min_normal_exp) {
    // normal in the target: drop 23 - M mantissa bits with RNE, then rebias the exponent.
    const int shift = 23 - M;
    uint32_t r = a >> shift;
    const uint32_t rem = a & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;  // a carry into the exponent is correct
    return r - (static_cast<uint32_t>(127 - B) << M);
  }
  // subnormal in the target: the value in units of the smallest subnormal 2^(1 - B - M) is
  // mant * 2^(fexp - 150 - (1 - B - M)); shift right with RNE.
  uint32_t mant = a & 0x7FFFFFu;
  int e = fexp;
  if (e == 0) {
    e = 1;  // float subnormal
  } else {
    mant |= 0x800000u;
  }
  const int shift = (1 - B - M) + 150 - e;  // >= 1 here
  if (shift > 25) return 0u;                // below half the smallest subnormal
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;  // may round up to the smallest normal
  return r;
}

// float -> e4m3fn byte, saturating to +-448; NaN -> 0x7F | sign.
PA_HOST_DEVICE uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);  // NaN
  if (a >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);  // >= 448 (inf too): max
  return static_cast<uint8_t>(sign | round_magnitude<3, 7>(a));
}

// float -> e5m2 byte, saturating to +-57344; NaN -> 0x7F | sign.
PA_HOST_DEVICE uint8_t float_to_e5m2(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint8_t>(sign | 0x7Fu);  // NaN
  if (a >= 0x47600000u) return static_cast<uint8_t>(sign | 0x7Bu);  // >= 57344 (inf too): max
  return static_cast<uint8_t>(sign | round_magnitude<2, 15>(a));
}

}  // namespace fp8
}  // namespace paged_attn
