// amx_tiles.h — the "amx" variant's `struct Isa` (isa_amx.cpp says what each tile holds): the
// AVX-512 layer plus the hooks partition_kernel.h's run_partition calls for a BF16Tiles cache,
// over the tile loops of amx_qk_tiles.h and amx_pv_tiles.h (shared pieces: amx_tile_ops.h):
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

#include "amx_tile_ops.h"
#include "amx_qk_tiles.h"
#include "amx_pv_tiles.h"

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

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
