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

// Round |x| (given as float bits without sign, not NaN, below the format's saturation bound) to
// the format with M mantissa bits and bias B, nearest-even. Returns the code without the sign
// bit. Branch-free, so that loops of encodes vectorize (the CPU cache writes):
//   normal in the target (|x| >= 2^(1 - B)): integer round-to-nearest-even on the float's bits
//     (add half a target ulp minus one, plus the lowest kept bit; a carry into the exponent is
//     correct), then rebias the exponent;
//   below: |x| + 2^(23 + 1 - B - M) in fp32 rounds |x| to a multiple of the smallest subnormal
//     2^(1 - B - M), to nearest-even by the FPU, and the sum's bits minus the constant's count
//     those units: the subnormal code (2^M units, the smallest normal, is its code too).
template <int M, int B>
PA_HOST_DEVICE uint32_t round_magnitude(uint32_t a) {
  constexpr int kShift = 23 - M;
  const uint32_t normal = ((a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift) -
                          (static_cast<uint32_t>(127 - B) << M);
  constexpr uint32_t kUnitsBias = static_cast<uint32_t>(127 + 23 + 1 - B - M) << 23;
  const uint32_t subnormal =
      float_to_bits(bits_to_float(a) + bits_to_float(kUnitsBias)) - kUnitsBias;
  return a >= (static_cast<uint32_t>(127 + 1 - B) << 23) ? normal : subnormal;
}

// float -> e4m3fn byte, saturating to +-448; NaN -> 0x7F | sign.
PA_HOST_DEVICE uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t code = a > 0x7F800000u   ? 0x7Fu                       // NaN
                        : a >= 0x43E00000u ? 0x7Eu                      // >= 448 (inf too): max
                                           : round_magnitude<3, 7>(a);
  return static_cast<uint8_t>(sign | code);
}

// float -> e5m2 byte, saturating to +-57344; NaN -> 0x7F | sign.
PA_HOST_DEVICE uint8_t float_to_e5m2(float x) {
  const uint32_t u = float_to_bits(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7FFFFFFFu;
  const uint32_t code = a > 0x7F800000u   ? 0x7Fu                       // NaN
                        : a >= 0x47600000u ? 0x7Bu                      // >= 57344 (inf too): max
                                           : round_magnitude<2, 15>(a);
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8
}  // namespace paged_attn
