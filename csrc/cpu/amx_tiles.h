// amx_tiles.h — the AMX tile pieces of the "amx" variant (isa_amx.cpp says what each tile holds)
// and its `struct Isa`: the AVX-512 layer plus the hooks partition_kernel.h's run_partition calls
// for a BF16Tiles cache:
//   tiles_begin<F>(q, G, nh, s) packs the query of the item's nh KV heads' G heads each for the
//                               QK tiles, loads QK's tile configuration; returns the tile scratch
//   tiles_qk_blocks_per_call<F>(s)   how many blocks one tiles_qk_blocks call takes (<= 4)
//   tiles_qk_blocks<F>(group, G, qk_scale, s, tiles, j)   the logits of the group's blocks for
//                               the G heads of the item's KV head j (logits [G][s.L] at each
//                               block's slot 0), prefetching the group's slices into L2 meanwhile
//   tiles_pv<F>(V, spans, nspans, probs, s, G, norm, out, out_stride, pf, tiles)   the output
//                               rows; loads PV's configuration, releases the tiles after; one
//                               pf.step() per V chunk, tiles_pv_steps<F>(tokens, s) in all
// Included by isa_amx.cpp only, inside its AMX target region, after avx512_layer.h.
#pragma once

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

float* tile_scratch(size_t floats);  // isa_amx.cpp, compiled for the baseline ISA

// ldtilecfg's 64-byte operand (palette 1): rows and bytes per row of each tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int t, int r, int bytes) {
    rows[t] = static_cast<uint8_t>(r);
    colsb[t] = static_cast<uint16_t>(bytes);
  }
  // NOTE: an asm operand of all 64 bytes: GCC 12's _tile_loadconfig names only 8 of them as read,
  // so the stores of rows / colsb were dropped as dead and the next tile instruction faulted.
  void load() const { asm volatile("ldtilecfg %0" : : "m"(*this)); }
};

// The tile intrinsics paste the tile number into the instruction: literals only, hence switches.
inline void zero_tile(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;
    default: _tile_zero(5); break;
  }
}
inline void store_tile(int t, float* dst) {  // rows of 64 bytes
  switch (t) {
    case 0: _tile_stored(0, dst, 64); break;
    case 1: _tile_stored(1, dst, 64); break;
    case 2: _tile_stored(2, dst, 64); break;
    case 3: _tile_stored(3, dst, 64); break;
    case 4: _tile_stored(4, dst, 64); break;
    default: _tile_stored(5, dst, 64); break;
  }
}
inline void dp_a4_b5(int c) {  // C tile c += tmm4 x tmm5
  switch (c) {
    case 0: _tile_dpbf16ps(0, 4, 5); break;
    case 1: _tile_dpbf16ps(1, 4, 5); break;
    case 2: _tile_dpbf16ps(2, 4, 5); break;
    default: _tile_dpbf16ps(3, 4, 5); break;
  }
}
inline void dp_a6_b5(int c) {  // C tile c += tmm6 x tmm5
  switch (c) {
    case 0: _tile_dpbf16ps(0, 6, 5); break;
    case 1: _tile_dpbf16ps(1, 6, 5); break;
    case 2: _tile_dpbf16ps(2, 6, 5); break;
    default: _tile_dpbf16ps(3, 6, 5); break;
  }
}
inline void dp_a6_b7(int c) {  // C tile c += tmm6 x tmm7
  switch (c) {
    case 0: _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 6, 7); break;
    case 3: _tile_dpbf16ps(3, 6, 7); break;
    case 4: _tile_dpbf16ps(4, 6, 7); break;
    default: _tile_dpbf16ps(5, 6, 7); break;
  }
}

// Most heads in one head tile: QK token-major (C / B columns: 16 fp32), QK vLLM (A / C rows: 4
// per head), PV token-major (A / C rows: 2 per head), PV vLLM (C / B columns).
constexpr int kQkTokenHeads = 16, kQkVllmHeads = 4, kPvTokenHeads = 8, kPvVllmHeads = 16;

// Heads per tile: G heads in the fewest tiles of at most `most`, equal but for the last one. A
// last, smaller tile runs with the same configuration: its extra rows / columns read other heads'
// (or zero) operands and are never stored.
inline int tile_size(int G, int most) {
  const int tiles = (G + most - 1) / most;
  return (G + tiles - 1) / tiles;
}

inline int round32(int n) { return (n + 31) & ~31; }

inline __mmask32 first_lanes32(int n) {
  return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : (1u << n) - 1u;
}
inline __mmask32 lanes32(int lo, int hi) { return first_lanes32(hi) & ~first_lanes32(lo); }

// K rows of 8 dims per chunk of vLLM's layout's QK (one or two A tiles of at most 16 pairs).
inline int vllm_k_rows_per_chunk(int D) { return D / 8 <= 16 ? D / 8 : D / 16; }

// The item's tile scratch (tile_scratch), as 16-float-aligned parts:
//   p      one head tile's probabilities packed for PV
//   c      four 16 x 16 fp32 C tiles stored
//   kpad   [16][32] bf16: a last K chunk of head_size % 32 dims, zero padded
//   vpad   [16][32] bf16: the same for V (token-major)
//   stage  2 x the V of a chunk partly outside the partition, zeroed outside
//   q      the query packed for QK (pack_query_token_major / pack_query_vllm), per KV head of
//          the item (last: the other parts do not depend on their count)
struct TileScratch {
  uint32_t* p;
  float* c;
  uint16_t* kpad;
  uint16_t* vpad;
  uint16_t* stage[2];
  uint32_t* q0;

  static int64_t part16(int64_t floats) { return (floats + 15) & ~int64_t{15}; }
  static int64_t q_floats(int G, int D) { return part16(int64_t{round32(D)} / 2 * (G + 16) + 16); }
  static int64_t p_floats(const TaskShape& s) { return part16(16 * int64_t{s.L} + 512); }
  static int64_t stage_floats(int D) { return 16 * int64_t{round32(D)}; }
  static int64_t floats(int G, int nh, const TaskShape& s) {
    return p_floats(s) + 1024 + 256 + 256 + 2 * stage_floats(s.D) + nh * q_floats(G, s.D);
  }
  TileScratch(float* base, int G, const TaskShape& s) : G_(G), D_(s.D) {
    float* at = base;
    p = reinterpret_cast<uint32_t*>(at), at += p_floats(s);
    c = at, at += 1024;
    kpad = reinterpret_cast<uint16_t*>(at), at += 256;
    vpad = reinterpret_cast<uint16_t*>(at), at += 256;
    stage[0] = reinterpret_cast<uint16_t*>(at), at += stage_floats(s.D);
    stage[1] = reinterpret_cast<uint16_t*>(at), at += stage_floats(s.D);
    q0 = reinterpret_cast<uint32_t*>(at);
  }
  uint32_t* q(int j) const { return q0 + j * q_floats(G_, D_); }  // KV head j's packed query

 private:
  int G_, D_;
};

// Lane i of a stored C tile's column g (rows of 16 floats): i * 16 + g.
inline __m512i column_index(int g) {
  return _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(16)),
      _mm512_set1_epi32(g));
}

// ---- QK ----

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

// ---- PV ----

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

struct Isa : Avx512Layer {
  template <KvForm F>
  static float* tiles_begin(const float* q, int G, int nh, const TaskShape& s) {
    float* base = tile_scratch(static_cast<size_t>(TileScratch::floats(G, nh, s)));
    const TileScratch ts(base, G, s);
    TileConfig cfg;
    if constexpr (F == KvForm::kTokenMajor) {
      // C tmm0-3 [16 tokens][gm], A tmm4 = K [16 tokens][32 dims], B tmm5 = Q^T [16 pairs][gm]
      const int gm = tile_size(G, kQkTokenHeads);
      for (int j = 0; j < nh; ++j) pack_query_token_major(q + j * G * s.D, G, s.D, ts.q(j));
      for (int t = 0; t < 4; ++t) cfg.set(t, 16, 4 * gm);
      cfg.set(4, 16, 64);
      cfg.set(5, 16, 4 * gm);
    } else {
      // C tmm0-3 [(g, j)][16], A tmm4 / tmm6 = Q [(g, j)][kr pairs], B tmm5 = K [kr rows][64 B]
      const int gm = tile_size(G, kQkVllmHeads), kr = vllm_k_rows_per_chunk(s.D);
      pack_query_vllm(q, G, s.D, gm, kr, ts.q(0));  // (nh == 1: work_items.h)
      for (int t = 0; t < 4; ++t) cfg.set(t, 4 * gm, 64);
      cfg.set(4, 4 * gm, 4 * kr);
      cfg.set(6, 4 * gm, 4 * kr);
      cfg.set(5, kr, 64);
    }
    cfg.load();
    return base;
  }

  // Blocks per tiles_qk_blocks call: token-major 64 tokens (four C tiles of 16), at least one
  // block; vLLM's layout one (its 16 tokens fill four C tiles already).
  template <KvForm F>
  static int tiles_qk_blocks_per_call(const TaskShape& s) {
    return F == KvForm::kTokenMajor ? std::max(1, 64 / s.bs) : 1;
  }

  // pf.step() calls of tiles_pv over `tokens` tokens: one per V chunk.
  template <KvForm F>
  static int tiles_pv_steps(int tokens, const TaskShape& s) {
    return (tokens + chunk_tokens<F>(s) - 1) / chunk_tokens<F>(s);
  }

  template <KvForm F>
  static void tiles_qk_blocks(const TileQkBlocks<uint16_t>& group, int G, float qk_scale,
                              const TaskShape& s, float* tiles, int j) {
    const TileScratch ts(tiles, G, s);
    // per block, a share of its prefetch slices per 16 tokens and 32 dims (token-major) or per
    // 4 tokens and chunk of K rows (vLLM's layout: a head size over 128 takes two chunks, and
    // half the lines per share ran 3% faster from DRAM on Qwen-like rows, measured)
    const int rows = s.bs / 16 * (F == KvForm::kTokenMajor
                                      ? (s.D + 31) / 32
                                      : 4 * (s.D / 8 / vllm_k_rows_per_chunk(s.D)));
    RowSharePrefetch pf[4] = {
        {group.pf_k[0], group.pf_v[0], s, rows},
        {group.n > 1 ? group.pf_k[1] : nullptr, group.n > 1 ? group.pf_v[1] : nullptr, s, rows},
        {group.n > 2 ? group.pf_k[2] : nullptr, group.n > 2 ? group.pf_v[2] : nullptr, s, rows},
        {group.n > 3 ? group.pf_k[3] : nullptr, group.n > 3 ? group.pf_v[3] : nullptr, s, rows}};
    if constexpr (F == KvForm::kTokenMajor) {
      qk_token_major_blocks(group, G, qk_scale, s, pf, ts.q(j), ts);
    } else {
      for (int b = 0; b < group.n; ++b)
        qk_vllm_block(group.k[b], G, qk_scale, s, group.logits[b], pf[b], ts.q(j), ts);
    }
  }

  template <KvForm F>
  static void tiles_pv(const uint16_t* V, const Span* spans, int nspans, const float* probs,
                       const TaskShape& s, int G, const float* norm, float* out,
                       int64_t out_stride, PrefetchStream& pf, float* tiles) {
    const TileScratch ts(tiles, G, s);
    Chunk chunks[kMaxChunks];
    const int n = v_chunks<F>(V, spans, nspans, s, ts, chunks);
    const int lo = nspans > 0 ? spans[0].buf + spans[0].lo : 0;
    const int hi = nspans > 0 ? spans[nspans - 1].buf + spans[nspans - 1].hi : 0;
    TileConfig cfg;
    if constexpr (F == KvForm::kTokenMajor) {
      // C tmm0-3 [2 gm][16 dim pairs], A tmm4 = P [2 gm][16 tokens], B tmm5 = V [16][32 dims]
      const int gm = tile_size(G, kPvTokenHeads);
      for (int t = 0; t < 4; ++t) cfg.set(t, 2 * gm, 64);
      cfg.set(4, 2 * gm, 64);
      cfg.set(5, 16, 64);
      cfg.load();
      pv_token_major(chunks, n, probs, s, G, lo, hi, norm, out, out_stride, pf, ts);
    } else {
      // C tmm0-5 [16 dims][gm], A tmm6 = V [16 dims][tc tokens], B tmm7 = P^T [tc / 2][gm]
      const int gm = tile_size(G, kPvVllmHeads), tc = chunk_tokens<F>(s);
      for (int t = 0; t < 6; ++t) cfg.set(t, 16, 4 * gm);
      cfg.set(6, 16, 2 * tc);
      cfg.set(7, tc / 2, 4 * gm);
      cfg.load();
      pv_vllm(chunks, n, probs, s, G, lo, hi, norm, out, out_stride, pf, ts);
    }
    _tile_release();
  }
};

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
