// isa_avx2.cpp — the AVX2 + FMA + F16C vector layer of the CPU kernel, variant "avx2-fma" (AMD
// Zen 1-3, Intel Haswell and later client CPUs: x86-64 CPUs without AVX-512). The 16-lane Vec is
// two __m256; the Mask a lane range (AVX2 has no mask registers: a full range takes the plain
// load, a partial one goes through a zeroed 16-element buffer).
// The algorithm is partition_kernel.h; this file only supplies primitives (contract there).
#include "kernel_common.h"
#include "x86_f16c.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

// Everything below is compiled for AVX2 + FMA + F16C and runs only after cpu_supports().
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace paged_attn {
namespace cpu {
namespace avx2 {

struct Vec16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};

// 8 fp16 bit patterns (an __m128i) -> 8 floats
PA_DECODE_INLINE __m256 half8(__m128i h) { return _mm256_cvtph_ps(h); }

// e4m3fn bytes S.EEEE.MMM, zero-extended to 16 bits -> fp16 bits S.0EEEE.MMM0000000: the value
// * 2^-8, subnormals included (vcvtph2ps converts them exactly and ignores DAZ). The NaN code
// S.1111.111 would land on 1.875 * 2^-8; OR-ing in an all-ones exponent keeps it NaN through
// the conversion. Integer ops only, before the conversion: a NaN blend after it would cost a
// sign-extension and a blend per 8 floats.
PA_DECODE_INLINE __m128i e4m3_half_bits(__m128i w) {
  const __m128i t = _mm_slli_epi16(w, 7);  // EEEE.MMM at bits 7-13, S at bit 14
  const __m128i h = _mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000)));  // S to bit 15
  const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), _mm_set1_epi16(0x7F));
  return _mm_or_si128(h, _mm_and_si128(nan, _mm_set1_epi16(0x7C00)));
}
PA_DECODE_INLINE __m256i e4m3_half_bits(__m256i w) {  // the same, 16 at a time
  const __m256i t = _mm256_slli_epi16(w, 7);
  const __m256i h = _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));
  const __m256i nan =
      _mm256_cmpeq_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
  return _mm256_or_si256(h, _mm256_and_si256(nan, _mm256_set1_epi16(0x7C00)));
}

// 8 e4m3fn bytes (low half of an __m128i) -> 8 floats (times 256 in fp32 is exact).
PA_DECODE_INLINE __m256 e4m3x8(__m128i bytes) {
  const __m128i h = e4m3_half_bits(_mm_cvtepu8_epi16(bytes));
  return _mm256_mul_ps(half8(h), _mm256_set1_ps(256.0f));
}

// 16 e4m3fn bytes -> 16 floats: the integer steps once on a ymm instead of twice on an xmm.
PA_DECODE_INLINE Vec16 e4m3x16(__m128i bytes) {
  const __m256i h = e4m3_half_bits(_mm256_cvtepu8_epi16(bytes));
  const __m256 k256 = _mm256_set1_ps(256.0f);
  return {_mm256_mul_ps(half8(_mm256_castsi256_si128(h)), k256),
          _mm256_mul_ps(half8(_mm256_extracti128_si256(h, 1)), k256)};
}

// exp(x) for x <= 0: exp_poly's range reduction and polynomial, times 2^n built in the
// exponent bits. x < -87.3 (below the smallest normal) gives exactly 0; NaN stays NaN.
inline __m256 exp8(__m256 x) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_NLT_UQ);  // NaN: kept
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);  // this operand order keeps NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(exp_poly::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(exp_poly::kLn2Lo), r);
  __m256 y = _mm256_set1_ps(exp_poly::kCoef[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(exp_poly::kCoef[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i pow2n = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);  // n >= -126
  return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(pow2n)), keep);
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

inline float hmax8(__m256 v) {
  const __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(t, _mm_movehdup_ps(t)));
}

// x = 4 forms of tokens 0-3 (a) and 4-7 (b) -> the 8 token sums in order.
inline __m256 sum_x4_half(Vec16 a, Vec16 b) {
  // hadd(hadd(a.lo, a.hi), hadd(b.lo, b.hi)) holds [t0 t2 t4 t6 | t1 t3 t5 t7]
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a.lo, a.hi), _mm256_hadd_ps(b.lo, b.hi));
  return _mm256_permutevar8x32_ps(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

struct Isa : EightVecTiles {  // 16 ymm: 8 Vec
  using Vec = Vec16;
  using Mask = LaneRange;
  static constexpr bool kHasBf16Dot = false;
  // QK of a GQA group of 6 (Qwen-like) in one tile: 6 x 2 accumulators (two tokens a Vec), the K
  // Vec and the q row: 15 of 16 ymm, each K vector widened once for all six heads. Measured
  // 3.5-8% less CPU time than two tiles of three (in cache, fp32 / fp16 / bf16 / fp8, both forms).
  static constexpr int kQkHeads = 6;
  // vLLM's layout's PV: an accumulator is one ymm (pv_fmadd folds a Vec's two halves into lo;
  // hi stays 0), so the probabilities fit in registers: gt * pv_rows + 2 gt + 2 (V row) ymm,
  // 12-14 of 16. Loads per FMA: (2 gt + 2 pv_rows) / (2 gt pv_rows), 0.75-0.83 for gt >= 2,
  // against 1.33 with the probabilities re-read as FMA operands (Zen 4: 2 ymm loads a cycle).
  // e4m3: one tile of 4 heads, one V row a pass (4 + 8 + 2 ymm), so each row is decoded once
  // for 4 heads instead of once per tile of 2: 10% less CPU time at GQA 4, 5% at 8 (in cache;
  // e5m2, bf16 and fp32 were 1-23% slower so).
  static constexpr int kE4m3RowPvHeads = 4;
  static constexpr int pv_rows(int gt, bool wide) {
    return gt == 1 ? (wide ? 8 : 4) : gt == 2 ? 4 : gt == 4 ? 1 : 2;
  }
  static constexpr bool kRowProbsInRegisters = true;
  // Token-major PV: tiles of six heads while six or more remain (token_pv_tile_heads), one Vec
  // of 16 dims a pass from four heads up: 6 x 2 accumulators, the V Vec, one probability
  // broadcast at a time and the bf16 shuffle mask, 16 ymm. Each V vector is then loaded and
  // widened once for six heads (for three before). In cache, forced on the Intel Xeon: bf16 5-10%
  // less time at GQA 4, 6, 8, 12 and 16; fp32 0-6% (docs/CPU_KERNEL.md).
  static constexpr int kTokenPvHeads = 6;
  static constexpr bool kTokenPvSixes = true;
  static constexpr int pv_vecs(int gt, bool /*wide*/) { return gt == 1 ? 4 : gt >= 4 ? 1 : 2; }

  static Mask lanes(int lo, int hi) { return lane_range(lo, hi); }
  static Vec zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Vec set1(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static Vec add(Vec a, Vec b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static Vec sub(Vec a, Vec b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static Vec mul(Vec a, Vec b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static Vec fmadd(Vec a, Vec b, Vec c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static Vec pv_fmadd(Vec v, Vec p, Vec acc) {
    return {_mm256_fmadd_ps(v.hi, p.hi, _mm256_fmadd_ps(v.lo, p.lo, acc.lo)), acc.hi};
  }
  static Vec loadu(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static Vec load(const float* p, Mask m) {
    if (m.full()) return loadu(p);
    alignas(32) float tmp[16];
    copy_lanes(tmp, p, m);
    return loadu(tmp);
  }
  static Vec load_or(const float* p, Mask m, float fill) {
    if (m.full()) return loadu(p);
    alignas(32) float tmp[16];
    std::fill(tmp, tmp + 16, fill);
    if (!m.empty()) std::memcpy(tmp + m.lo, p + m.lo, (m.hi - m.lo) * sizeof(float));
    return loadu(tmp);
  }
  static void store(float* p, Vec v, Mask m) {
    if (m.full()) {
      _mm256_storeu_ps(p, v.lo);
      _mm256_storeu_ps(p + 8, v.hi);
      return;
    }
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, v.lo);
    _mm256_store_ps(tmp + 8, v.hi);
    if (!m.empty()) std::memcpy(p + m.lo, tmp + m.lo, (m.hi - m.lo) * sizeof(float));
  }
  static Vec select(Mask m, Vec v) {
    if (m.full()) return v;
    const __m256i lo = _mm256_set1_epi32(m.lo - 1), hi = _mm256_set1_epi32(m.hi);
    const __m256i i0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i i1 = _mm256_add_epi32(i0, _mm256_set1_epi32(8));
    const __m256i k0 = _mm256_and_si256(_mm256_cmpgt_epi32(i0, lo), _mm256_cmpgt_epi32(hi, i0));
    const __m256i k1 = _mm256_and_si256(_mm256_cmpgt_epi32(i1, lo), _mm256_cmpgt_epi32(hi, i1));
    return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(k0)),
            _mm256_and_ps(v.hi, _mm256_castsi256_ps(k1))};
  }
  static float reduce_add(Vec v) { return hsum8(_mm256_add_ps(v.lo, v.hi)); }
  static float reduce_max(Vec v) { return hmax8(_mm256_max_ps(v.lo, v.hi)); }
  static void reduce4(Vec a, Vec b, Vec c, Vec d, float scale, float* out) {
    const __m256 ab = _mm256_hadd_ps(_mm256_add_ps(a.lo, a.hi), _mm256_add_ps(b.lo, b.hi));
    const __m256 cd = _mm256_hadd_ps(_mm256_add_ps(c.lo, c.hi), _mm256_add_ps(d.lo, d.hi));
    const __m256 h = _mm256_hadd_ps(ab, cd);  // [a b c d | a b c d] partial sums
    const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(out, _mm_mul_ps(sums, _mm_set1_ps(scale)));
  }

  // 8 cache elements, all readable.
  template <typename Cache>
  static PA_DECODE_INLINE __m256 load8_full(const typename Cache::storage* p) {
    if constexpr (std::is_same_v<Cache, F32>) {
      return _mm256_loadu_ps(p);
    } else if constexpr (std::is_same_v<Cache, F16>) {
      return half8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else if constexpr (std::is_base_of_v<BF16, Cache>) {  // bf16 bits are fp32's top half
      // The 16 bytes in both 128-bit lanes (a broadcast load: no ALU operation), then one byte
      // shuffle moves elements 0-3 / 4-7 into the top halves of lanes 0-3 / 4-7 and zeroes the
      // rest: one shuffle per 8 elements, where a zero-extending load and a shift took two (the
      // shift on the FMA ports of Intel cores; measured: docs/CPU_KERNEL.md).
      const __m256i both = _mm256_broadcastsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
      const __m256i to_top_half = _mm256_setr_epi8(  // -1: a zero byte
          -1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
          -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
      return _mm256_castsi256_ps(_mm256_shuffle_epi8(both, to_top_half));
    } else if constexpr (std::is_same_v<Cache, E5M2>) {  // an e5m2 byte is an fp16's top byte
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
      return half8(_mm_slli_epi16(_mm_cvtepu8_epi16(bytes), 8));
    } else {
      static_assert(std::is_same_v<Cache, E4M3>);
      return e4m3x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    }
  }
  // 16 cache elements, all readable.
  template <typename Cache>
  static PA_DECODE_INLINE Vec load_cache_full(const typename Cache::storage* p) {
    if constexpr (std::is_same_v<Cache, E4M3>) {
      return e4m3x16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    } else {
      return {load8_full<Cache>(p), load8_full<Cache>(p + 8)};
    }
  }
  template <typename Cache>
  static Vec load_cache(const typename Cache::storage* p, Mask m) {
    if (m.full()) return load_cache_full<Cache>(p);
    alignas(32) typename Cache::storage tmp[16];
    copy_lanes(tmp, p, m);
    return load_cache_full<Cache>(tmp);
  }
  template <typename Cache>
  static PA_DECODE_INLINE Vec load_token_pair(const typename Cache::storage* p, int64_t stride,
                                             int ntok, int dims) {
    if constexpr (std::is_same_v<Cache, E4M3>) {  // both tokens' bytes in one xmm: one decode
      if (dims == 8 && ntok == 2) {
        const __m128i t0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        const __m128i t1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride));
        return e4m3x16(_mm_unpacklo_epi64(t0, t1));
      }
    }
    if (dims == 8 && ntok == 2) return {load8_full<Cache>(p), load8_full<Cache>(p + stride)};
    if (dims == 8 && ntok == 1) return {load8_full<Cache>(p), _mm256_setzero_ps()};
    alignas(32) typename Cache::storage tmp[16];
    copy_token_pair(tmp, p, stride, ntok, dims);
    return load_cache_full<Cache>(tmp);
  }

  static Vec exp(Vec x) { return {exp8(x.lo), exp8(x.hi)}; }

  template <int X>
  static Vec q_row(const float* q) {
    if constexpr (X == 4) {
      const __m256 v = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(q));
      return {v, v};
    } else if constexpr (X == 8) {
      // One load into a register for both halves: left alone, the compilers fold the load into
      // each half's FMAs, two loads of the same row per head (measured: docs/CPU_KERNEL.md).
      __m256 v = _mm256_loadu_ps(q);
      asm("" : "+x"(v));  // an opaque value: the load can no longer be folded
      return {v, v};
    } else {
      return loadu(q);
    }
  }

  // x = 16 pair: a = token 0, b = token 1 -> x = 8 form [t0 | t1].
  static Vec fold16(Vec a, Vec b) { return {_mm256_add_ps(a.lo, a.hi), _mm256_add_ps(b.lo, b.hi)}; }
  // x = 8 pair: a = [t0 | t1], b = [t2 | t3] -> x = 4 form [t0 t1 t2 t3].
  static Vec fold8(Vec a, Vec b) {
    return {_mm256_add_ps(_mm256_permute2f128_ps(a.lo, a.hi, 0x20),
                          _mm256_permute2f128_ps(a.lo, a.hi, 0x31)),
            _mm256_add_ps(_mm256_permute2f128_ps(b.lo, b.hi, 0x20),
                          _mm256_permute2f128_ps(b.lo, b.hi, 0x31))};
  }
  // x = 4 forms of tokens 0-3, 4-7, 8-11, 12-15 -> the 16 token sums in token order.
  static Vec sum_x4(Vec a, Vec b, Vec c, Vec d) { return {sum_x4_half(a, b), sum_x4_half(c, d)}; }
};

}  // namespace avx2
}  // namespace cpu
}  // namespace paged_attn

#define PA_ISA avx2
#include "partition_kernel.h"
#undef PA_ISA

PA_DEFINE_ENTRY_POINT(avx2, avx2, /*bf16_dot=*/false)

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace paged_attn {
namespace cpu {
namespace avx2 {

bool cpu_supports() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         x86_has_f16c();
}

}  // namespace avx2
}  // namespace cpu
}  // namespace paged_attn

#endif  // x86-64
