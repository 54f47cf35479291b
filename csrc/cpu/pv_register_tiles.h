// pv_register_tiles.h — PV on register tiles: the output rows of a head tile over the
// partition's V, vLLM's layout (tokens in lanes, one horizontal sum per dim) and token-major (dims
// in lanes, block by block) (partition_kernel.h's overview, "PV").
// Included by partition_kernel.h (after its Vec, Mask, IsaFor, form_x and tile_heads), in the
// namespace of the ISA that includes it: compiled once per ISA file, like the algorithm.
#ifndef PA_ISA
#error "pv_register_tiles.h is included by partition_kernel.h, inside an ISA file's target region"
#endif

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

// Most query heads in one register tile of vLLM-layout PV on this cache.
template <typename Cache>
constexpr int row_pv_heads() {
  return std::is_same_v<Cache, E4M3> ? Isa::kE4m3RowPvHeads : Isa::kRowPvHeads;
}

// acc[g][dt] += p[g][16 tokens] * V[dt][16 tokens] for the lanes in m. pc: the heads' p of the
// chunk (head stride s.L); vc: V row d0 of the chunk (row stride kBs, or s.bs where kBs is 0).
// Inlined with a constant full mask for whole chunks, so the ISAs without mask registers test
// nothing there.
template <typename Cache, int GT, int DT, int kBs = 0>
inline void pv_chunk(const float* pc, const typename Cache::storage* vc, const TaskShape& s, Mask m,
                     Vec (&acc)[GT][DT]) {
  const int64_t bs = kBs > 0 ? kBs : s.bs;
  if constexpr (Isa::kRowProbsInRegisters) {  // p loaded once, kept in registers across dims
    Vec pv[GT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) pv[g] = Isa::load(pc + g * s.L, m);
#pragma GCC unroll 8
    for (int dt = 0; dt < DT; ++dt) {
      const Vec vr = Isa::template load_cache<Cache>(vc + dt * bs, m);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) acc[g][dt] = Isa::pv_fmadd(vr, pv[g], acc[g][dt]);
    }
  } else {  // few registers: p re-read from L1 per dim (an FMA memory operand), more accumulators
#pragma GCC unroll 8
    for (int dt = 0; dt < DT; ++dt) {
      const Vec vr = Isa::template load_cache<Cache>(vc + dt * bs, m);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g)
        acc[g][dt] = Isa::pv_fmadd(vr, Isa::load(pc + g * s.L, m), acc[g][dt]);
    }
  }
}

// The block is all in the partition.
inline bool whole_chunks(const TaskShape& s, const Span& sp) { return sp.lo == 0 && sp.hi == s.bs; }

// The slots [sp.lo, sp.hi) of one block into acc: 16-token chunks, lanes outside masked.
template <typename Cache, int GT, int DT>
inline void pv_span_masked(const typename Cache::storage* vb, const Span& sp, const float* probs,
                           const TaskShape& s, Vec (&acc)[GT][DT]) {
  for (int tc = sp.lo & ~15; tc < sp.hi; tc += 16)
    pv_chunk<Cache, GT, DT>(probs + sp.buf + tc, vb + tc, s, Isa::lanes(sp.lo - tc, sp.hi - tc),
                            acc);
}

// Whole blocks [w0, w1) (block_size a multiple of 16) into acc: unmasked 16-token chunks at row
// row0. kBs: the block size at compile time (16, 32: the chunk loop unrolled, V rows at fixed
// offsets), or 0: s.bs, read once (NOTE: a loop bound of s.bs was re-read per block: one chunk
// per block at 16, so the per-block overhead was a third of the chunk's instructions).
template <typename Cache, int GT, int DT, int kBs>
PA_DECODE_INLINE void pv_whole_blocks(const typename Cache::storage* V, const Span* spans, int w0,
                                      int w1, int64_t row0, const float* probs,
                                      const TaskShape& s, Vec (&acc)[GT][DT]) {
  const int bs = kBs > 0 ? kBs : s.bs;
  const Mask all = Isa::lanes(0, 16);
  for (int i = w0; i < w1; ++i) {
    const auto* vb = V + spans[i].v_offset + row0;
    const float* pb = probs + spans[i].buf;
#pragma GCC unroll 2
    for (int tc = 0; tc < bs; tc += 16) pv_chunk<Cache, GT, DT, kBs>(pb + tc, vb + tc, s, all, acc);
  }
}

// out[g][d] = norm[g] * sum over the partition's tokens of p[g][t] * V[t][d], heads [0, GT),
// head dims in tiles of DT (D % DT == 0). probs: [GT][L]; out row g at out + g * out_stride.
// Only the first and the last block of a partition can be partly in it: the blocks between are
// whole, and when block_size is a multiple of 16 they run in unmasked 16-token chunks (the
// ISAs without mask registers test nothing there). pf steps once per (dim tile, block).
template <typename Cache, int GT, int DT>
void pv_tile(const typename Cache::storage* V, const Span* spans, int nspans, const float* probs,
             const TaskShape& s, const float* norm, float* out, int64_t out_stride,
             PrefetchStream& pf) {
  // blocks [w0, w1) are whole; the others (at most the first and the last) take masked chunks
  int w0 = nspans, w1 = nspans;
  if (nspans > 0 && s.bs % 16 == 0) {
    w0 = whole_chunks(s, spans[0]) ? 0 : 1;
    w1 = std::max(w0, whole_chunks(s, spans[nspans - 1]) ? nspans : nspans - 1);
  }
  for (int d0 = 0; d0 < s.D; d0 += DT) {
    Vec acc[GT][DT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int dt = 0; dt < DT; ++dt) acc[g][dt] = Isa::zero();
    pf.step(nspans);
    const int64_t row0 = static_cast<int64_t>(d0) * s.bs;
    for (int i = 0; i < w0; ++i)
      pv_span_masked<Cache, GT, DT>(V + spans[i].v_offset + row0, spans[i], probs, s, acc);
    if (s.bs == 16)
      pv_whole_blocks<Cache, GT, DT, 16>(V, spans, w0, w1, row0, probs, s, acc);
    else if (s.bs == 32)
      pv_whole_blocks<Cache, GT, DT, 32>(V, spans, w0, w1, row0, probs, s, acc);
    else
      pv_whole_blocks<Cache, GT, DT, 0>(V, spans, w0, w1, row0, probs, s, acc);
    for (int i = w1; i < nspans; ++i)
      pv_span_masked<Cache, GT, DT>(V + spans[i].v_offset + row0, spans[i], probs, s, acc);
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) {
      float* o = out + g * out_stride + d0;
      if constexpr (DT % 4 == 0) {
#pragma GCC unroll 8
        for (int dt = 0; dt < DT; dt += 4)
          Isa::reduce4(acc[g][dt], acc[g][dt + 1], acc[g][dt + 2], acc[g][dt + 3], norm[g], o + dt);
      } else {
#pragma GCC unroll 8
        for (int dt = 0; dt < DT; ++dt) o[dt] = norm[g] * Isa::reduce_add(acc[g][dt]);
      }
    }
  }
}

// Vectors of 16 dims per token-major PV pass for a tile of gt heads and nvec vectors a row:
// the layer's register tile (pv_vecs) unless its narrow tile divides the row and the wide one
// does not (fewer empty vectors).
constexpr int token_pv_vecs(int gt, int nvec) {
  const int wide = Isa::pv_vecs(gt, true), narrow = Isa::pv_vecs(gt, false);
  return nvec % wide == 0 || nvec % narrow != 0 ? wide : narrow;
}

// Heads of the token-major PV tile that starts at head `done` of G: tile_heads, or with the
// layer's kTokenPvSixes tiles of six while six or more remain (4 + 3 for the last seven, not
// 6 + 1): G = 8 is 6 + 2, 12 is 6 + 6.
inline int token_pv_tile_heads(int G, int done) {
  const int remaining = G - done;
  if (Isa::kTokenPvSixes && remaining >= 6 && remaining != 7) return 6;
  return tile_heads(G, done, Isa::kTokenPvHeads);
}

// Passes of a token-major PV head tile of gt heads over a row of nvec vectors.
constexpr int token_pv_passes(int gt, int nvec) {
  return (nvec + token_pv_vecs(gt, nvec) - 1) / token_pv_vecs(gt, nvec);
}

// pf.step() calls of a token-major PV: one per token, pass and head tile of G heads.
inline int token_pv_steps(const Span* spans, int nspans, int G, int D) {
  int passes = 0;
  for (int g0 = 0; g0 < G;) {
    const int gt = token_pv_tile_heads(G, g0);
    passes += token_pv_passes(gt, (D + 15) / 16);
    g0 += gt;
  }
  int tokens = 0;
  for (int i = 0; i < nspans; ++i) tokens += spans[i].hi - spans[i].lo;
  return passes * tokens;
}

// acc[g][dt] += p[g][t] * V[t][16 dims of vector dt] for the n tokens at vt (token stride
// vstride) with probabilities at pt (head stride s.L). kFull: every vector's lanes are dims (no
// mask test in the loop); else m[dt]. Token t also prefetches the same dims of token t at ahead
// (the next block, n_ahead tokens; may be null) into L1.
template <typename Cache, int GT, int DT, bool kFull>
inline void pv_tokens(const typename Cache::storage* vt, int64_t vstride, const float* pt, int n,
                      const TaskShape& s, const Mask (&m)[DT], Vec (&acc)[GT][DT],
                      const typename Cache::storage* ahead, int n_ahead, PrefetchStream& pf) {
  constexpr int kPassBytes = 16 * DT * static_cast<int>(sizeof(typename Cache::storage));
  for (int t = 0; t < n; ++t, vt += vstride, ++pt) {
    pf.step();
    if (t < n_ahead) {
      const auto* a = reinterpret_cast<const char*>(ahead + t * vstride);
#pragma GCC unroll 8
      for (int l = 0; l < kPassBytes; l += 64) prefetch_l1(a + l);
    }
    Vec pg[Isa::kTokenProbsInRegisters ? GT : 1];  // else broadcast per use (few registers)
    if constexpr (Isa::kTokenProbsInRegisters) {
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) pg[g] = Isa::set1(pt[g * s.L]);
    }
#pragma GCC unroll 8
    for (int dt = 0; dt < DT; ++dt) {
      const Vec vr =
          Isa::template load_cache<Cache>(vt + 16 * dt, kFull ? Isa::lanes(0, 16) : m[dt]);
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) {
        if constexpr (Isa::kTokenProbsInRegisters)
          acc[g][dt] = Isa::fmadd(vr, pg[g], acc[g][dt]);
        else
          acc[g][dt] = Isa::fmadd(vr, Isa::set1(pt[g * s.L]), acc[g][dt]);
      }
    }
  }
}

// The token-major form of PV, one block (spans[i] of nspans) for one head tile: a vector is 16
// dims of one token's V, so the accumulators acc[g][dt] hold 16 output dims each and take
// p[g][t] broadcast per token (no horizontal sum). DT vectors (16 * DT dims) per pass; the last
// vectors hold head_size % 16 dims or none (masked). Between blocks the sums live in the output
// rows out[g] (the first block starts from 0, the last one scales them by norm). Only the slots
// [lo, hi) are read. prefetch_next: the next block's slots are prefetched into L1 alongside, pass
// by pass.
template <typename Cache, int GT, int DT>
void pv_block_tokens(const typename Cache::storage* V, const Span* spans, int i, int nspans,
                     const float* probs, const TaskShape& s, const float* norm, float* out,
                     int64_t out_stride, bool prefetch_next, PrefetchStream& pf) {
  const int nvec = (s.D + 15) / 16;
  const Span& sp = spans[i];
  const Span* next = prefetch_next && i + 1 < nspans ? &spans[i + 1] : nullptr;
  const int n_ahead = next ? next->hi - next->lo : 0;
  const float* pt = probs + sp.buf + sp.lo;
  for (int v0 = 0; v0 < nvec; v0 += DT) {
    Mask m[DT];
#pragma GCC unroll 8
    for (int dt = 0; dt < DT; ++dt) m[dt] = Isa::lanes(0, s.D - 16 * (v0 + dt));
    Vec acc[GT][DT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int dt = 0; dt < DT; ++dt)
        acc[g][dt] =
            i == 0 ? Isa::zero() : Isa::load(out + g * out_stride + 16 * (v0 + dt), m[dt]);
    const auto* vt = V + sp.v_offset + sp.lo * s.v_token_stride + 16 * v0;
    const auto* ahead =
        next ? V + next->v_offset + next->lo * s.v_token_stride + 16 * v0 : nullptr;
    if (16 * (v0 + DT) <= s.D)
      pv_tokens<Cache, GT, DT, true>(vt, s.v_token_stride, pt, sp.hi - sp.lo, s, m, acc, ahead,
                                     n_ahead, pf);
    else
      pv_tokens<Cache, GT, DT, false>(vt, s.v_token_stride, pt, sp.hi - sp.lo, s, m, acc, ahead,
                                      n_ahead, pf);
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g) {
      const Vec scale = Isa::set1(i + 1 == nspans ? norm[g] : 1.0f);  // done: scaled
#pragma GCC unroll 8
      for (int dt = 0; dt < DT; ++dt)
        Isa::store(out + g * out_stride + 16 * (v0 + dt), Isa::mul(acc[g][dt], scale), m[dt]);
    }
  }
}

template <typename Cache, int GT>
void pv_block_tile_of(const typename Cache::storage* V, const Span* spans, int i, int nspans,
                      const float* probs, const TaskShape& s, const float* norm, float* out,
                      int64_t out_stride, bool prefetch_next, PrefetchStream& pf) {
  if constexpr (std::is_same_v<Cache, BF16Dot>) {  // probabilities in bf16, probs_to_bf16
    return IsaFor<Cache>::type::template pv_bf16dot_token_major<GT>(
        V, spans, i, nspans, reinterpret_cast<const uint16_t*>(probs), s, norm, out, out_stride,
        prefetch_next, pf);
  } else {
    constexpr int kWide = Isa::pv_vecs(GT, true), kNarrow = Isa::pv_vecs(GT, false);
    if (kWide == kNarrow || token_pv_vecs(GT, (s.D + 15) / 16) == kWide)
      return pv_block_tokens<Cache, GT, kWide>(V, spans, i, nspans, probs, s, norm, out,
                                               out_stride, prefetch_next, pf);
    return pv_block_tokens<Cache, GT, kNarrow>(V, spans, i, nspans, probs, s, norm, out,
                                               out_stride, prefetch_next, pf);
  }
}

// Token-major PV of all G heads (out row g at out + g * out_stride, probs [G][L]): block by
// block, every head tile and pass over the block's tokens, so a block's V slice comes into L1
// once and serves them all (tile by tile and pass by pass over the whole partition, each would
// bring every token's lines from L2 again). The first head tile prefetches the next block into
// L1; pf steps once per token, pass and tile (token_pv_steps).
template <typename Cache>
void pv_token_major(const typename Cache::storage* V, const Span* spans, int nspans,
                    const float* probs, const TaskShape& s, int G, const float* norm, float* out,
                    int64_t out_stride, PrefetchStream& pf) {
  for (int i = 0; i < nspans; ++i) {
    for (int g0 = 0; g0 < G;) {
      const int gt = token_pv_tile_heads(G, g0);
      const float* pg = probs + static_cast<int64_t>(g0) * s.L;
      float* og = out + g0 * out_stride;
      const bool pf_next = g0 == 0;
      switch (gt) {
        case 1:
          pv_block_tile_of<Cache, 1>(V, spans, i, nspans, pg, s, norm + g0, og, out_stride,
                                     pf_next, pf);
          break;
        case 2:
          pv_block_tile_of<Cache, 2>(V, spans, i, nspans, pg, s, norm + g0, og, out_stride,
                                     pf_next, pf);
          break;
        case 3:
          pv_block_tile_of<Cache, 3>(V, spans, i, nspans, pg, s, norm + g0, og, out_stride,
                                     pf_next, pf);
          break;
        case 4:
          if constexpr (Isa::kTokenPvHeads >= 4)
            pv_block_tile_of<Cache, 4>(V, spans, i, nspans, pg, s, norm + g0, og, out_stride,
                                       pf_next, pf);
          break;
        default:
          if constexpr (Isa::kTokenPvHeads >= 6)
            pv_block_tile_of<Cache, 6>(V, spans, i, nspans, pg, s, norm + g0, og, out_stride,
                                       pf_next, pf);
      }
      g0 += gt;
    }
  }
  if (nspans == 0)  // nothing read: the output is 0
    for (int g = 0; g < G; ++g) std::fill(out + g * out_stride, out + g * out_stride + s.D, 0.0f);
}

template <typename Cache, KvForm F, int GT>
void pv_tile_of(const typename Cache::storage* V, const Span* spans, int nspans, const float* probs,
                const TaskShape& s, const float* norm, float* out, int64_t out_stride,
                PrefetchStream& pf) {
  const bool wide = s.D % 8 == 0;
  constexpr int kWide = Isa::pv_rows(GT, true), kNarrow = Isa::pv_rows(GT, false);
  static_assert(F == KvForm::kVllm, "token-major PV: pv_token_major");
  if constexpr (std::is_same_v<Cache, BF16Dot>) {  // probabilities in bf16, probs_to_bf16
    const auto* pb = reinterpret_cast<const uint16_t*>(probs);
    if (wide && Isa::pv_rows(GT, true) == 8)
      return IsaFor<Cache>::type::template pv_bf16dot<GT, 8>(V, spans, nspans, pb, s, norm, out,
                                                             out_stride, pf);
    return IsaFor<Cache>::type::template pv_bf16dot<GT, 4>(V, spans, nspans, pb, s, norm, out,
                                                           out_stride, pf);
  } else {
    if (wide && kWide != kNarrow)
      return pv_tile<Cache, GT, kWide>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    return pv_tile<Cache, GT, kNarrow>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
  }
}

template <typename Cache, KvForm F>
void pv_heads(int gt, const typename Cache::storage* V, const Span* spans, int nspans,
              const float* probs, const TaskShape& s, const float* norm, float* out,
              int64_t out_stride, PrefetchStream& pf) {
  switch (gt) {
    case 1:
      return pv_tile_of<Cache, F, 1>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    case 2:
      return pv_tile_of<Cache, F, 2>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
    case 3:
      if constexpr (row_pv_heads<Cache>() >= 3)
        return pv_tile_of<Cache, F, 3>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
      return;
    case 4:
      if constexpr (row_pv_heads<Cache>() >= 4)
        return pv_tile_of<Cache, F, 4>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
      return;
    default:
      if constexpr (row_pv_heads<Cache>() >= 6)
        return pv_tile_of<Cache, F, 6>(V, spans, nspans, probs, s, norm, out, out_stride, pf);
  }
}

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
