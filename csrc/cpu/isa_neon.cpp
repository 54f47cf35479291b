// isa_neon.cpp — the aarch64 NEON (Advanced SIMD) vector layer of the CPU kernel, variant "neon"
// (Graviton, Ampere, Apple silicon, every 64-bit ARM server). The 16-lane Vec is four
// float32x4_t; the Mask a lane range (partial ranges go through a zeroed 16-element buffer).
// NEON and fp16 conversion are part of the aarch64 baseline: no target pragma is needed.
// The algorithm is partition_kernel.h; this file only supplies primitives (contract there).
#include "kernel_common.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

namespace paged_attn {
namespace cpu {
namespace neon {

struct Vec16 {
  float32x4_t v[4];  // lanes 0-3, 4-7, 8-11, 12-15
};

// 8 fp16 bit patterns -> lanes of two float32x4_t
PA_DECODE_INLINE void half8(uint16x8_t h, float32x4_t* out) {
  out[0] = vcvt_f32_f16(vreinterpret_f16_u16(vget_low_u16(h)));
  out[1] = vcvt_f32_f16(vreinterpret_f16_u16(vget_high_u16(h)));
}

// 8 e4m3fn bytes -> 8 floats: S.EEEE.MMM -> fp16 S.0EEEE.MMM0000000 is the value * 2^-8
// (subnormals included); times 256 in fp32 is exact. The NaN code S.1111.111 would land on a
// finite fp16: an all-ones exponent OR-ed into those lanes before the conversion keeps it NaN
// (cheaper than widening the compare and selecting per 4 floats after it).
PA_DECODE_INLINE void e4m3x8(uint8x8_t bytes, float32x4_t* out) {
  const uint16x8_t w = vmovl_u8(bytes);
  const uint16x8_t t = vshlq_n_u16(w, 7);  // EEEE.MMM at bits 7-13, S at bit 14
  const uint16x8_t h = vaddq_u16(t, vandq_u16(t, vdupq_n_u16(0x4000)));  // S to bit 15
  const uint16x8_t nan = vceqq_u16(vandq_u16(w, vdupq_n_u16(0x7F)), vdupq_n_u16(0x7F));
  half8(vorrq_u16(h, vandq_u16(nan, vdupq_n_u16(0x7C00))), out);
  const float32x4_t k256 = vdupq_n_f32(256.0f);
  out[0] = vmulq_f32(out[0], k256);
  out[1] = vmulq_f32(out[1], k256);
}

// exp(x) for x <= 0: exp_poly's range reduction and polynomial, times 2^n built in the
// exponent bits. x < -87.3 (below the smallest normal) gives exactly 0; NaN stays NaN.
inline float32x4_t exp4(float32x4_t x) {
  const uint32x4_t drop = vcltq_f32(x, vdupq_n_f32(-87.3f));  // false for NaN
  x = vmaxq_f32(x, vdupq_n_f32(-87.3f));                      // NaN propagates
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(exp_poly::kLog2e)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(exp_poly::kLn2Hi));
  r = vfmsq_f32(r, n, vdupq_n_f32(exp_poly::kLn2Lo));
  float32x4_t y = vdupq_n_f32(exp_poly::kCoef[0]);
  for (int i = 1; i < 6; ++i) y = vfmaq_f32(vdupq_n_f32(exp_poly::kCoef[i]), y, r);
  y = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), y, vmulq_f32(r, r));
  const int32x4_t pow2n = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  const float32x4_t e = vmulq_f32(y, vreinterpretq_f32_s32(pow2n));
  return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(e), drop));
}

struct Isa : EightVecTiles {  // 16 ymm / 32 q registers: 8 Vec
  using Vec = Vec16;
  using Mask = LaneRange;
  static constexpr bool kHasBf16Dot = false;

  static Mask lanes(int lo, int hi) { return lane_range(lo, hi); }
  static Vec set1(float x) {
    const float32x4_t v = vdupq_n_f32(x);
    return {{v, v, v, v}};
  }
  static Vec zero() { return set1(0.0f); }
  static Vec add(Vec a, Vec b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vaddq_f32(a.v[i], b.v[i]);
    return a;
  }
  static Vec sub(Vec a, Vec b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vsubq_f32(a.v[i], b.v[i]);
    return a;
  }
  static Vec mul(Vec a, Vec b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vmulq_f32(a.v[i], b.v[i]);
    return a;
  }
  static Vec max(Vec a, Vec b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vmaxq_f32(a.v[i], b.v[i]);  // NaN propagates
    return a;
  }
  static Vec fmadd(Vec a, Vec b, Vec c) {
    for (int i = 0; i < 4; ++i) c.v[i] = vfmaq_f32(c.v[i], a.v[i], b.v[i]);
    return c;
  }
  static Vec pv_fmadd(Vec v, Vec p, Vec acc) { return fmadd(v, p, acc); }
  static Vec loadu(const float* p) {
    return {{vld1q_f32(p), vld1q_f32(p + 4), vld1q_f32(p + 8), vld1q_f32(p + 12)}};
  }
  static Vec load(const float* p, Mask m) {
    if (m.full()) return loadu(p);
    float tmp[16];
    copy_lanes(tmp, p, m);
    return loadu(tmp);
  }
  static Vec load_or(const float* p, Mask m, float fill) {
    if (m.full()) return loadu(p);
    float tmp[16];
    std::fill(tmp, tmp + 16, fill);
    if (!m.empty()) std::memcpy(tmp + m.lo, p + m.lo, (m.hi - m.lo) * sizeof(float));
    return loadu(tmp);
  }
  static void store(float* p, const Vec& v, Mask m) {
    if (m.full()) {
      for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, v.v[i]);
      return;
    }
    float tmp[16];
    for (int i = 0; i < 4; ++i) vst1q_f32(tmp + 4 * i, v.v[i]);
    if (!m.empty()) std::memcpy(p + m.lo, tmp + m.lo, (m.hi - m.lo) * sizeof(float));
  }
  static Vec select(Mask m, Vec v) {
    if (m.full()) return v;
    for (int i = 0; i < 4; ++i) {
      const int32x4_t idx = vaddq_s32(vld1q_s32(kIota), vdupq_n_s32(4 * i));
      const uint32x4_t keep =
          vandq_u32(vcgeq_s32(idx, vdupq_n_s32(m.lo)), vcltq_s32(idx, vdupq_n_s32(m.hi)));
      v.v[i] = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v.v[i]), keep));
    }
    return v;
  }
  static float reduce_add(const Vec& v) {
    return vaddvq_f32(vaddq_f32(vaddq_f32(v.v[0], v.v[1]), vaddq_f32(v.v[2], v.v[3])));
  }
  static float reduce_max(const Vec& v) {
    return vmaxvq_f32(vmaxq_f32(vmaxq_f32(v.v[0], v.v[1]), vmaxq_f32(v.v[2], v.v[3])));
  }
  static float32x4_t sum4(const Vec& a) {  // the 4 quarters of a, added
    return vaddq_f32(vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3]));
  }
  static void reduce4(const Vec& a, const Vec& b, const Vec& c, const Vec& d, float scale,
                      float* out) {
    const float32x4_t s = vpaddq_f32(vpaddq_f32(sum4(a), sum4(b)), vpaddq_f32(sum4(c), sum4(d)));
    vst1q_f32(out, vmulq_n_f32(s, scale));
  }

  // 8 cache elements, all readable, into out[0], out[1].
  template <typename Cache>
  static PA_DECODE_INLINE void load8_full(const typename Cache::storage* p, float32x4_t* out) {
    if constexpr (std::is_same_v<Cache, F32>) {
      out[0] = vld1q_f32(p);
      out[1] = vld1q_f32(p + 4);
    } else if constexpr (std::is_same_v<Cache, F16>) {
      half8(vld1q_u16(p), out);
    } else if constexpr (std::is_base_of_v<BF16, Cache>) {  // bf16 bits are fp32's top half
      const uint16x8_t a = vld1q_u16(p);
      out[0] = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(a), 16));
      out[1] = vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(a), 16));
    } else if constexpr (std::is_same_v<Cache, E5M2>) {  // an e5m2 byte is an fp16's top byte
      half8(vshll_n_u8(vld1_u8(p), 8), out);
    } else {
      static_assert(std::is_same_v<Cache, E4M3>);
      e4m3x8(vld1_u8(p), out);
    }
  }
  // 16 cache elements, all readable.
  template <typename Cache>
  static PA_DECODE_INLINE Vec load_cache_full(const typename Cache::storage* p) {
    Vec r;
    load8_full<Cache>(p, r.v);
    load8_full<Cache>(p + 8, r.v + 2);
    return r;
  }
  template <typename Cache>
  static Vec load_cache(const typename Cache::storage* p, Mask m) {
    if (m.full()) return load_cache_full<Cache>(p);
    typename Cache::storage tmp[16];
    copy_lanes(tmp, p, m);
    return load_cache_full<Cache>(tmp);
  }
  template <typename Cache>
  static PA_DECODE_INLINE Vec load_token_pair(const typename Cache::storage* p, int64_t stride,
                                             int ntok, int dims) {
    if (dims == 8 && ntok >= 1) {
      Vec r = zero();
      load8_full<Cache>(p, r.v);
      if (ntok == 2) load8_full<Cache>(p + stride, r.v + 2);
      return r;
    }
    typename Cache::storage tmp[16];
    copy_token_pair(tmp, p, stride, ntok, dims);
    return load_cache_full<Cache>(tmp);
  }

  static Vec exp(Vec x) {
    for (int i = 0; i < 4; ++i) x.v[i] = exp4(x.v[i]);
    return x;
  }

  template <int X>
  static Vec q_row(const float* q) {
    if constexpr (X == 4) {
      const float32x4_t a = vld1q_f32(q);
      return {{a, a, a, a}};
    } else if constexpr (X == 8) {
      const float32x4_t a = vld1q_f32(q), b = vld1q_f32(q + 4);
      return {{a, b, a, b}};
    } else {
      return loadu(q);
    }
  }
  // x = 16 pair: a = token 0, b = token 1 -> x = 8 form [t0 | t1] (lane k: dims k and k + 8).
  static Vec fold16(const Vec& a, const Vec& b) {
    return {{vaddq_f32(a.v[0], a.v[2]), vaddq_f32(a.v[1], a.v[3]), vaddq_f32(b.v[0], b.v[2]),
             vaddq_f32(b.v[1], b.v[3])}};
  }
  // x = 8 pair: a = [t0 | t1], b = [t2 | t3] -> x = 4 form [t0 t1 t2 t3].
  static Vec fold8(const Vec& a, const Vec& b) {
    return {{vaddq_f32(a.v[0], a.v[1]), vaddq_f32(a.v[2], a.v[3]), vaddq_f32(b.v[0], b.v[1]),
             vaddq_f32(b.v[2], b.v[3])}};
  }
  // x = 4 forms of tokens 0-3, 4-7, 8-11, 12-15 -> the 16 token sums in token order.
  static float32x4_t sums4(const Vec& a) {
    return vpaddq_f32(vpaddq_f32(a.v[0], a.v[1]), vpaddq_f32(a.v[2], a.v[3]));
  }
  static Vec sum_x4(const Vec& a, const Vec& b, const Vec& c, const Vec& d) {
    return {{sums4(a), sums4(b), sums4(c), sums4(d)}};
  }

  static constexpr int32_t kIota[4] = {0, 1, 2, 3};
};

}  // namespace neon
}  // namespace cpu
}  // namespace paged_attn

#define PA_ISA neon
#include "partition_kernel.h"
#undef PA_ISA

PA_DEFINE_ENTRY_POINT(neon, neon, /*bf16_dot=*/false)

namespace paged_attn {
namespace cpu {
namespace neon {

// HWCAP_ASIMD (bit 1 of AT_HWCAP) on Linux; Advanced SIMD is part of every other aarch64 ABI.
bool cpu_supports() {
#if defined(__linux__)
  return (getauxval(AT_HWCAP) & (1UL << 1)) != 0;
#else
  return true;
#endif
}

}  // namespace neon
}  // namespace cpu
}  // namespace paged_attn

#endif  // __aarch64__
