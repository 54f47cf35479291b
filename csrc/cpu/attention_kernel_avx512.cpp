// attention_kernel_avx512.cpp — AVX-512 CPU kernel for one work item (sequence, KV head, 512-token
// partition); same contract as attention_kernel_generic.cpp (see attention_kernel.h).
//
// Every function that uses AVX-512 carries PA_AVX512 (a GCC/Clang target attribute), so this file
// compiles with the project's baseline flags and the code runs only after cpu_has_avx512().
// No lambdas in PA_AVX512 code: GCC does not propagate the target attribute into them.
//
// Algorithm per work item (G query heads share the KV head; head tiles: G = 6 is one tile,
// otherwise tiles of <= 4 heads; a tile's heads share every K / V vector load):
//   spans   the partition's blocks from the block table: 64-bit element offset of the block's
//           [kv_head] slice and the slot range [lo, hi) of the partition's tokens in it.
//   QK      one pass over the blocks, every head tile per block (the block's K stays in L1).
//           K viewed as rows [head_size / x][block_size * x]; a 16-lane vector holds 16 / x
//           tokens x x dims ("x form"). acc[g][j] += K_vec[j] * (q's x dims of row c,
//           broadcast, pre-scaled); then a transpose-reduce folds 4-16 accumulators into one
//           vector of 16 token logits (store_token_sums).
//   softmax m = max, p = exp(l - m) (vectorised exp), s = sum p, per head.
//   PV      per head tile and tile of DT head dims, registers acc[g][dt] (16 token lanes each)
//           accumulate p[g][tokens] * V[d][tokens] over all blocks of the partition; one
//           horizontal reduction per (g, d) at the end. V rows are [block_size] contiguous per d.
// Slots outside [lo, hi) are masked to zero in BOTH p and V loads (0 * NaN would be NaN).
// bf16 cache on a CPU with AVX512_BF16 (BF16Dot): QK on vdpbf16ps with the exact bf16 query,
// scaled after; PV on vdpbf16ps with p rounded to bf16 (qk_block_bf16dot, pv_tile_bf16dot).
// Prefetch (addresses known from the block tables), all into L2: while scoring block i, block
// i + 4's K and block i's V, so PV finds the partition's V in L2; during PV, the next work item's
// K (within an L2 budget). Prefetches are spread over the compute (a few lines per K row / PV
// step) instead of issued in bursts: a burst stalls on the miss buffers and leaves nothing in
// flight during the compute (measured: v2 time / linear read time of the same bytes fell from
// ~3.8 to ~2.0).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "attention_kernel.h"
#include "cache_element.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define PA_HAVE_AVX512_PATH 1
// GCC 12 false positive inside the _mm512_reduce_* / mask intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define PA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
// QK / PV of a bf16 cache with vdpbf16ps (run only after cpu_has_avx512_bf16()).
#define PA_AVX512_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,avx512bf16")))
#else
#define PA_HAVE_AVX512_PATH 0
#endif

namespace paged_attn {
namespace cpu {

#if PA_HAVE_AVX512_PATH

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
}

namespace {

// bf16 cache whose QK (exact: the query is bf16 too) and PV (p rounded to bf16) run on
// vdpbf16ps; its Load is BF16's.
struct BF16Dot {
  using storage = uint16_t;
};

// ---- loads: up to 16 cache elements (lanes outside `m` read nothing and are 0) -> 16 floats ----
template <typename Cache>
struct Load;
template <>
struct Load<F32> {
  PA_AVX512 static __m512 at(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
};
template <>
struct Load<F16> {
  PA_AVX512 static __m512 at(const uint16_t* p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};
template <>
struct Load<BF16> {
  PA_AVX512 static __m512 at(const uint16_t* p, __mmask16 m) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
};
template <>
struct Load<BF16Dot> : Load<BF16> {};
template <>
struct Load<E5M2> {  // an e5m2 byte is the top byte of an fp16
  PA_AVX512 static __m512 at(const uint8_t* p, __mmask16 m) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
    return _mm512_cvtph_ps(_mm256_slli_epi16(w, 8));
  }
};
template <>
struct Load<E4M3> {
  // e4m3fn S.EEEE.MMM -> fp16 S.0EEEE.MMM0000000 is the value * 2^-8 (subnormals included, and
  // vcvtph2ps ignores DAZ); times 256 in fp32 is exact. S.1111.111 is NaN (fp16 would say 480).
  PA_AVX512 static __m512 at(const uint8_t* p, __mmask16 m) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(m, p));
    const __m256i mag = _mm256_and_si256(w, _mm256_set1_epi16(0x7F));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(mag, 7), sign);
    const __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7F));
    return _mm512_mask_blend_ps(nan, f, _mm512_set1_ps(NAN));
  }
};

PA_AVX512 inline __mmask16 lanes(int lo, int hi) {  // lanes [lo, hi) of 16, clamped
  lo = std::max(lo, 0);
  hi = std::min(hi, 16);
  if (hi <= lo) return 0;
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// exp(x) for x <= 0 (and -inf -> 0, NaN -> NaN): Cephes expf's range reduction and polynomial,
// scaled by 2^n with vscalefps (handles underflow to 0). Relative error ~1e-7.
PA_AVX512 inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // this operand order keeps NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500E-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073E-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894E-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459E-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201E-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// ---- logits: per-token sums of the QK accumulators ----
// K rows hold x consecutive dims of each token, so a 16-lane accumulator holds 16 / x tokens x x
// partial sums ("x form"). These fold x = 16 and x = 8 forms down to the x = 4 form (one token
// per 128-bit lane), then a 4-vector transpose-reduce gives 16 token sums in one vector.

// x = 16 pair: a = token 0, b = token 1 -> x = 8 form [t0 | t1].
PA_AVX512 inline __m512 fold16(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}

// x = 8 pair: a = [t0 | t1], b = [t2 | t3] -> x = 4 form [t0 t1 t2 t3].
PA_AVX512 inline __m512 fold8(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

// x = 4 forms of tokens 0-3, 4-7, 8-11, 12-15 -> the 16 token sums in token order.
PA_AVX512 inline __m512 sum_x4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 r = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // r lane 4k + j holds token 4j + k
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// The 16 * JT / X token sums of JT accumulators in X form, stored to dst[0, ntok).
template <int X, int JT>
PA_AVX512 inline void store_token_sums(const __m512* acc, float* dst, int ntok) {
  static_assert(JT * 4 % X == 0, "at least one x = 4 vector");
  constexpr int N4 = JT * 4 / X;  // vectors in x = 4 form
  __m512 v4[N4 < 4 ? 4 : N4];
  if constexpr (X == 4) {
    for (int i = 0; i < N4; ++i) v4[i] = acc[i];
  } else if constexpr (X == 8) {
    for (int i = 0; i < N4; ++i) v4[i] = fold8(acc[2 * i], acc[2 * i + 1]);
  } else {
    for (int i = 0; i < N4; ++i)
      v4[i] = fold8(fold16(acc[4 * i], acc[4 * i + 1]), fold16(acc[4 * i + 2], acc[4 * i + 3]));
  }
  for (int i = N4; i < 4; ++i) v4[i] = _mm512_setzero_ps();
  for (int i = 0; i < N4; i += 4, ntok -= 16)
    _mm512_mask_storeu_ps(dst + 4 * i, lanes(0, ntok),
                          sum_x4(v4[i], v4[i + 1], v4[i + 2], v4[i + 3]));
}

// q's x dims of K row c (q points at them) broadcast to the x form.
template <int X>
PA_AVX512 inline __m512 q_row(const float* q) {
  if constexpr (X == 4) return _mm512_broadcast_f32x4(_mm_loadu_ps(q));
  if constexpr (X == 8) return _mm512_broadcast_f32x8(_mm256_loadu_ps(q));
  return _mm512_loadu_ps(q);
}

// [sum(a), sum(b), sum(c), sum(d)]
PA_AVX512 inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 u = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(u), _mm512_extractf32x8_ps(u, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

template <int HINT>
PA_AVX512 inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(c + off, static_cast<_mm_hint>(HINT));
}

// Cache lines of a list of blocks, prefetched into L2 a few lines per step(): spreads the next
// work item's K over this item's PV loop (a burst would stall on the miss buffers).
struct PrefetchStream {
  const char* const* blocks = nullptr;
  int nblocks = 0;
  int64_t block_bytes = 0;
  int lines_per_step = 0;
  int b = 0;
  int64_t off = 0;
  void step() {
    for (int k = 0; k < lines_per_step && b < nblocks; ++k) {
      _mm_prefetch(blocks[b] + off, _MM_HINT_T1);
      off += 64;
      if (off >= block_bytes) off = 0, ++b;
    }
  }
};

// One block of the partition: where its [kv_head] slice starts and which slots are ours.
struct Span {
  int64_t offset;  // elements from the cache base: block * kv_block_stride + kv_head * stride
  int lo, hi;      // slots [lo, hi) belong to the partition (and are < seq_len)
  int buf;         // index in the logits buffer of slot 0 of this block
};

struct TaskShape {
  int D, bs, x, C, R;  // head size, block size, x, rows D / x, row length bs * x
  int L;               // logits buffer stride per head
  int64_t kv_bytes;    // bytes of one block's [kv_head] slice of K (or V)
};

// logits[g][slot] for all bs slots of one block, heads [0, GT) of a tile.
// kblk: [C][R] cache elements; qs: [GT][D] scaled query; logits: [GT][L] at the block's slot 0.
// JT vectors (16 * JT elements) of each row per pass. pf_a / pf_b (either may be null): blocks
// prefetched into L2 a row's worth of lines per K row.
template <typename Cache, int GT, int JT>
PA_AVX512 void qk_block(const typename Cache::storage* kblk, const float* qs,
                        const TaskShape& s, float* logits, const char* pf_a, const char* pf_b) {
  constexpr int X = 16 / static_cast<int>(sizeof(typename Cache::storage));
  const int64_t row_bytes = s.kv_bytes / s.C;  // bytes of one K row c
  for (int j = 0; j < s.R; j += 16 * JT) {
    __mmask16 m[JT];
#pragma GCC unroll 8
    for (int jt = 0; jt < JT; ++jt) m[jt] = lanes(0, s.R - j - 16 * jt);
    __m512 acc[GT][JT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_setzero_ps();
    for (int c = 0; c < s.C; ++c) {
      const auto* kp = kblk + static_cast<int64_t>(c) * s.R + j;
      if (j == 0) {  // spread the prefetches over this block's compute
        for (int64_t off = c * row_bytes; off < (c + 1) * row_bytes; off += 64) {
          if (pf_a) _mm_prefetch(pf_a + off, _MM_HINT_T1);
          if (pf_b) _mm_prefetch(pf_b + off, _MM_HINT_T1);
        }
      }
      __m512 kv[JT];
#pragma GCC unroll 8
      for (int jt = 0; jt < JT; ++jt) kv[jt] = Load<Cache>::at(kp + 16 * jt, m[jt]);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        const __m512 qv = q_row<X>(qs + g * s.D + c * X);
#pragma GCC unroll 8
        for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_fmadd_ps(kv[jt], qv, acc[g][jt]);
      }
    }
    const int ntok = std::min(16 * JT, s.R - j) / X;
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) store_token_sums<X, JT>(acc[g], logits + g * s.L + j / X, ntok);
  }
}

// qk_block for a bf16 cache with vdpbf16ps: a 32-element vector of a K row holds 4 tokens x 8
// dims; vdpbf16ps sums adjacent dim pairs, so its 16 fp32 lanes are in x = 4 form (one token per
// 128-bit lane) and 4 of them give 16 token sums. qb: [GT][D] bf16 bits of the unscaled query
// (exact: the query is bf16); the sums are scaled by qk_scale. s.x must be 8.
template <int GT>
__attribute__((noinline)) PA_AVX512_BF16 void qk_block_bf16dot(
    const uint16_t* kblk, const uint16_t* qb, float qk_scale, const TaskShape& s, float* logits,
    const char* pf_a, const char* pf_b) {
  constexpr int JT = 4;  // 4 vectors of 32 elements: 16 tokens
  const int64_t row_bytes = s.kv_bytes / s.C;
  const __m512 scale = _mm512_set1_ps(qk_scale);
  for (int j = 0; j < s.R; j += 32 * JT) {
    __mmask32 m[JT];
#pragma GCC unroll 8
    for (int jt = 0; jt < JT; ++jt) {
      const int n = std::min(std::max(s.R - j - 32 * jt, 0), 32);
      m[jt] = n == 32 ? ~__mmask32(0) : static_cast<__mmask32>((1u << n) - 1u);
    }
    __m512 acc[GT][JT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_setzero_ps();
    for (int c = 0; c < s.C; ++c) {
      const uint16_t* kp = kblk + static_cast<int64_t>(c) * s.R + j;
      if (j == 0) {  // spread the prefetches over this block's compute
        for (int64_t off = c * row_bytes; off < (c + 1) * row_bytes; off += 64) {
          if (pf_a) _mm_prefetch(pf_a + off, _MM_HINT_T1);
          if (pf_b) _mm_prefetch(pf_b + off, _MM_HINT_T1);
        }
      }
      __m512bh kv[JT];
#pragma GCC unroll 8
      for (int jt = 0; jt < JT; ++jt)
        kv[jt] = (__m512bh)_mm512_maskz_loadu_epi16(m[jt], kp + 32 * jt);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        const __m512bh qv = (__m512bh)_mm512_broadcast_i32x4(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qb + g * s.D + c * 8)));
#pragma GCC unroll 8
        for (int jt = 0; jt < JT; ++jt) acc[g][jt] = _mm512_dpbf16_ps(acc[g][jt], kv[jt], qv);
      }
    }
    const int ntok = std::min(32 * JT, s.R - j) / 8;
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
      _mm512_mask_storeu_ps(
          logits + g * s.L + j / 8, lanes(0, ntok),
          _mm512_mul_ps(sum_x4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), scale));
  }
}

// out[g][d] = norm[g] * sum over the partition's tokens of p[g][t] * V[t][d], heads [0, GT),
// head dims in tiles of DT (D % DT == 0). probs: [GT][L]; out row g at out + g * out_stride.
// pf.step() once per (dim tile, block).
template <typename Cache, int GT, int DT>
PA_AVX512 void pv_tile(const typename Cache::storage* V, const Span* spans, int nspans,
                       const float* probs, const TaskShape& s, const float* norm, float* out,
                       int64_t out_stride, PrefetchStream& pf) {
  static_assert(DT % 4 == 0, "reduce4 takes 4 head dims at a time");
  for (int d0 = 0; d0 < s.D; d0 += DT) {
    __m512 acc[GT][DT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int dt = 0; dt < DT; ++dt) acc[g][dt] = _mm512_setzero_ps();
    for (int i = 0; i < nspans; ++i) {
      const Span& sp = spans[i];
      pf.step();
      const auto* vb = V + sp.offset + static_cast<int64_t>(d0) * s.bs;
      for (int tc = sp.lo & ~15; tc < sp.hi; tc += 16) {
        const __mmask16 m = lanes(sp.lo - tc, sp.hi - tc);
        __m512 pv[GT];
#pragma GCC unroll 8
        for (int g = 0; g < GT; ++g) pv[g] = _mm512_maskz_loadu_ps(m, probs + g * s.L + sp.buf + tc);
#pragma GCC unroll 8
        for (int dt = 0; dt < DT; ++dt) {
          const __m512 vr = Load<Cache>::at(vb + static_cast<int64_t>(dt) * s.bs + tc, m);
#pragma GCC unroll 8
          for (int g = 0; g < GT; ++g) acc[g][dt] = _mm512_fmadd_ps(vr, pv[g], acc[g][dt]);
        }
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) {
      const __m128 scale = _mm_set1_ps(norm[g]);
#pragma GCC unroll 2
      for (int dt = 0; dt < DT; dt += 4) {
        const __m128 sums = reduce4(acc[g][dt], acc[g][dt + 1], acc[g][dt + 2], acc[g][dt + 3]);
        _mm_storeu_ps(out + g * out_stride + d0 + dt, _mm_mul_ps(sums, scale));
      }
    }
  }
}

// pv_tile for a bf16 cache with vdpbf16ps: the probabilities rounded to bf16 (as vLLM's P.V in
// the query dtype; within testing.tolerances) times V; a 256-bit V row piece holds 16 tokens, and
// vdpbf16ps sums adjacent token pairs into 8 fp32 lanes. pb: [GT] rows of bf16 probabilities,
// row g at pb + g * 2 * s.L (the logits buffer converted in place by probs_to_bf16).
template <int GT, int DT>
__attribute__((noinline)) PA_AVX512_BF16 void pv_tile_bf16dot(
    const uint16_t* V, const Span* spans, int nspans, const uint16_t* pb, const TaskShape& s,
    const float* norm, float* out, int64_t out_stride, PrefetchStream& pf) {
  static_assert(DT % 4 == 0, "4 head dims per reduction");
  const int64_t pstride = 2 * static_cast<int64_t>(s.L);
  for (int d0 = 0; d0 < s.D; d0 += DT) {
    __m256 acc[GT][DT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int dt = 0; dt < DT; ++dt) acc[g][dt] = _mm256_setzero_ps();
    for (int i = 0; i < nspans; ++i) {
      const Span& sp = spans[i];
      pf.step();
      const uint16_t* vb = V + sp.offset + static_cast<int64_t>(d0) * s.bs;
      for (int tc = sp.lo & ~15; tc < sp.hi; tc += 16) {
        const __mmask16 m = lanes(sp.lo - tc, sp.hi - tc);
        __m256bh pv[GT];
#pragma GCC unroll 8
        for (int g = 0; g < GT; ++g)
          pv[g] = (__m256bh)_mm256_maskz_loadu_epi16(m, pb + g * pstride + sp.buf + tc);
#pragma GCC unroll 8
        for (int dt = 0; dt < DT; ++dt) {
          const __m256bh vr =
              (__m256bh)_mm256_maskz_loadu_epi16(m, vb + static_cast<int64_t>(dt) * s.bs + tc);
#pragma GCC unroll 8
          for (int g = 0; g < GT; ++g) acc[g][dt] = _mm256_dpbf16_ps(acc[g][dt], vr, pv[g]);
        }
      }
    }
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) {
      const __m128 scale = _mm_set1_ps(norm[g]);
#pragma GCC unroll 2
      for (int dt = 0; dt < DT; dt += 4) {  // [sum acc[g][dt + k]] for k < 4
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][dt], acc[g][dt + 1]),
                                        _mm256_hadd_ps(acc[g][dt + 2], acc[g][dt + 3]));
        const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        _mm_storeu_ps(out + g * out_stride + d0 + dt, _mm_mul_ps(sums, scale));
      }
    }
  }
}

// p[lo, hi) of one head, fp32 -> bf16 (round to nearest even) in place: bf16 element i lands at
// byte 2i, below the fp32 elements still to read. Lanes outside [lo, hi) become 0.
__attribute__((noinline)) PA_AVX512_BF16 void probs_to_bf16(float* buf, int lo, int hi) {
  auto* pb = reinterpret_cast<uint16_t*>(buf);
  for (int i = lo & ~15; i < hi; i += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(lanes(lo - i, hi - i), buf + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pb + i), (__m256i)h);
  }
}

// (m, s) of one head's logits in buf[lo, hi); overwrites them with p = exp(l - m).
PA_AVX512 inline void softmax_in_place(float* buf, int lo, int hi, float* m_out, float* s_out) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int i = lo & ~15; i < hi; i += 16) {
    const __mmask16 m = lanes(lo - i, hi - i);
    vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, buf + i));
  }
  const float mx = _mm512_reduce_max_ps(vmax);
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 vsum = _mm512_setzero_ps();
  for (int i = lo & ~15; i < hi; i += 16) {
    const __mmask16 m = lanes(lo - i, hi - i);
    const __m512 p = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, buf + i), vm));
    vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, p));
    _mm512_mask_storeu_ps(buf + i, m, p);
  }
  *m_out = mx;
  *s_out = _mm512_reduce_add_ps(vsum);
}

// Head tiles: a tile's heads share every K / V vector load (registers: GT accumulators per K
// vector in QK, GT x DT in PV). G = 6 is one tile; otherwise tiles of 4 and a remainder.
inline int tile_heads(int remaining) {
  return remaining == 6 ? 6 : std::min(4, remaining);
}

template <typename Cache>
PA_AVX512 void qk_tile(int gt, const typename Cache::storage* kblk, const float* qs,
                       float qk_scale, const TaskShape& s, float* logits, const char* pf_a,
                       const char* pf_b) {
  if constexpr (std::is_same_v<Cache, BF16Dot>) {
    const auto* qb = reinterpret_cast<const uint16_t*>(qs);  // bf16 query, see run_partition
    switch (gt) {
      case 1: return qk_block_bf16dot<1>(kblk, qb, qk_scale, s, logits, pf_a, pf_b);
      case 2: return qk_block_bf16dot<2>(kblk, qb, qk_scale, s, logits, pf_a, pf_b);
      case 3: return qk_block_bf16dot<3>(kblk, qb, qk_scale, s, logits, pf_a, pf_b);
      case 4: return qk_block_bf16dot<4>(kblk, qb, qk_scale, s, logits, pf_a, pf_b);
      default: return qk_block_bf16dot<6>(kblk, qb, qk_scale, s, logits, pf_a, pf_b);
    }
  }
  (void)qk_scale;  // folded into qs
  switch (gt) {
    case 1: return qk_block<Cache, 1, 8>(kblk, qs, s, logits, pf_a, pf_b);
    case 2: return qk_block<Cache, 2, 8>(kblk, qs, s, logits, pf_a, pf_b);
    case 3: return qk_block<Cache, 3, 4>(kblk, qs, s, logits, pf_a, pf_b);
    case 4: return qk_block<Cache, 4, 4>(kblk, qs, s, logits, pf_a, pf_b);
    default: return qk_block<Cache, 6, 4>(kblk, qs, s, logits, pf_a, pf_b);
  }
}

template <typename Cache>
PA_AVX512 void pv_heads(int gt, const typename Cache::storage* V, const Span* spans, int nspans,
                        const float* probs, const TaskShape& s, const float* norm, float* out,
                        int64_t out_stride, PrefetchStream& pf) {
  const bool wide = s.D % 8 == 0;  // fewer heads: wider dim tiles keep 8+ accumulators busy
  if constexpr (std::is_same_v<Cache, BF16Dot>) {
    const auto* pb = reinterpret_cast<const uint16_t*>(probs);  // see probs_to_bf16
    switch (gt) {
      case 1:
        if (wide) return pv_tile_bf16dot<1, 8>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
        return pv_tile_bf16dot<1, 4>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
      case 2:
        if (wide) return pv_tile_bf16dot<2, 8>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
        return pv_tile_bf16dot<2, 4>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
      case 3: return pv_tile_bf16dot<3, 4>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
      case 4: return pv_tile_bf16dot<4, 4>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
      default: return pv_tile_bf16dot<6, 4>(V, spans, nspans, pb, s, norm, out, out_stride, pf);
    }
  }
  switch (gt) {
    case 1:
      if (wide) return pv_tile<Cache, 1, 8>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
      return pv_tile<Cache, 1, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    case 2:
      if (wide) return pv_tile<Cache, 2, 8>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
      return pv_tile<Cache, 2, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    case 3: return pv_tile<Cache, 3, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    case 4: return pv_tile<Cache, 4, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    default: return pv_tile<Cache, 6, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
  }
}

// The blocks of the partition of `task` (tokens [t_begin, t_end)); returns their count.
inline int partition_spans(const PagedAttentionParams& p, PartitionTask task, int bs,
                           Span* spans) {
  const int seq_len = p.seq_lens[task.seq];
  const int t_begin = task.partition * kPartitionSize;
  const int t_end = std::min(seq_len, t_begin + kPartitionSize);
  const int b_first = t_begin / bs, b_last = (t_end - 1) / bs;
  const int32_t* table = p.block_tables + static_cast<int64_t>(task.seq) * p.max_blocks_per_seq;
  const int64_t head_off = static_cast<int64_t>(task.kv_head) * p.kv_head_stride;
  int n = 0;
  for (int b = b_first; b <= b_last; ++b, ++n) {
    Span& sp = spans[n];
    sp.offset = static_cast<int64_t>(table[b]) * p.kv_block_stride + head_off;  // NOTE: 64-bit
    sp.lo = std::max(t_begin - b * bs, 0);
    sp.hi = std::min(t_end - b * bs, bs);
    sp.buf = n * bs;
  }
  return n;
}

// Bytes of L2 the partition's V and the next work item's K (prefetched during this item's PV)
// may take together (1 MiB per core here; the rest holds K in flight and everything else).
// Measured (llama / short shapes, bf16): 5-10% faster; none when V alone fills the budget.
constexpr int64_t kPrefetchBudget = 384 * 1024;

template <typename Cache>
PA_AVX512 void run_partition(const PagedAttentionParams& p, const KernelInputs& in,
                             PartitionTask task, const PartitionTask* next, float* scratch) {
  using T = typename Cache::storage;
  const T* K = static_cast<const T*>(p.key_cache);
  const T* V = static_cast<const T*>(p.value_cache);
  const int G = p.num_heads / p.num_kv_heads;
  TaskShape s;
  s.D = p.head_size;
  s.bs = p.block_size;
  s.x = p.x;
  s.C = s.D / s.x;
  s.R = s.bs * s.x;
  s.L = (kPartitionSize + 2 * s.bs + 16 + 15) & ~15;
  s.kv_bytes = static_cast<int64_t>(s.D) * s.bs * sizeof(T);

  // scratch: logits [G][L] | qs [G][D] | norm [G] | spans [2][max_spans] (this item's, the
  // next one's) | next K block addresses [max_spans]
  const int max_spans = kPartitionSize / s.bs + 2;
  float* logits = scratch;
  float* qs = logits + static_cast<int64_t>(G) * s.L;
  float* norm = qs + ((static_cast<int64_t>(G) * s.D + 15) & ~15);
  Span* spans = reinterpret_cast<Span*>(norm + ((G + 15) & ~15));
  const char** next_k = reinterpret_cast<const char**>(spans + 2 * max_spans);
  const int nspans = partition_spans(p, task, s.bs, spans);

  // qs[g][d] = qk_scale * q[h0 + g][d]; for BF16Dot, the bf16 bits of q[h0 + g][d] (exact: the
  // query is bf16, its fp32 copy's top half) and QK scales the sums.
  const int h0 = task.kv_head * G;
  const float* q = in.query + (static_cast<int64_t>(task.seq) * p.num_heads + h0) * s.D;
  if constexpr (std::is_same_v<Cache, BF16Dot>) {
    auto* qb = reinterpret_cast<uint16_t*>(qs);
    for (int64_t i = 0; i < static_cast<int64_t>(G) * s.D; ++i) {
      uint32_t bits;
      std::memcpy(&bits, q + i, sizeof(bits));
      qb[i] = static_cast<uint16_t>(bits >> 16);
    }
  } else {
    for (int64_t i = 0; i < static_cast<int64_t>(G) * s.D; ++i) qs[i] = in.qk_scale * q[i];
  }

  // QK, one pass over K for all heads (a block's K stays in L1 across the head tiles).
  // Prefetch into L2: K kAhead blocks ahead, and V of the block being scored, so the PV pass
  // below finds the partition's V in L2.
  constexpr int kAhead = 4;
  for (int i = 0; i < std::min(kAhead, nspans); ++i)
    prefetch_bytes<_MM_HINT_T1>(K + spans[i].offset, s.kv_bytes);
  for (int i = 0; i < nspans; ++i) {
    const char* pf_k = i + kAhead < nspans
                           ? reinterpret_cast<const char*>(K + spans[i + kAhead].offset) : nullptr;
    const char* pf_v = reinterpret_cast<const char*>(V + spans[i].offset);
    for (int g0 = 0; g0 < G;) {
      const int gt = tile_heads(G - g0);
      const float* qs_tile = std::is_same_v<Cache, BF16Dot>  // bf16 query: 2 per float
                                 ? qs + static_cast<int64_t>(g0) * s.D / 2
                                 : qs + static_cast<int64_t>(g0) * s.D;
      qk_tile<Cache>(gt, K + spans[i].offset, qs_tile, in.qk_scale, s,
                     logits + static_cast<int64_t>(g0) * s.L + spans[i].buf, pf_k, pf_v);
      pf_k = pf_v = nullptr;  // once per block
      g0 += gt;
    }
  }

  // Softmax per head over the partition's tokens; ALiBi bias first.
  const int seq_len = p.seq_lens[task.seq];
  const int lo = spans[0].buf + spans[0].lo;
  const int hi = spans[nspans - 1].buf + spans[nspans - 1].hi;
  const int t_at_lo = task.partition * kPartitionSize;  // token index of buffer position lo
  const int64_t row0 = (static_cast<int64_t>(task.seq) * p.num_heads + h0) * in.num_partitions +
                       task.partition;  // [seq, h0, partition] in the result arrays
  for (int g = 0; g < G; ++g) {
    float* l = logits + static_cast<int64_t>(g) * s.L;
    if (p.alibi_slopes) {
      const float slope = p.alibi_slopes[h0 + g];
      for (int b = lo; b < hi; ++b) l[b] += slope * static_cast<float>(t_at_lo + (b - lo) - seq_len + 1);
    }
    float mx, sum;
    softmax_in_place(l, lo, hi, &mx, &sum);
    if constexpr (std::is_same_v<Cache, BF16Dot>) probs_to_bf16(l, lo, hi);
    in.max_logits[row0 + static_cast<int64_t>(g) * in.num_partitions] = mx;
    in.exp_sums[row0 + static_cast<int64_t>(g) * in.num_partitions] = sum;
    norm[g] = in.v_scale / sum;
  }

  // The next work item's K (what fits in kPrefetchBudget beside this item's V), spread over the
  // first head tile's PV steps: memory is otherwise idle while PV reads V from L2.
  PrefetchStream pf;
  const int64_t next_k_budget = kPrefetchBudget - nspans * s.kv_bytes;
  if (next != nullptr && next_k_budget >= s.kv_bytes) {
    Span* next_spans = spans + max_spans;
    const int n_next = partition_spans(p, *next, s.bs, next_spans);
    pf.nblocks = static_cast<int>(std::min<int64_t>(n_next, next_k_budget / s.kv_bytes));
    for (int i = 0; i < pf.nblocks; ++i)
      next_k[i] = reinterpret_cast<const char*>(K + next_spans[i].offset);
    pf.blocks = next_k;
    pf.block_bytes = s.kv_bytes;
    const int steps = s.D / (tile_heads(G) <= 2 && s.D % 8 == 0 ? 8 : 4) * nspans;
    const int64_t lines = pf.nblocks * ((s.kv_bytes + 63) / 64);
    pf.lines_per_step = static_cast<int>((lines + steps - 1) / steps);
  }

  float* out = in.part_out + row0 * s.D;
  const int64_t out_stride = static_cast<int64_t>(in.num_partitions) * s.D;
  for (int g0 = 0; g0 < G;) {
    const int gt = tile_heads(G - g0);
    pv_heads<Cache>(gt, V, spans, nspans, logits + static_cast<int64_t>(g0) * s.L, s, norm + g0,
                    out + g0 * out_stride, out_stride, pf);
    g0 += gt;
  }
}

}  // namespace

// The AVX-512 kernel; bf16_dot: QK and PV of a bf16 cache on vdpbf16ps (BF16Dot).
PA_AVX512 inline void run_avx512(const PagedAttentionParams& p, const KernelInputs& in,
                                 PartitionTask task, const PartitionTask* next, float* scratch,
                                 bool bf16_dot) {
  switch (p.cache_kind) {
    case CacheKind::kFp8E4M3:
      return run_partition<E4M3>(p, in, task, next, scratch);
    case CacheKind::kFp8E5M2:
      return run_partition<E5M2>(p, in, task, next, scratch);
    case CacheKind::kAuto:
      break;
  }
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32:
      return run_partition<F32>(p, in, task, next, scratch);
    case ScalarKind::kFloat16:
      return run_partition<F16>(p, in, task, next, scratch);
    case ScalarKind::kBFloat16:
      if (bf16_dot && p.x == 8) return run_partition<BF16Dot>(p, in, task, next, scratch);
      return run_partition<BF16>(p, in, task, next, scratch);
  }
}

PA_AVX512 void attention_partition_avx512(const PagedAttentionParams& p, const KernelInputs& in,
                                          PartitionTask task, const PartitionTask* next,
                                          float* scratch) {
  static const bool has_bf16_dot = cpu_has_avx512_bf16();
  run_avx512(p, in, task, next, scratch, has_bf16_dot);
}

PA_AVX512 void attention_partition_avx512_no_bf16_dot(const PagedAttentionParams& p,
                                                      const KernelInputs& in, PartitionTask task,
                                                      const PartitionTask* next, float* scratch) {
  run_avx512(p, in, task, next, scratch, false);
}

#else  // no AVX-512 path on this architecture / compiler

bool cpu_has_avx512() { return false; }
void attention_partition_avx512(const PagedAttentionParams& p, const KernelInputs& in,
                                PartitionTask task, const PartitionTask* next, float* scratch) {
  attention_partition_generic(p, in, task, next, scratch);
}
void attention_partition_avx512_no_bf16_dot(const PagedAttentionParams& p, const KernelInputs& in,
                                            PartitionTask task, const PartitionTask* next,
                                            float* scratch) {
  attention_partition_generic(p, in, task, next, scratch);
}

#endif

}  // namespace cpu
}  // namespace paged_attn

namespace paged_attn {
namespace cpu {

// Both kernels' scratch: the AVX-512 layout (see run_partition) covers the generic one's
// ([G][kPartitionSize]).
size_t kernel_scratch_floats(const PagedAttentionParams& p) {
  const size_t G = p.num_heads / p.num_kv_heads;
  const size_t L = (kPartitionSize + 2 * p.block_size + 16 + 15) & ~15;
  const size_t max_spans = kPartitionSize / p.block_size + 2;
  const size_t span_floats = 8, pointer_floats = 2;  // >= sizeof(Span), sizeof(char*) / 4
  return G * L + ((G * p.head_size + 15) & ~15) + ((G + 15) & ~15) +
         max_spans * (2 * span_floats + pointer_floats) + 16;
}

}  // namespace cpu
}  // namespace paged_attn
