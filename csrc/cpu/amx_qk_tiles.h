// amx_qk_tiles.h — QK on AMX tiles ("amx" variant; isa_amx.cpp says what each tile holds): the
// query packed for the tiles once per item, then the logits of a group of blocks, token-major
// (NHD / HND) or on vLLM's layout (the diagonal form). Included by amx_tiles.h only.
#pragma once

#include "amx_tile_ops.h"

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

// qt[pair][h] = (q[h][2 pair], q[h][2 pair + 1]) as bf16 bits for pairs < round32(D) / 2 (zero
// past D), row stride G, 16 zero columns of slack after the last row (a tile's B rows read as
// many columns as the first head tile has heads).
inline void pack_query_token_major(const float* q, int G, int D, uint32_t* qt) {
  const int pairs = round32(D) / 2;
  std::memset(qt + static_cast<int64_t>(pairs) * G, 0, sizeof(uint32_t) * 16);
  const __m512i rows = _mm512_mullo_epi32(  // lane k: row k * G
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(G));
  for (int h = 0; h < G; ++h)
    for (int d0 = 0; d0 < D; d0 += 32) {  // pairs d0 / 2 + k, k < 16 (exact: bf16 values)
      const __m512 lo = _mm512_maskz_loadu_ps(lane_mask(0, D - d0), q + h * D + d0);
      const __m512 hi = _mm512_maskz_loadu_ps(lane_mask(0, D - d0 - 16), q + h * D + d0 + 16);
      _mm512_i32scatter_epi32(qt + (d0 / 2) * G + h, rows, (__m512i)_mm512_cvtne2ps_pbh(hi, lo), 4);
    }
}

// For head tile ti (heads ti * gm + g) and chunk ch of kr K rows: an A tile of rows (g, j)
// (4 gm rows of kr pairs) = (q[8 c + 2 j], q[8 c + 2 j + 1]) of K row c = ch * kr + r, at
// qa + (ti * chunks + ch) * 4 gm kr; rows of heads past G are zero.
inline void pack_query_vllm(const float* q, int G, int D, int gm, int kr, uint32_t* qa) {
  const int rows = D / 8, chunks = rows / kr, tiles = (G + gm - 1) / gm;
  if (G % gm != 0)  // the last tile's rows of heads past G
    std::memset(qa, 0, sizeof(uint32_t) * tiles * chunks * 4 * gm * kr);
  alignas(64) uint32_t pairs[128];  // pair k: (q[h][2 k], q[h][2 k + 1]) as bf16 bits, k < D / 2
  const __m512i every4th =  // lane c: pair 4 c (+ j: dims 8 c + 2 j, + 1)
      _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60);
  const __mmask16 chunk_rows = static_cast<__mmask16>((1u << kr) - 1u);  // kr <= 16
  for (int h = 0; h < G; ++h) {
    const int ti = h / gm, g = h % gm;
    for (int d0 = 0; d0 < D; d0 += 32)  // D: a multiple of 16 (exact: bf16 values)
      _mm512_store_si512(pairs + d0 / 2,
                         (__m512i)_mm512_cvtne2ps_pbh(
                             _mm512_maskz_loadu_ps(lane_mask(0, D - d0 - 16), q + h * D + d0 + 16),
                             _mm512_loadu_ps(q + h * D + d0)));
    for (int j = 0; j < 4; ++j)
      for (int c0 = 0; c0 < rows; c0 += kr) {  // chunk c0 / kr: K rows c0 .. c0 + kr - 1
        const __m512i idx = _mm512_add_epi32(every4th, _mm512_set1_epi32(4 * c0 + j));
        _mm512_mask_storeu_epi32(
            qa + ((ti * chunks + c0 / kr) * 4 * gm + 4 * g + j) * kr, chunk_rows,
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), chunk_rows, idx, pairs, 4));
      }
  }
}

// Token-major: logits[h][t] = qk_scale * q[h] . k[t] for the tokens of the blocks of `group`, all G
// heads. The blocks' 16-token groups fill the four C tiles in turn, so that the tile products of a
// 32-dim chunk are independent (one block of 16 tokens alone would chain them). pf: one
// row-share prefetch per block, a row per 16 tokens and 32 dims.
inline void qk_token_major_blocks(const TileQkBlocks<uint16_t>& group, int G, float qk_scale,
                                  const TaskShape& s, RowSharePrefetch* pf, const uint32_t* qt,
                                  const TileScratch& ts) {
  const int gm = tile_size(G, kQkTokenHeads), per_block = s.bs / 16, total = group.n * per_block;
  const int64_t stride = s.k_token_stride;
  const __m512 scale = _mm512_set1_ps(qk_scale);
  for (int g0 = 0; g0 < G; g0 += gm) {
    const int gt = std::min(gm, G - g0);
    for (int q0 = 0; q0 < total; q0 += 4) {
      const int nt = std::min(4, total - q0);
      const uint16_t* rows[4];  // C tile i: the 16 K rows of token group q0 + i
      float* logits[4];
      RowSharePrefetch* share[4];
      for (int i = 0; i < nt; ++i) {
        const int b = (q0 + i) / per_block, tg = (q0 + i) % per_block;
        rows[i] = group.k[b] + 16 * tg * stride;
        logits[i] = group.logits[b] + 16 * tg;
        share[i] = &pf[b];
        zero_tile(i);
      }
      for (int d0 = 0; d0 < s.D; d0 += 32) {
        _tile_loadd(5, qt + (d0 / 2) * G + g0, 4 * G);
        const int dims = s.D - d0;
        for (int i = 0; i < nt; ++i) {
          if (g0 == 0) share[i]->row();
          const uint16_t* a = rows[i] + d0;
          int64_t a_stride = 2 * stride;
          if (dims < 32) {  // the rows' last dims, zero padded to 32
            for (int t = 0; t < 16; ++t)
              _mm512_storeu_si512(ts.kpad + 32 * t,
                                  _mm512_maskz_loadu_epi16(first_lanes32(dims), a + t * stride));
            a = ts.kpad, a_stride = 64;
          }
          _tile_loadd(4, a, a_stride);
          dp_a4_b5(i);
        }
      }
      for (int i = 0; i < nt; ++i) store_tile(i, ts.c + 256 * i);
      for (int i = 0; i < nt; ++i)
        for (int g = 0; g < gt; ++g)
          _mm512_storeu_ps(logits[i] + (g0 + g) * static_cast<int64_t>(s.L),
                           _mm512_mul_ps(scale, _mm512_i32gather_ps(column_index(g),
                                                                    ts.c + 256 * i, 4)));
    }
  }
}

// vLLM's layout: the same, in the diagonal form (isa_amx.cpp).
inline void qk_vllm_block(const uint16_t* kblk, int G, float qk_scale, const TaskShape& s,
                          float* logits, RowSharePrefetch& pf, const uint32_t* qpack,
                          const TileScratch& ts) {
  const int gm = tile_size(G, kQkVllmHeads), kr = vllm_k_rows_per_chunk(s.D);
  const int chunks = s.D / 8 / kr;
  const int64_t R = s.R;  // elements per K row: 8 dims x bs tokens
  const __m512 scale = _mm512_set1_ps(qk_scale);
  for (int g0 = 0, ti = 0; g0 < G; g0 += gm, ++ti) {
    const int gt = std::min(gm, G - g0);
    const uint32_t* qa = qpack + static_cast<int64_t>(ti) * chunks * 4 * gm * kr;
    _tile_loadd(4, qa, 4 * kr);
    if (chunks > 1) _tile_loadd(6, qa + 4 * gm * kr, 4 * kr);
    for (int t0 = 0; t0 < s.bs; t0 += 16) {
      for (int i = 0; i < 4; ++i) zero_tile(i);
      const uint16_t* k = kblk + 8 * t0;
      for (int qd = 0; qd < 4; ++qd) {  // tokens t0 + 4 qd .. + 3
        if (g0 == 0) pf.row();
        _tile_loadd(5, k + 32 * qd, 2 * R);
        dp_a4_b5(qd);
      }
      if (chunks > 1) {
        k += kr * R;
        for (int qd = 0; qd < 4; ++qd) {
          if (g0 == 0) pf.row();
          _tile_loadd(5, k + 32 * qd, 2 * R);
          dp_a6_b5(qd);
        }
      }
      for (int i = 0; i < 4; ++i) store_tile(i, ts.c + 256 * i);
      for (int g = 0; g < gt; ++g) {
        Avx512Layer::Vec x4[4];  // x = 4 forms: lane 4 u + j = token 4 qd + u's pair-j sums
        for (int qd = 0; qd < 4; ++qd) {
          const float* c = ts.c + 256 * qd + 64 * g;  // rows (g, j) of 16 floats
          __m512 v = _mm512_maskz_loadu_ps(0x1111, c);
          v = _mm512_mask_loadu_ps(v, 0x2222, c + 16);
          v = _mm512_mask_loadu_ps(v, 0x4444, c + 32);
          x4[qd] = _mm512_mask_loadu_ps(v, 0x8888, c + 48);
        }
        _mm512_storeu_ps(logits + (g0 + g) * static_cast<int64_t>(s.L) + t0,
                         _mm512_mul_ps(scale, Avx512Layer::sum_x4(x4[0], x4[1], x4[2], x4[3])));
      }
    }
  }
}

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
