// avx512_layer.h — the AVX-512 (F + BW + VL + DQ) vector layer of the CPU kernel (the contract is
// partition_kernel.h's): one __m512 is the 16-lane Vec, __mmask16 the Mask; with AVX512_BF16, the
// bf16 dot-product pieces. Shared by the ISA files built on AVX-512 (isa_avx512.cpp, and any
// layer that adds to it), each of which includes it inside its own target region after defining
// PA_ISA, so that every one gets its own copy compiled for its own ISA.
#pragma once

#ifndef PA_ISA
#error "avx512_layer.h is included by an ISA file that defines PA_ISA"
#endif

// The includer has included kernel_common.h, x86_f16c.h and <immintrin.h> BEFORE its target
// pragma (kernel_common.h says why).

// The bf16 dot-product functions, compiled with AVX512_BF16 too (run only by "avx512-bf16").
#define PA_AVX512_BF16_TARGET "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16"
#define PA_AVX512_BF16 __attribute__((noinline, target(PA_AVX512_BF16_TARGET)))
// A piece of a PA_AVX512_BF16 loop (a call would spill its accumulators).
#define PA_AVX512_BF16_INLINE inline __attribute__((always_inline, target(PA_AVX512_BF16_TARGET)))

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

inline __mmask16 lane_mask(int lo, int hi) {  // lanes [lo, hi) of 16, clamped
  const LaneRange r = lane_range(lo, hi);
  if (r.empty()) return 0;
  return static_cast<__mmask16>(((1u << r.hi) - 1u) & ~((1u << r.lo) - 1u));
}

// [sum(a), sum(b), sum(c), sum(d)]
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 u = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

struct Avx512Layer {
  using Vec = __m512;
  using Mask = __mmask16;

  // Register tiles (32 zmm): QK holds gt * qk_vecs accumulators + qk_vecs K vectors + q;
  // PV gt * pv_rows (pv_vecs) accumulators + gt probabilities + one V row.
  static constexpr int kQkHeads = 6, kRowPvHeads = 6, kTokenPvHeads = 6, kE4m3RowPvHeads = 6;
  // Token-major PV in tiles of six for G = 8: vdpbf16ps's 6 + 2 took 5-11% more time than 4 + 4.
  static constexpr bool kTokenPvSixes = false;
  static constexpr int qk_vecs(int gt) { return gt <= 2 ? 8 : 4; }
  static constexpr int pv_rows(int gt, bool wide) { return wide && gt <= 2 ? 8 : 4; }
  static constexpr int pv_vecs(int gt, bool wide) { return pv_rows(gt, wide); }
  static constexpr bool kRowProbsInRegisters = true, kTokenProbsInRegisters = true;
  static constexpr bool kHasBf16Dot = true;
  static constexpr int kTokenMajorX = 16;  // a q row of 16 dims is one register

  static Mask lanes(int lo, int hi) { return lane_mask(lo, hi); }
  static Vec zero() { return _mm512_setzero_ps(); }
  static Vec set1(float v) { return _mm512_set1_ps(v); }
  static Vec add(Vec a, Vec b) { return _mm512_add_ps(a, b); }
  static Vec sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  static Vec mul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
  static Vec max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  static Vec fmadd(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
  static Vec pv_fmadd(Vec v, Vec p, Vec acc) { return fmadd(v, p, acc); }
  static Vec load(const float* p, Mask m) { return _mm512_maskz_loadu_ps(m, p); }
  static Vec load_or(const float* p, Mask m, float fill) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), m, p);
  }
  static void store(float* p, Vec v, Mask m) { _mm512_mask_storeu_ps(p, m, v); }
  static Vec select(Mask m, Vec v) { return _mm512_maskz_mov_ps(m, v); }
  static float reduce_add(Vec v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Vec v) { return _mm512_reduce_max_ps(v); }
  static void reduce4(Vec a, Vec b, Vec c, Vec d, float scale, float* out) {
    _mm_storeu_ps(out, _mm_mul_ps(sum4(a, b, c, d), _mm_set1_ps(scale)));
  }

  template <typename Cache>
  static Vec load_cache(const typename Cache::storage* p, Mask m) {
    if constexpr (std::is_same_v<Cache, F32>) {
      return _mm512_maskz_loadu_ps(m, p);
    } else if constexpr (std::is_same_v<Cache, F16>) {
      return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
    } else if constexpr (std::is_base_of_v<BF16, Cache>) {  // bf16 bits are fp32's top half
      const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
      return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    } else if constexpr (std::is_same_v<Cache, E5M2>) {  // an e5m2 byte is an fp16's top byte
      const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
      return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8));
    } else {
      static_assert(std::is_same_v<Cache, E4M3>);
      // e4m3fn S.EEEE.MMM -> fp16 S.0EEEE.MMM0000000 is the value * 2^-8 (subnormals included,
      // and vcvtph2ps ignores DAZ); times 256 in fp32 is exact. S.1111.111 is NaN.
      const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
      const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
      const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
      const __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), sign);
      const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
      const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
      return _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(NAN));
    }
  }

  template <typename Cache>
  static PA_DECODE_INLINE Vec load_token_pair(const typename Cache::storage* p, int64_t stride,
                                             int ntok, int dims) {
    const Vec a = load_cache<Cache>(p, lane_mask(0, ntok > 0 ? dims : 0));
    const Vec b = load_cache<Cache>(ntok > 1 ? p + stride : p, lane_mask(0, ntok > 1 ? dims : 0));
    return _mm512_insertf32x8(a, _mm512_castps512_ps256(b), 1);
  }

  // exp(x) for x <= 0 (and -inf -> 0, NaN -> NaN): Cephes expf's range reduction and
  // polynomial, scaled by 2^n with vscalefps (handles underflow to 0). Relative error ~1e-7.
  static Vec exp(Vec x) {
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // this operand order keeps NaN
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(exp_poly::kLog2e)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(exp_poly::kLn2Lo), r);
    __m512 y = _mm512_set1_ps(exp_poly::kCoef[0]);
    for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(exp_poly::kCoef[i]));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(y, n);
  }

  // q's X dims of K row c broadcast to the x form.
  template <int X>
  static Vec q_row(const float* q) {
    if constexpr (X == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(q));
    if constexpr (X == 8) return _mm512_broadcast_f32x8(_mm256_loadu_ps(q));
    return _mm512_loadu_ps(q);
  }

  // x = 16 pair: a = token 0, b = token 1 -> x = 8 form [t0 | t1].
  static Vec fold16(Vec a, Vec b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  // x = 8 pair: a = [t0 | t1], b = [t2 | t3] -> x = 4 form [t0 t1 t2 t3].
  static Vec fold8(Vec a, Vec b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
  }
  // x = 4 forms of tokens 0-3, 4-7, 8-11, 12-15 -> the 16 token sums in token order.
  static Vec sum_x4(Vec a, Vec b, Vec c, Vec d) {
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    const __m512 r = _mm512_add_ps(
        _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
        _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
    // r lane 4k + j holds token 4j + k
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, r);
  }

  // ---- bf16 dot product (vdpbf16ps), used for BF16Dot caches only ----

  // QK of one block for a bf16 cache: a 32-element vector of a K row holds 4 tokens x 8 dims;
  // vdpbf16ps sums adjacent dim pairs, so its 16 fp32 lanes are in x = 4 form and 4 of them give
  // 16 token sums. qb: [GT][D] bf16 bits of the unscaled query (exact: the query is bf16); the
  // sums are scaled by qk_scale. vLLM's K only (bf16: x = 8).
  template <int GT>
  PA_AVX512_BF16 static void qk_bf16dot(const uint16_t* kblk, const uint16_t* qb, float qk_scale,
                                        const TaskShape& s, float* logits, const char* pf_k,
                                        const char* pf_v) {
    constexpr int JT = 4;  // 4 vectors of 32 elements: 16 tokens
    const __m512 scale = _mm512_set1_ps(qk_scale);
    RowSharePrefetch row_prefetch(pf_k, pf_v, s, s.C);
    for (int j = 0; j < s.R; j += 32 * JT) {
      __mmask32 m[JT];
      for (int jt = 0; jt < JT; ++jt) {
        const int n = std::min(std::max(s.R - j - 32 * jt, 0), 32);
        m[jt] = n == 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << n) - 1u);
      }
      __m512 acc[GT][JT];
      for (int g = 0; g < GT; ++g)
        for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_setzero_ps();
      for (int c = 0; c < s.C; ++c) {
        const uint16_t* kp = kblk + static_cast<int64_t>(c) * s.R + j;
        if (j == 0) row_prefetch.row();  // spread over this block
        __m512bh kv[JT];
        for (int jt = 0; jt < JT; ++jt)
          kv[jt] = (__m512bh)_mm512_maskz_loadu_epi16(m[jt], kp + 32 * jt);
        for (int g = 0; g < GT; ++g) {
          const __m512bh qv = (__m512bh)_mm512_broadcast_i32x4(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + g * s.D + c * 8)));
          for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_dpbf16_ps(acc[g][jt], kv[jt], qv);
        }
      }
      const int ntok = std::min(32 * JT, s.R - j) / 8;
      for (int g = 0; g < GT; ++g)
        _mm512_mask_storeu_ps(
            logits + g * s.L + j / 8, lane_mask(0, ntok),
            _mm512_mul_ps(sum_x4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), scale));
    }
  }

  // QK of one block for a bf16 token-major cache: a 32-element vector is 32 dims of one token;
  // vdpbf16ps sums adjacent dim pairs, so after a token's last dims one vector holds its logit
  // spread over 16 lanes (the X = 16 form) and 16 of them fold into 16 token sums. JT tokens
  // per pass (their accumulators in registers), the 16 / JT passes of 16 tokens held for one
  // fold. qb: [GT][D] bf16 bits of the unscaled query; the sums are scaled by qk_scale. A last
  // vector of head_size % 32 dims is masked in K and q alike.
  template <int GT>
  PA_AVX512_BF16 static void qk_bf16dot_token_major(const uint16_t* kblk, const uint16_t* qb,
                                                    float qk_scale, const TaskShape& s,
                                                    float* logits, const char* pf_k,
                                                    const char* pf_v) {
    constexpr int JT = GT <= 2 ? 8 : 4;  // GT * JT accumulators + JT K vectors + q: <= 32 zmm
    const int rows = (s.D + 31) / 32;    // vectors per token
    const __mmask32 tail_mask =
        s.D % 32 == 0 ? ~__mmask32(0) : static_cast<__mmask32>((1u << (s.D % 32)) - 1u);
    RowSharePrefetch row_prefetch(pf_k, pf_v, s, rows);  // row() once per vector of a token
    const __m512 scale = _mm512_set1_ps(qk_scale);
    for (int j = 0; j < s.bs; j += 16) {
      __m512 held[GT][16];
      for (int t = 0; t < 16; t += JT) {
        const int ntok = std::min(JT, s.bs - j - t);  // tokens of this pass in the block
        __m512 acc[GT][JT];
#pragma GCC unroll 8
        for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
          for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int c = 0; ntok > 0 && c < rows; ++c) {
          if (j == 0 && t == 0) row_prefetch.row();  // spread over this block
          const __mmask32 m = c + 1 < rows ? ~__mmask32(0) : tail_mask;
          __m512bh kv[JT];
#pragma GCC unroll 8
          for (int jt = 0; jt < JT; ++jt)
            kv[jt] = (__m512bh)_mm512_maskz_loadu_epi16(
                jt < ntok ? m : 0, kblk + static_cast<int64_t>(j + t + jt) * s.k_token_stride +
                                       32 * c);
#pragma GCC unroll 8
          for (int g = 0; g < GT; ++g) {
            const __m512bh qv = (__m512bh)_mm512_maskz_loadu_epi16(m, qb + g * s.D + 32 * c);
#pragma GCC unroll 8
            for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_dpbf16_ps(acc[g][jt], kv[jt], qv);
          }
        }
#pragma GCC unroll 8
        for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
          for (int jt = 0; jt < JT; ++jt) held[g][t + jt] = acc[g][jt];
      }
      const int ntok = std::min(16, s.bs - j);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        __m512 x8[8], x4[4];  // 16 tokens in the x = 8 form, then the x = 4 form
#pragma GCC unroll 8
        for (int i = 0; i < 8; ++i) x8[i] = fold16(held[g][2 * i], held[g][2 * i + 1]);
#pragma GCC unroll 8
        for (int i = 0; i < 4; ++i) x4[i] = fold8(x8[2 * i], x8[2 * i + 1]);
        _mm512_mask_storeu_ps(logits + g * s.L + j, lane_mask(0, ntok),
                              _mm512_mul_ps(sum_x4(x4[0], x4[1], x4[2], x4[3]), scale));
      }
    }
  }

  // PV for a bf16 cache: the probabilities rounded to bf16 (as vLLM's P.V in the query dtype;
  // within testing.tolerances) times V; a 256-bit V row piece holds 16 tokens, and vdpbf16ps
  // sums adjacent token pairs into 8 fp32 lanes. pb: [GT] rows of bf16 probabilities, row g at
  // pb + g * 2 * s.L (the logits buffer converted in place by probs_to_bf16).
  template <int GT, int DT>
  PA_AVX512_BF16 static void pv_bf16dot(const uint16_t* V, const Span* spans, int nspans,
                                        const uint16_t* pb, const TaskShape& s, const float* norm,
                                        float* out, int64_t out_stride, PrefetchStream& pf) {
    static_assert(DT % 4 == 0, "4 head dims per reduction");
    const int64_t pstride = 2 * static_cast<int64_t>(s.L);
    for (int d0 = 0; d0 < s.D; d0 += DT) {
      __m256 acc[GT][DT];
      for (int g = 0; g < GT; ++g)
        for (int dt = 0; dt < DT; ++dt) acc[g][dt] = _mm256_setzero_ps();
      for (int i = 0; i < nspans; ++i) {
        const Span& sp = spans[i];
        pf.step();
        const uint16_t* vb = V + sp.v_offset + static_cast<int64_t>(d0) * s.bs;
        for (int tc = sp.lo & ~15; tc < sp.hi; tc += 16) {
          const __mmask16 m = lane_mask(sp.lo - tc, sp.hi - tc);
          __m256bh pv[GT];
          for (int g = 0; g < GT; ++g)
            pv[g] = (__m256bh)_mm256_maskz_loadu_epi16(m, pb + g * pstride + sp.buf + tc);
          for (int dt = 0; dt < DT; ++dt) {
            const __m256bh vr =
                (__m256bh)_mm256_maskz_loadu_epi16(m, vb + static_cast<int64_t>(dt) * s.bs + tc);
            for (int g = 0; g < GT; ++g) acc[g][dt] = _mm256_dpbf16_ps(acc[g][dt], vr, pv[g]);
          }
        }
      }
      for (int g = 0; g < GT; ++g) {
        const __m128 scale = _mm_set1_ps(norm[g]);
        for (int dt = 0; dt < DT; dt += 4) {  // [sum acc[g][dt + k]] for k < 4
          const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][dt], acc[g][dt + 1]),
                                          _mm256_hadd_ps(acc[g][dt + 2], acc[g][dt + 3]));
          const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
          _mm_storeu_ps(out + g * out_stride + d0 + dt, _mm_mul_ps(sums, scale));
        }
      }
    }
  }

  // One token pair of pv_bf16dot_token_major: tokens t and t + 1 at vt (pt: their bf16
  // probabilities, head stride pstride), or token t alone (!kTwo: t + 1's V and p taken as 0).
  template <int GT, int CH, bool kTwo>
  PA_AVX512_BF16_INLINE static void pv_token_pair(const uint16_t* vt, int64_t vstride,
                                                  const uint16_t* pt, int64_t pstride,
                                                  const __mmask32 (&m)[CH], __m512 (&lo)[GT][CH],
                                                  __m512 (&hi)[GT][CH]) {
#pragma GCC unroll 8
    for (int c = 0; c < CH; ++c) {
      const __m512i a = _mm512_maskz_loadu_epi16(m[c], vt + 32 * c);
      const __m512i b = kTwo ? _mm512_maskz_loadu_epi16(m[c], vt + vstride + 32 * c)
                             : _mm512_setzero_si512();
      const __m512bh pair_lo = (__m512bh)_mm512_unpacklo_epi16(a, b);
      const __m512bh pair_hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        uint32_t pair = pt[g * pstride];  // (p[t], p[t + 1]), p[t] in the low half
        if constexpr (kTwo) std::memcpy(&pair, pt + g * pstride, sizeof(pair));
        const __m512bh p2 = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        lo[g][c] = _mm512_dpbf16_ps(lo[g][c], pair_lo, p2);
        hi[g][c] = _mm512_dpbf16_ps(hi[g][c], pair_hi, p2);
      }
    }
  }

  // Token-major PV of one block (spans[i]) for a tile of GT heads, on vdpbf16ps: the V rows of
  // tokens t and t + 1 interleaved (vpunpck{l,h}wd) into (V[t][d], V[t + 1][d]) pairs, so one
  // vdpbf16ps adds p[t] V[t][d] + p[t + 1] V[t + 1][d] for 16 dims. Per 128-bit block b the
  // "lo" lanes hold dims 8b + j, the "hi" lanes dims 8b + 4 + j (j < 4); vpermt2ps puts them back
  // in order when the sums go to the output rows. Otherwise as pv_block_tokens
  // (partition_kernel.h): the sums live in out[g] between blocks and are scaled by norm at the
  // last one, only the slots [lo, hi) are read, prefetch_next pulls the next block's same dims
  // into L1 alongside, pf.step() once per token and pass (passes of 16 * pv_vecs dims, as
  // token_pv_steps counts them, except one or two heads with head_size 177-192: 2 passes here, 3
  // counted, so 2/3 of the next item's prefetch is issued). pb: [GT] rows of bf16
  // probabilities (probs_to_bf16), row g at pb + g * 2 * s.L.
  template <int GT>
  PA_AVX512_BF16 static void pv_bf16dot_token_major(const uint16_t* V, const Span* spans, int i,
                                                    int nspans, const uint16_t* pb,
                                                    const TaskShape& s, const float* norm,
                                                    float* out, int64_t out_stride,
                                                    bool prefetch_next, PrefetchStream& pf) {
    constexpr int CH = GT <= 2 ? 4 : 2;  // 32-dim chunks per pass: 2 * GT * CH accumulators
    const Span& sp = spans[i];
    const Span* next = prefetch_next && i + 1 < nspans ? &spans[i + 1] : nullptr;
    const int n = sp.hi - sp.lo, n_ahead = next ? next->hi - next->lo : 0;
    const int64_t pstride = 2 * static_cast<int64_t>(s.L), vstride = s.v_token_stride;
    const uint16_t* pt = pb + sp.buf + sp.lo;
    const __m512i order_lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21,
                                               22, 23);  // dims 0-15 of a chunk
    const __m512i order_hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28,
                                               29, 30, 31);  // dims 16-31
    for (int d0 = 0; d0 < s.D; d0 += 32 * CH) {
      __mmask32 m[CH];
#pragma GCC unroll 8
      for (int c = 0; c < CH; ++c) {
        const int dims = std::clamp(s.D - d0 - 32 * c, 0, 32);
        m[c] = dims == 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << dims) - 1u);
      }
      __m512 lo[GT][CH], hi[GT][CH];
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) lo[g][c] = hi[g][c] = _mm512_setzero_ps();
      const uint16_t* vt = V + sp.v_offset + sp.lo * vstride + d0;
      const uint16_t* ahead = next ? V + next->v_offset + next->lo * vstride + d0 : nullptr;
      for (int t = 0; t < n; t += 2) {
        const bool two = t + 1 < n;
        pf.step(two ? 2 : 1);
        for (int k = t; k < t + 2 && k < n_ahead; ++k) {
          const auto* a = reinterpret_cast<const char*>(ahead + k * vstride);
          for (int l = 0; l < 64 * CH; l += 64) prefetch_l1(a + l);
        }
        if (two)
          pv_token_pair<GT, CH, true>(vt + t * vstride, vstride, pt + t, pstride, m, lo, hi);
        else
          pv_token_pair<GT, CH, false>(vt + t * vstride, vstride, pt + t, pstride, m, lo, hi);
      }
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        const __m512 scale = _mm512_set1_ps(i + 1 == nspans ? norm[g] : 1.0f);  // done: scaled
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) {
          float* o = out + g * out_stride + d0 + 32 * c;
          const int dims = s.D - d0 - 32 * c;
          const __mmask16 m0 = lane_mask(0, dims), m1 = lane_mask(0, dims - 16);
          __m512 n0 = _mm512_permutex2var_ps(lo[g][c], order_lo, hi[g][c]);
          __m512 n1 = _mm512_permutex2var_ps(lo[g][c], order_hi, hi[g][c]);
          if (i > 0) {  // the blocks before: in the output row
            n0 = _mm512_add_ps(n0, _mm512_maskz_loadu_ps(m0, o));
            n1 = _mm512_add_ps(n1, _mm512_maskz_loadu_ps(m1, o + 16));
          }
          _mm512_mask_storeu_ps(o, m0, _mm512_mul_ps(n0, scale));
          _mm512_mask_storeu_ps(o + 16, m1, _mm512_mul_ps(n1, scale));
        }
      }
    }
  }

  // p[lo, hi) of one head, fp32 -> bf16 (round to nearest even) in place: bf16 element i lands
  // at byte 2i, below the fp32 elements still to read. Lanes outside [lo, hi) become 0.
  PA_AVX512_BF16 static void probs_to_bf16(float* buf, int lo, int hi) {
    auto* pb = reinterpret_cast<uint16_t*>(buf);
    for (int i = lo & ~15; i < hi; i += 16) {
      const __m256bh h =
          _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lane_mask(lo - i, hi - i), buf + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + i), (__m256i)h);
    }
  }
};

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
