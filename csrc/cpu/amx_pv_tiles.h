// amx_pv_tiles.h — P.V on AMX tiles ("amx" variant; isa_amx.cpp says what each tile holds): the
// item's V chunks (partly covered ones staged, zeroed outside), the probabilities packed as bf16
// for the tiles, and the output rows, token-major (NHD / HND) or on vLLM's layout. Included by
// amx_tiles.h only.
#pragma once

#include "amx_tile_ops.h"

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

// A chunk of V tokens for the PV tiles: its rows (token-major: 16 tokens of stride elements;
// vLLM's layout: D dims of stride elements), where its probabilities are packed (token-major: the
// first slot's column in the P rows; vLLM's layout: its first token pair's row), and whether its
// rows were staged (zero padded: token-major reads a whole last 32 dims from them).
struct Chunk {
  const uint16_t* v;
  int64_t stride;
  int p;
  bool staged;
};
constexpr int kMaxChunks = kPartitionSize / 16 + 2;

// Tokens per V chunk: 16 rows of V (token-major), or min(bs, 32) token columns (vLLM's layout).
template <KvForm F>
inline int chunk_tokens(const TaskShape& s) {
  return F == KvForm::kTokenMajor ? 16 : std::min(s.bs, 32);
}

// The item's V chunks: every chunk of chunk_tokens that holds a slot in [lo, hi) of its block;
// the (at most two: the partition's first and last block) partly outside it are staged into
// ts.stage, zeroed outside. Returns their count.
template <KvForm F>
inline int v_chunks(const uint16_t* V, const Span* spans, int nspans, const TaskShape& s,
                    const TileScratch& ts, Chunk* out) {
  const int tc = chunk_tokens<F>(s), dpad = round32(s.D);
  int n = 0, staged = 0;
  for (int i = 0; i < nspans; ++i) {
    const Span& sp = spans[i];
    for (int c = sp.lo / tc * tc; c < sp.hi; c += tc) {
      const bool partial = c < sp.lo || c + tc > sp.hi;
      if constexpr (F == KvForm::kTokenMajor) {
        const uint16_t* src = V + sp.v_offset + c * s.v_token_stride;
        out[n] = Chunk{src, s.v_token_stride, sp.buf + c, false};
        if (partial) {  // rows [lo - c, hi - c), all dims to dpad, zero elsewhere
          uint16_t* dst = ts.stage[staged++];
          const __mmask32 rows = lanes32(sp.lo - c, sp.hi - c);
          for (int t = 0; t < 16; ++t)
            for (int d0 = 0; d0 < dpad; d0 += 32)
              _mm512_storeu_si512(dst + t * dpad + d0,
                                  _mm512_maskz_loadu_epi16(((rows >> t) & 1u) ? first_lanes32(s.D - d0) : 0u,
                                                           src + t * s.v_token_stride + d0));
          out[n] = Chunk{dst, dpad, sp.buf + c, true};
        }
      } else {
        const uint16_t* src = V + sp.v_offset + c;  // row d at + d * bs
        out[n] = Chunk{src, s.bs, (sp.buf + c) / 2, false};
        if (partial) {  // token columns [lo - c, hi - c) of every dim row, zero elsewhere
          uint16_t* dst = ts.stage[staged++];
          const __mmask32 cols = lanes32(sp.lo - c, sp.hi - c), all = first_lanes32(tc);
          for (int d = 0; d < s.D; ++d)
            _mm512_mask_storeu_epi16(dst + d * tc, all,
                                     _mm512_maskz_loadu_epi16(cols, src + d * s.bs));
          out[n] = Chunk{dst, tc, (sp.buf + c) / 2, true};
        }
      }
      ++n;
    }
  }
  return n;
}

// Token-major P rows for heads [g0, g0 + gt) of a tile of gm: row g = (bf16 p, 0) pairs, row
// gm + g = (0, bf16 p), slot columns (row stride L), 0 outside [lo, hi).
inline void pack_probs_token_major(const float* probs, int L, int g0, int gt, int gm, int lo,
                                   int hi, uint32_t* pa) {
  for (int g = 0; g < gt; ++g)
    for (int i = lo & ~15; i < hi; i += 16) {
      const __m512 p = _mm512_maskz_loadu_ps(lane_mask(lo - i, hi - i),
                                             probs + (g0 + g) * static_cast<int64_t>(L) + i);
      const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p));
      _mm512_storeu_si512(pa + g * static_cast<int64_t>(L) + i, h);
      _mm512_storeu_si512(pa + (gm + g) * static_cast<int64_t>(L) + i, _mm512_slli_epi32(h, 16));
    }
}

// vLLM-layout P^T: pb[k][g] (rows of 16) = (bf16 p[g][2 k], bf16 p[g][2 k + 1]) for heads
// [g0, g0 + gt), slots [lo & ~31, hi) rounded up to 32, 0 outside [lo, hi).
inline void pack_probs_vllm(const float* probs, int L, int g0, int gt, int lo, int hi,
                            uint32_t* pb) {
  const __m512i cols = column_index(0);
  for (int g = 0; g < gt; ++g) {
    const float* p = probs + (g0 + g) * static_cast<int64_t>(L);
    for (int i = lo & ~31; i < hi; i += 32) {
      const __m512 a = _mm512_maskz_loadu_ps(lane_mask(lo - i, hi - i), p + i);
      const __m512 b = _mm512_maskz_loadu_ps(lane_mask(lo - i - 16, hi - i - 16), p + i + 16);
      const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // lane k: (p[i + 2k], p[i + 2k + 1])
      _mm512_i32scatter_epi32(pb + (i / 2) * 16 + g, cols, pairs, 4);
    }
  }
}

// Token-major PV of all G heads: head tiles of gm, dims in passes of up to 4 x 32 (C tmm0-3).
inline void pv_token_major(const Chunk* chunks, int n, const float* probs, const TaskShape& s,
                           int G, int lo, int hi, const float* norm, float* out,
                           int64_t out_stride, PrefetchStream& pf, const TileScratch& ts) {
  const int gm = tile_size(G, kPvTokenHeads), nd = (s.D + 31) / 32;
  const __m512i even_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i even_hi =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (int g0 = 0; g0 < G; g0 += gm) {
    const int gt = std::min(gm, G - g0);
    pack_probs_token_major(probs, s.L, g0, gt, gm, lo, hi, ts.p);
    for (int k0 = 0; k0 < nd; k0 += 4) {
      const int nk = std::min(4, nd - k0);
      for (int k = 0; k < nk; ++k) zero_tile(k);
      for (int i = 0; i < n; ++i) {
        if (g0 == 0 && k0 == 0) pf.step();  // one step per chunk (run_partition's count)
        _tile_loadd(4, ts.p + chunks[i].p, 4 * s.L);
        for (int k = 0; k < nk; ++k) {
          const int d0 = 32 * (k0 + k);
          const uint16_t* b = chunks[i].v + d0;
          int64_t b_stride = 2 * chunks[i].stride;
          if (s.D - d0 < 32 && !chunks[i].staged) {  // the rows' last dims, zero padded
            for (int t = 0; t < 16; ++t)
              _mm512_storeu_si512(ts.vpad + 32 * t,
                                  _mm512_maskz_loadu_epi16(first_lanes32(s.D - d0),
                                                           b + t * chunks[i].stride));
            b = ts.vpad, b_stride = 64;
          }
          _tile_loadd(5, b, b_stride);
          dp_a4_b5(k);
        }
      }
      for (int k = 0; k < nk; ++k) store_tile(k, ts.c + 256 * k);
      for (int k = 0; k < nk; ++k)
        for (int g = 0; g < gt; ++g) {  // rows g: even dims, gm + g: odd dims
          const float* c = ts.c + 256 * k;
          const __m512 even = _mm512_loadu_ps(c + 16 * g), odd = _mm512_loadu_ps(c + 16 * (gm + g));
          const __m512 scale = _mm512_set1_ps(norm[g0 + g]);
          float* o = out + (g0 + g) * out_stride + 32 * (k0 + k);
          const int dims = s.D - 32 * (k0 + k);
          _mm512_mask_storeu_ps(o, lane_mask(0, dims),
                                _mm512_mul_ps(scale, _mm512_permutex2var_ps(even, even_lo, odd)));
          _mm512_mask_storeu_ps(o + 16, lane_mask(0, dims - 16),
                                _mm512_mul_ps(scale, _mm512_permutex2var_ps(even, even_hi, odd)));
        }
    }
  }
}

// Passes of up to 6 C tiles (16 dims each) over D / 16 dim tiles, balanced.
inline int vllm_pv_passes(int D) { return (D / 16 + 5) / 6; }

// vLLM-layout PV of all G heads: head tiles of gm, dims in passes of up to 6 x 16 (C tmm0-5).
// pf: one step per chunk of the first head tile's first pass.
inline void pv_vllm(const Chunk* chunks, int n, const float* probs, const TaskShape& s, int G,
                    int lo, int hi, const float* norm, float* out, int64_t out_stride,
                    PrefetchStream& pf, const TileScratch& ts) {
  const int gm = tile_size(G, kPvVllmHeads), tiles16 = s.D / 16, passes = vllm_pv_passes(s.D);
  for (int g0 = 0; g0 < G; g0 += gm) {
    const int gt = std::min(gm, G - g0);
    pack_probs_vllm(probs, s.L, g0, gt, lo, hi, ts.p);
    for (int pass = 0, j0 = 0; pass < passes; ++pass) {
      const int nj = (tiles16 - j0 + (passes - pass) - 1) / (passes - pass);
      for (int j = 0; j < nj; ++j) zero_tile(j);
      for (int i = 0; i < n; ++i) {
        if (g0 == 0 && pass == 0) pf.step();
        _tile_loadd(7, ts.p + 16 * chunks[i].p, 64);
        for (int j = 0; j < nj; ++j) {
          _tile_loadd(6, chunks[i].v + 16 * (j0 + j) * chunks[i].stride, 2 * chunks[i].stride);
          dp_a6_b7(j);
        }
      }
      for (int j = 0; j < nj; ++j) {
        store_tile(j, ts.c);  // [16 dims][heads]
        for (int g = 0; g < gt; ++g)
          _mm512_storeu_ps(out + (g0 + g) * out_stride + 16 * (j0 + j),
                           _mm512_mul_ps(_mm512_set1_ps(norm[g0 + g]),
                                         _mm512_i32gather_ps(column_index(g), ts.c, 4)));
      }
      j0 += nj;
    }
  }
}

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
