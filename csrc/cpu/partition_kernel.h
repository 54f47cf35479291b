// partition_kernel.h — THE CPU paged-attention algorithm for one work item (sequence, KV head or
// group of adjacent NHD KV heads, 512-token partition), written once against a 16-lane fp32
// vector layer.
//
// Included by each ISA file (isa_<name>.cpp) inside its target region, after it has defined
// `struct Isa` in namespace paged_attn::cpu::PA_ISA; everything here lands in that namespace, so
// every ISA gets its own copy of the code, compiled for that ISA only; the ISA file then defines
// its variant's entry point (attention_kernel.h), usually with PA_DEFINE_ENTRY_POINT (below).
// The layer's contract:
//   Vec, Mask          16 fp32 lanes and a lane selection (Mask lanes(lo, hi): [lo, hi), clamped)
//   zero set1 add sub mul max fmadd(a, b, c) = a * b + c
//   pv_fmadd(v, p, acc)       vLLM-layout PV: acc + v * p as far as the lane sum goes (only the
//                      lane sums of those accumulators are read): fmadd, or the products folded
//                      into fewer registers (AVX2: both 8-lane halves into the low one)
//   load(p, m) store(p, v, m) load_or(p, m, fill) select(m, v)   masked fp32 access: lanes
//                      outside m read nothing (load: 0, load_or: fill) and are not written
//   load_cache<Cache>(p, m)   16 cache elements -> fp32, lanes outside m read nothing and are 0
//   load_token_pair<Cache>(p, stride, ntok, dims)   x = 8 form of a token-major K row: lane
//                      8 k + i = p[k * stride + i] for k < ntok (<= 2), i < dims (<= 8); other
//                      lanes read nothing and are 0
//   kTokenMajorX       the x form of a token-major K row: 16 (a vector = 16 dims of a token) or 8
//                      (8 dims of two tokens, load_token_pair)
//   exp(v)             e^v for v <= 0 (-inf -> 0, NaN -> NaN)
//   reduce_add reduce_max    horizontal
//   reduce4(a, b, c, d, scale, out)   out[0..3] = scale * (sum a, sum b, sum c, sum d)
//   q_row<X>(q)        X floats repeated over 16 lanes (X = 4, 8, 16)
//   fold16 fold8 sum_x4      token sums of QK accumulators in "x form" (below)
//   kQkHeads kRowPvHeads kTokenPvHeads   most query heads in one register tile of QK / PV
//                      (vLLM's layout) / PV (token-major)
//   kE4m3RowPvHeads    kRowPvHeads for an e4m3 cache (its V rows cost the most to decode: a
//                      tile of more heads decodes each row once for more of them)
//   kRowProbsInRegisters kTokenProbsInRegisters   PV (vLLM's layout / token-major) keeps a
//                      tile's probabilities in registers (else re-reads them from L1)
//   qk_vecs(gt)        K vectors per QK pass for a tile of gt heads
//   pv_rows(gt, wide)  V rows (head dims) per vLLM-layout PV pass (wide: head_size % 8 == 0)
//   pv_vecs(gt, wide)  vectors of 16 dims per token-major PV pass
//   kHasBf16Dot        true if the layer also supplies qk_bf16dot / qk_bf16dot_token_major /
//                      pv_bf16dot / pv_bf16dot_token_major / probs_to_bf16
//   tiles_begin tiles_qk_blocks_per_call tiles_qk_blocks tiles_pv tiles_pv_steps
//                      only for a BF16Tiles cache
//                      (a layer with matrix tiles, amx_tiles.h): the query packed, the QK of a
//                      few blocks for all heads, the item's PV, in place of the register-tile code
//
// Algorithm per work item (G query heads share the KV head; head tiles share every K / V load):
//   spans   the partition's blocks from the block table: 64-bit element offset of the block's
//           [kv_head] slice and the slot range [lo, hi) of the partition's tokens in it.
//   Layouts (core/kv_layout.h): run_partition<Cache, F> is compiled for both KvForms; spans hold
//           each block's K and V slice offsets (K and V strides may differ).
//   QK      one pass over the blocks, every head tile per block (the block's K stays in L1).
//           K viewed as rows of X dims x block_size tokens; a 16-lane vector holds 16 / X
//           tokens x X dims ("x form": vLLM's K is stored so, X = x; a token-major K row is
//           X = Isa::kTokenMajorX: 16, one vector = 16 dims of one token, or 8, one vector = 8
//           dims of two tokens; k_at). acc[g][j] += K_vec[j] * (q's X dims of row c,
//           broadcast, pre-scaled); then fold16 / fold8 / sum_x4 turn the accumulators into
//           vectors of 16 token logits. Token-major: a last row of head_size % X dims is
//           masked (qs is zero padded).
//   softmax m = max, p = exp(l - m), s = sum p, per head (ALiBi added first).
//   PV      per head tile and tile of DT head dims, registers acc[g][dt] (16 token lanes each)
//           accumulate p[g][tokens] * V[d][tokens] over all blocks of the partition; one
//           horizontal reduction per (g, d) at the end. V rows are [block_size] contiguous per d.
//           Token-major V (pv_token_major): dims in lanes, acc[g][dt] (16 dims each) +=
//           p[g][t] (broadcast) * V[t][16 dims], no horizontal reduction; block by block, all
//           head tiles and dim tiles of a block before the next (its V read into L1 once), the
//           sums kept in the output rows between blocks.
// Slots outside [lo, hi) are masked to zero in BOTH p and V loads (0 * NaN would be NaN).
// Short items (at most kShortTokens tokens, dense): QK and PV per token over the tokens' K and V
// gathered into fp32 rows ("short items" below) instead of block by block.
// Blocksparse (core/blocksparse.h): blocks no head of the KV head attends leave the spans (never
// read, logits -inf); a head's skipped blocks among the rest get -inf logits after QK.
// Prefetch (addresses known from the block tables), into L2: while scoring block i, block
// i + 4's K and block i's V, so PV finds the partition's V in L2; during PV, the next work item's
// K (within an L2 budget; token-major short rows: its V too, and its QK then prefetches none),
// a few lines per step: a burst stalls on the miss buffers and leaves
// nothing in flight during the compute (measured; git history of docs/CPU_KERNEL.md).
// Token-major PV also pulls the next block's V into L1, token by token.
// Items of several KV heads (work_items.h: NHD, the heads of a token adjacent): QK block by
// block over all of them (each head's slice a head_stride further), its prefetch of a block's
// rows of all the heads shared out by tokens over their QK calls; their V is not prefetched
// during QK but streams in during the first head's PV (the others then read it from L2; matrix
// tiles leave that stream to the hardware prefetchers), so that K and V never wait in L2
// together; softmax and PV head by head.
#ifndef PA_ISA
#error "partition_kernel.h is included by an ISA file that defines PA_ISA and its struct Isa"
#endif

#include "kernel_common.h"

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

using Vec = Isa::Vec;
using Mask = Isa::Mask;

// Isa, named through a template argument so that the optional members (the bf16 dot product) are
// looked up only where they are used.
template <typename Cache>
struct IsaFor {
  using type = Isa;
};

// ---- QK ----

// The 16 * JT / X token sums of JT accumulators in X form, stored to dst[0, ntok).
template <int X, int JT>
inline void store_token_sums(const Vec* acc, float* dst, int ntok) {
  constexpr int N8 = X == 16 ? (JT + 1) / 2 : JT;  // vectors in x = 8 form (or x = 4 if X == 4)
  constexpr int N4 = X == 4 ? JT : (N8 + 1) / 2;   // vectors in x = 4 form
  Vec v8[N8], v4[N4 < 4 ? 4 : ((N4 + 3) / 4) * 4];
  if constexpr (X == 16) {
#pragma GCC unroll 8
    for (int i = 0; i < N8; ++i)
      v8[i] = Isa::fold16(acc[2 * i], 2 * i + 1 < JT ? acc[2 * i + 1] : Isa::zero());
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < N8; ++i) v8[i] = acc[i];
  }
  if constexpr (X == 4) {
#pragma GCC unroll 8
    for (int i = 0; i < N4; ++i) v4[i] = v8[i];
  } else {
#pragma GCC unroll 8
    for (int i = 0; i < N4; ++i)
      v4[i] = Isa::fold8(v8[2 * i], 2 * i + 1 < N8 ? v8[2 * i + 1] : Isa::zero());
  }
  constexpr int kPadded = N4 < 4 ? 4 : ((N4 + 3) / 4) * 4;
  for (int i = N4; i < kPadded; ++i) v4[i] = Isa::zero();
#pragma GCC unroll 8
  for (int i = 0; i < N4; i += 4, ntok -= 16)
    Isa::store(dst + 4 * i, Isa::sum_x4(v4[i], v4[i + 1], v4[i + 2], v4[i + 3]),
               Isa::lanes(0, ntok));
}

// The x form of a cache's K: a 16-lane vector holds 16 / X tokens x X dims of a K "row" (X
// consecutive dims of every token of the block). vLLM's K is stored in it (X = x); a token-major
// K row is X = Isa::kTokenMajorX: one vector is 16 dims of one token, or 8 dims of two tokens.
template <typename Cache, KvForm F>
constexpr int form_x() {
  return F == KvForm::kTokenMajor
             ? Isa::kTokenMajorX
             : static_cast<int>(vllm_key_x(sizeof(typename Cache::storage)));
}

// Address in a K slice of x-form element e of row c (token e / X, dim c * X + e % X); for the
// token-major form e is a multiple of X (a vector starts at a token).
template <typename Cache, KvForm F>
inline const typename Cache::storage* k_at(const typename Cache::storage* kblk, const TaskShape& s,
                                           int c, int e) {
  constexpr int X = form_x<Cache, F>();
  if constexpr (F == KvForm::kTokenMajor)
    return kblk + static_cast<int64_t>(e / X) * s.k_token_stride + X * c;
  else
    return kblk + static_cast<int64_t>(c) * s.R + e;
}

// acc[g][jt] += kv[jt] times q's X dims of row c, kv[jt] = load_k(jt): K row c's vectors
// j + 16 jt of the pass.
// pf: the block's row-share prefetch on its first pass, else null.
template <typename Cache, KvForm F, int GT, int JT, typename LoadK>
PA_DECODE_INLINE void qk_row(const LoadK& load_k, const float* qs, const TaskShape& s, int c,
                             Vec (&acc)[GT][JT], RowSharePrefetch* pf) {
  constexpr int X = form_x<Cache, F>();
  if (pf) pf->row();  // spread over this block
  Vec kv[JT];
#pragma GCC unroll 8
  for (int jt = 0; jt < JT; ++jt) kv[jt] = load_k(jt);
#pragma GCC unroll 8
  for (int g = 0; g < GT; ++g) {
    const Vec qv = Isa::template q_row<X>(qs + g * s.Dq + c * X);
#pragma GCC unroll 8
    for (int jt = 0; jt < JT; ++jt) acc[g][jt] = Isa::fmadd(kv[jt], qv, acc[g][jt]);
  }
}

// acc[g][jt] += K row c's vectors j + 16 jt ... times q's X dims of row c, over all rows.
// kFull: every lane of the JT vectors is in the row (no mask test in the loop). A token-major
// K's last row holds head_size % X dims when that is not 0 (qs is zero padded to 16 dims).
// qk_rows and qk_row are always inlined into qk_block: out of line, the accumulators would
// live in memory (GCC's size limits left some token-major ones out of line).
template <typename Cache, KvForm F, int GT, int JT, bool kFull>
PA_DECODE_INLINE void qk_rows(const typename Cache::storage* kblk, const float* qs,
                              const TaskShape& s, int j, Vec (&acc)[GT][JT],
                              RowSharePrefetch* pf) {
  constexpr int X = form_x<Cache, F>();
  const int full_rows = s.D / X;
  if constexpr (F == KvForm::kTokenMajor && X == 8) {  // vector jt: tokens (j + 16 jt) / 8, + 1
    int ntok[JT];
#pragma GCC unroll 8
    for (int jt = 0; jt < JT; ++jt)
      ntok[jt] = kFull ? 2 : std::min(2, std::max(0, (s.R - j - 16 * jt) / 8));
    const auto row = [&](int c, int dims) __attribute__((always_inline)) {
      const auto load_k = [&](int jt) {
        return Isa::template load_token_pair<Cache>(k_at<Cache, F>(kblk, s, c, j + 16 * jt),
                                                    s.k_token_stride, ntok[jt], dims);
      };
      qk_row<Cache, F, GT, JT>(load_k, qs, s, c, acc, pf);
    };
    for (int c = 0; c < full_rows; ++c) row(c, 8);
    if (full_rows < s.C) row(full_rows, s.D % 8);
  } else {
    Mask m[JT];
#pragma GCC unroll 8
    for (int jt = 0; jt < JT; ++jt)
      m[jt] = kFull ? Isa::lanes(0, 16) : Isa::lanes(0, s.R - j - 16 * jt);
    for (int c = 0; c < full_rows; ++c) {
      const auto load_k = [&](int jt) {
        return Isa::template load_cache<Cache>(k_at<Cache, F>(kblk, s, c, j + 16 * jt), m[jt]);
      };
      qk_row<Cache, F, GT, JT>(load_k, qs, s, c, acc, pf);
    }
    if constexpr (F == KvForm::kTokenMajor) {
      if (full_rows < s.C) {
        Mask tail[JT];
#pragma GCC unroll 8
        for (int jt = 0; jt < JT; ++jt)
          tail[jt] = Isa::lanes(0, std::min(s.R - j - 16 * jt, s.D % 16));
        const auto load_k = [&](int jt) {
          return Isa::template load_cache<Cache>(k_at<Cache, F>(kblk, s, full_rows, j + 16 * jt),
                                                 tail[jt]);
        };
        qk_row<Cache, F, GT, JT>(load_k, qs, s, full_rows, acc, pf);
      }
    }
  }
}

// logits[g][slot] for all bs slots of one block, heads [0, GT) of a tile.
// kblk: the block's K slice; qs: [GT][Dq] scaled query; logits: [GT][L] at the block's slot 0.
// JT vectors (16 * JT elements, 16 * JT / X tokens) of each row per pass. When a pass yields
// fewer than 16 tokens (JT < X), the accumulators of X / JT consecutive passes are held (in L1)
// and folded together: one 16-token sum instead of a mostly-zero one per pass.
// pf_k / pf_v (either may be null): a K and a V slice prefetched into L2 a row's share per K row.
template <typename Cache, KvForm F, int GT, int JT>
void qk_block(const typename Cache::storage* kblk, const float* qs, const TaskShape& s,
              float* logits, const char* pf_k, const char* pf_v) {
  constexpr int X = form_x<Cache, F>();
  constexpr int kPasses = JT < X ? X / JT : 1;  // passes per 16-token group
  Vec held[GT][kPasses > 1 ? X : 1];
  int held_passes = 0, group_j = 0;
  RowSharePrefetch row_prefetch(pf_k, pf_v, s, s.C);
  RowSharePrefetch* const first_pass_prefetch = row_prefetch.active() ? &row_prefetch : nullptr;
  for (int j = 0; j < s.R; j += 16 * JT) {
    RowSharePrefetch* const pf = j == 0 ? first_pass_prefetch : nullptr;
    Vec acc[GT][JT];
#pragma GCC unroll 8
    for (int g = 0; g < GT; ++g)
#pragma GCC unroll 8
      for (int jt = 0; jt < JT; ++jt) acc[g][jt] = Isa::zero();
    if (s.R - j >= 16 * JT)
      qk_rows<Cache, F, GT, JT, true>(kblk, qs, s, j, acc, pf);
    else
      qk_rows<Cache, F, GT, JT, false>(kblk, qs, s, j, acc, pf);
    if constexpr (kPasses == 1) {
      const int ntok = std::min(16 * JT, s.R - j) / X;
#pragma GCC unroll 8
      for (int g = 0; g < GT; ++g) store_token_sums<X, JT>(acc[g], logits + g * s.L + j / X, ntok);
    } else {
      for (int g = 0; g < GT; ++g)
        for (int jt = 0; jt < JT; ++jt) held[g][held_passes * JT + jt] = acc[g][jt];
      ++held_passes;
      if (held_passes == kPasses || j + 16 * JT >= s.R) {
        for (int g = 0; g < GT; ++g)
          for (int i = held_passes * JT; i < X; ++i) held[g][i] = Isa::zero();
        const int ntok = std::min(16, (s.R - group_j) / X);
        for (int g = 0; g < GT; ++g)
          store_token_sums<X, X>(held[g], logits + g * s.L + group_j / X, ntok);
        held_passes = 0;
        group_j = j + 16 * JT;
      }
    }
  }
}

// Head tiles: the G heads of a KV head split into the fewest tiles of at most `most` heads,
// balanced (G = 4 with most = 3: 2 + 2); G = 6 is one tile where six fit.
inline int tile_heads(int G, int done, int most) {
  const int remaining = G - done;
  if (remaining == 6 && most >= 6) return 6;
  most = std::min(most, 4);
  const int tiles = (remaining + most - 1) / most;
  return (remaining + tiles - 1) / tiles;
}

template <typename Cache, KvForm F, int GT>
void qk_tile_of(const typename Cache::storage* kblk, const float* qs, float qk_scale,
                const TaskShape& s, float* logits, const char* pf_k, const char* pf_v) {
  if constexpr (std::is_same_v<Cache, BF16Dot>) {  // bf16 query, see run_partition
    const auto* qb = reinterpret_cast<const uint16_t*>(qs);
    if constexpr (F == KvForm::kTokenMajor)
      IsaFor<Cache>::type::template qk_bf16dot_token_major<GT>(kblk, qb, qk_scale, s, logits,
                                                               pf_k, pf_v);
    else
      IsaFor<Cache>::type::template qk_bf16dot<GT>(kblk, qb, qk_scale, s, logits, pf_k, pf_v);
  } else {
    (void)qk_scale;  // folded into qs
    qk_block<Cache, F, GT, Isa::qk_vecs(GT)>(kblk, qs, s, logits, pf_k, pf_v);
  }
}

template <typename Cache, KvForm F>
void qk_tile(int gt, const typename Cache::storage* kblk, const float* qs, float qk_scale,
             const TaskShape& s, float* logits, const char* pf_k, const char* pf_v) {
  switch (gt) {
    case 1:
      return qk_tile_of<Cache, F, 1>(kblk, qs, qk_scale, s, logits, pf_k, pf_v);
    case 2:
      return qk_tile_of<Cache, F, 2>(kblk, qs, qk_scale, s, logits, pf_k, pf_v);
    case 3:
      return qk_tile_of<Cache, F, 3>(kblk, qs, qk_scale, s, logits, pf_k, pf_v);
    case 4:
      return qk_tile_of<Cache, F, 4>(kblk, qs, qk_scale, s, logits, pf_k, pf_v);
    default:
      if constexpr (Isa::kQkHeads >= 6)
        return qk_tile_of<Cache, F, 6>(kblk, qs, qk_scale, s, logits, pf_k, pf_v);
  }
}

// ---- softmax ----

// (m, s) of one head's logits in buf[lo, hi); overwrites them with p = exp(l - m). All -inf
// (blocksparse: nothing attended): m = -inf, s = 0, p = 0.
inline void softmax_in_place(float* buf, int lo, int hi, float* m_out, float* s_out) {
  Vec vmax = Isa::set1(-INFINITY);
  for (int i = lo & ~15; i < hi; i += 16)
    vmax = Isa::max(vmax, Isa::load_or(buf + i, Isa::lanes(lo - i, hi - i), -INFINITY));
  const float mx = Isa::reduce_max(vmax);
  const Vec vm = Isa::set1(mx == -INFINITY ? 0.0f : mx);  // nothing attended: every p is 0
  Vec vsum = Isa::zero();
  for (int i = lo & ~15; i < hi; i += 16) {
    const Mask m = Isa::lanes(lo - i, hi - i);
    const Vec p = Isa::select(m, Isa::exp(Isa::sub(Isa::load(buf + i, m), vm)));
    vsum = Isa::add(vsum, p);
    Isa::store(buf + i, p, m);
  }
  *m_out = mx;
  *s_out = Isa::reduce_add(vsum);
}

// ---- PV ----

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

// Passes of a token-major PV head tile of gt heads over a row of nvec vectors.
constexpr int token_pv_passes(int gt, int nvec) {
  return (nvec + token_pv_vecs(gt, nvec) - 1) / token_pv_vecs(gt, nvec);
}

// pf.step() calls of a token-major PV: one per token, pass and head tile of G heads.
inline int token_pv_steps(const Span* spans, int nspans, int G, int D) {
  int passes = 0;
  for (int g0 = 0; g0 < G;) {
    const int gt = tile_heads(G, g0, Isa::kTokenPvHeads);
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
      const int gt = tile_heads(G, g0, Isa::kTokenPvHeads);
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

// ---- blocksparse (core/blocksparse.h) ----

// logits[g][slot] = -inf for the slots [lo, hi) of one block, every head of the tile.
inline void mask_block(const Span& sp, int G, const TaskShape& s, float* logits) {
  for (int g = 0; g < G; ++g)
    std::fill(logits + g * s.L + sp.buf + sp.lo, logits + g * s.L + sp.buf + sp.hi, -INFINITY);
}

// Index in the row's block table of spans[i].
inline int64_t block_index(const PartitionTask& task, const TaskShape& s, const Span& sp) {
  return static_cast<int64_t>(task.partition) * kPartitionSize / s.bs + sp.buf / s.bs;
}

// Drops from spans the blocks no query head of the KV head attends (they are never read; their
// logits become -inf) and returns how many remain.
inline int drop_unattended_blocks(const PagedAttentionParams& p, PartitionTask task,
                                  const TaskShape& s, int h0, int G, Span* spans, int nspans,
                                  float* logits) {
  const int seq_len = p.seq_lens[task.seq];
  int kept = 0;
  for (int i = 0; i < nspans; ++i) {
    bool any = false;
    for (int g = 0; g < G && !any; ++g) {
      const int64_t offset = blocksparse_offset(p.blocksparse, p.num_heads, p.num_kv_heads, h0 + g);
      any = blocksparse_attends(p.blocksparse, offset, seq_len, s.bs, block_index(task, s, spans[i]));
    }
    if (any)
      spans[kept++] = spans[i];
    else
      mask_block(spans[i], G, s, logits);
  }
  return kept;
}

// After QK: -inf logits for the heads that do not attend a kept block.
inline void mask_unattended_heads(const PagedAttentionParams& p, PartitionTask task,
                                  const TaskShape& s, int h0, int G, const Span* spans,
                                  int nspans, float* logits) {
  const int seq_len = p.seq_lens[task.seq];
  for (int g = 0; g < G; ++g) {
    const int64_t offset = blocksparse_offset(p.blocksparse, p.num_heads, p.num_kv_heads, h0 + g);
    for (int i = 0; i < nspans; ++i)
      if (!blocksparse_attends(p.blocksparse, offset, seq_len, s.bs, block_index(task, s, spans[i])))
        mask_block(spans[i], 1, s, logits + g * s.L);
  }
}

// ---- short items ----

// An item of at most kShortTokens tokens (kernel_common.h; a sequence's first decode steps):
// the block-wide QK and PV above cost as much for one token as for a whole block (every slot of
// a K row; in vLLM's layout one horizontal sum per head dim), so here the item's K and V tokens
// are first gathered into fp32 rows and the work is per token: a dot product per (head, token),
// a weighted sum of V rows per head. Only the item's slots are read.
template <typename Cache>
using ShortElem = std::conditional_t<std::is_base_of_v<BF16, Cache>, BF16, Cache>;

// row[0, Dq) = dims of token `slot` of a K (is_key) or V slice as fp32, 0 past D.
template <typename Cache, KvForm F>
inline void gather_token(const typename Cache::storage* slice, bool is_key, const TaskShape& s,
                         int slot, float* row) {
  using E = ShortElem<Cache>;
  if constexpr (F == KvForm::kTokenMajor) {
    const auto* t = slice + slot * (is_key ? s.k_token_stride : s.v_token_stride);
    for (int d = 0; d < s.Dq; d += 16)
      Isa::store(row + d, Isa::template load_cache<E>(t + d, Isa::lanes(0, s.D - d)),
                 Isa::lanes(0, 16));
  } else if (is_key) {  // X dims of the token every s.R elements
    constexpr int X = form_x<Cache, F>();
    const auto* k = slice + slot * X;
    for (int c = 0; c < s.D / X; ++c, k += s.R)
      for (int i = 0; i < X; ++i) row[c * X + i] = E::decode(k[i]);
    for (int d = s.D; d < s.Dq; ++d) row[d] = 0.0f;
  } else {  // one dim every s.bs elements
    const auto* v = slice + slot;
    for (int d = 0; d < s.D; ++d, v += s.bs) row[d] = E::decode(*v);
    for (int d = s.D; d < s.Dq; ++d) row[d] = 0.0f;
  }
}

// rows [2][kShortTokens][Dq] = the item's K tokens, then its V tokens, in token order.
template <typename Cache, KvForm F>
void gather_short_item(const typename Cache::storage* K, const typename Cache::storage* V,
                       const Span* spans, int nspans, const TaskShape& s, float* rows) {
  int n = 0;
  for (int i = 0; i < nspans; ++i)
    for (int slot = spans[i].lo; slot < spans[i].hi; ++slot, ++n) {
      gather_token<Cache, F>(K + spans[i].k_offset, true, s, slot, rows + n * s.Dq);
      gather_token<Cache, F>(V + spans[i].v_offset, false, s, slot,
                             rows + (kShortTokens + n) * s.Dq);
    }
}

// logits[g][lo + t] = qk_scale * q[g] . k_t over the n K rows (q: the G heads' fp32 query rows,
// unscaled).
inline void short_qk(const float* k_rows, int n, const float* q, float qk_scale,
                     const TaskShape& s, int G, int lo, float* logits) {
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < n; ++t) {
      Vec acc = Isa::zero();
      for (int d = 0; d < s.D; d += 16)
        acc = Isa::fmadd(Isa::load(q + g * s.D + d, Isa::lanes(0, s.D - d)),
                         Isa::load(k_rows + t * s.Dq + d, Isa::lanes(0, 16)), acc);
      logits[g * s.L + lo + t] = qk_scale * Isa::reduce_add(acc);
    }
}

// out[g] = norm[g] * sum_t p[g][lo + t] * v_t over the n V rows.
inline void short_pv(const float* probs, const float* v_rows, int n, const TaskShape& s, int G,
                     int lo, const float* norm, float* out, int64_t out_stride) {
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < s.D; d += 16) {
      Vec acc = Isa::zero();
      for (int t = 0; t < n; ++t)
        acc = Isa::fmadd(Isa::set1(probs[g * s.L + lo + t]),
                         Isa::load(v_rows + t * s.Dq + d, Isa::lanes(0, 16)), acc);
      Isa::store(out + g * out_stride + d, Isa::mul(acc, Isa::set1(norm[g])),
                 Isa::lanes(0, s.D - d));
    }
}

// ---- one work item ----

// Bytes of L2 the partition's V and the next work item's K (prefetched during this item's PV)
// may take together: a share of a 1 MiB per-core L2, leaving the rest for K in flight and
// everything else. Token-major short rows prefetch the next item's V as well when this item's
// and the next one's K and V all fit.
constexpr int64_t kPrefetchBudget = 384 * 1024;

template <typename Cache, KvForm F>
void run_partition(const PagedAttentionParams& p, const KernelInputs& in, PartitionTask task,
                   const PartitionTask* next, float* scratch) {
  using T = typename Cache::storage;
  constexpr bool kBf16Dot = std::is_same_v<Cache, BF16Dot>;
  constexpr bool kTiles = std::is_same_v<Cache, BF16Tiles>;
  using Layer = typename IsaFor<Cache>::type;  // names the optional members of the layer
  const T* K = static_cast<const T*>(p.key_cache);
  const T* V = static_cast<const T*>(p.value_cache);
  const int G = p.num_heads / p.num_kv_heads;
  TaskShape s;
  s.D = p.head_size;
  s.bs = p.block_size;
  constexpr int X = form_x<Cache, F>();
  s.C = (s.D + X - 1) / X;  // vLLM's layout: D / x exactly (checked)
  s.R = s.bs * X;
  s.Dq = round_up16(s.D);
  s.L = logits_stride(s.bs);
  s.kv_bytes = static_cast<int64_t>(s.D) * s.bs * sizeof(T);
  s.k_token_stride = p.k_layout.token_stride;
  s.v_token_stride = p.v_layout.token_stride;
  s.k_mem = slice_bytes(F, p.k_layout, s.D, s.bs, sizeof(T));
  s.v_mem = slice_bytes(F, p.v_layout, s.D, s.bs, sizeof(T));

  // The item's KV heads (work_items.h): head j's slices lie j * head_stride after the first
  // one's, its G query heads are rows j G .. j G + G - 1 of qs, logits, norm and the results.
  const int nh = task.kv_heads, Gi = G * nh;
  const int max_spans = max_spans_of(s.bs);
  const ScratchLayout layout(Gi, s.D, s.bs);  // kernel_common.h
  float* logits = scratch;
  float* qs = scratch + layout.qs;
  float* norm = scratch + layout.norm;
  Span* spans = reinterpret_cast<Span*>(scratch + layout.spans);
  int nspans = partition_spans(p, task, s.bs, spans);
  const int lo = spans[0].buf + spans[0].lo;  // the partition's tokens: logits [lo, hi)
  const int hi = spans[nspans - 1].buf + spans[nspans - 1].hi;
  const int h0 = task.kv_head * G;
  if (blocksparse_active(p.blocksparse))  // only the blocks some head attends stay in spans
    nspans = drop_unattended_blocks(p, task, s, h0, G, spans, nspans, logits);  // (nh == 1)

  const float* q = in.query + (static_cast<int64_t>(task.seq) * p.num_heads + h0) * s.D;
  // A short item (few tokens, dense) gathers its tokens; the rest runs block by block.
  const bool short_item = hi - lo <= kShortTokens && !blocksparse_active(p.blocksparse);
  if (short_item && nh > 1) {  // a few tokens: no stream to read, each head on its own
    for (int j = 0; j < nh; ++j)
      run_partition<Cache, F>(p, in, PartitionTask{task.seq, task.kv_head + j, task.partition, 1},
                              nullptr, scratch);
    return;
  }
  const int64_t k_head = p.k_layout.head_stride, v_head = p.v_layout.head_stride;
  float* short_rows = scratch + layout.short_rows;
  PrefetchStream pf;
  float* tiles = nullptr;  // kTiles: the layer's tile scratch for this item
  if (short_item) {
    scratch[layout.v_ahead] = scratch[layout.v_ahead + 1] = 0.0f;  // nothing of the next item
    gather_short_item<Cache, F>(K, V, spans, nspans, s, short_rows);
    short_qk(short_rows, hi - lo, q, in.qk_scale, s, G, lo, logits);
  } else {
    // qs[g][d] = qk_scale * q[h0 + g][d] for d < Dq (0 past D); for BF16Dot, the bf16 bits of
    // q[h0 + g][d] (exact: the query is bf16, its fp32 copy's top half) and QK scales the sums.
    if constexpr (kTiles) {
      tiles = Layer::template tiles_begin<F>(q, G, nh, s);
    } else if constexpr (kBf16Dot) {
      auto* qb = reinterpret_cast<uint16_t*>(qs);
      for (int64_t i = 0; i < static_cast<int64_t>(Gi) * s.D; ++i) {
        uint32_t bits;
        std::memcpy(&bits, q + i, sizeof(bits));
        qb[i] = static_cast<uint16_t>(bits >> 16);
      }
    } else {
      const Vec scale = Isa::set1(in.qk_scale);
      for (int g = 0; g < Gi; ++g)
        for (int d = 0; d < s.Dq; d += 16)  // lanes past D load 0
          Isa::store(qs + g * s.Dq + d,
                     Isa::mul(scale, Isa::load(q + g * s.D + d, Isa::lanes(0, s.D - d))),
                     Isa::lanes(0, 16));
    }

    // The next work item, prefetched during this item's PV (memory is otherwise idle while PV
    // reads V from L2), a few lines per PV step (vLLM's layout: the first head tile's steps;
    // token-major: all of PV's, its head tiles take turns per block): its K, what fits in
    // kPrefetchBudget beside this item's V; and, token-major, when this item's and the next one's
    // K and V all fit (short rows), its V after its K. An item of a few blocks otherwise finds its
    // V in memory at PV: prefetched only while its own K is scored, V comes too late. That item's
    // QK then prefetches no V (v_ahead).
    // Not with matrix tiles: their PV is short, and the whole next K streaming in meanwhile
    // slowed PV's own reads (HND 3-6% from DRAM, measured); they take its first blocks (below).
    Span* next_spans = spans + max_spans;
    // Nor with more than one KV head (their V fills the L2 share already).
    const int n_next = next != nullptr && nspans > 0 && !kTiles && nh == 1 && next->kv_heads == 1
                           ? partition_spans(p, *next, s.bs, next_spans)
                           : 0;
    const int nk = static_cast<int>(
        std::clamp<int64_t>((kPrefetchBudget - nspans * s.kv_bytes) / s.kv_bytes, 0, n_next));
    const int nv = F == KvForm::kTokenMajor && n_next > 0 &&
                           2 * (nspans + n_next) * s.kv_bytes <= kPrefetchBudget
                       ? n_next
                       : 0;
    if (nk > 0) {
      const char** next_kv = reinterpret_cast<const char**>(scratch + layout.next_kv);
      for (int i = 0; i < nk; ++i)
        next_kv[i] = reinterpret_cast<const char*>(K + next_spans[i].k_offset);
      for (int i = 0; i < nv; ++i)
        next_kv[nk + i] = reinterpret_cast<const char*>(V + next_spans[i].v_offset);
      pf.blocks = next_kv;
      pf.nblocks = nk + nv;
      pf.nfirst = nk;
      pf.mem = s.k_mem;
      pf.mem_rest = s.v_mem;
      const int first_tile = tile_heads(G, 0, row_pv_heads<Cache>());
      const int steps = F == KvForm::kTokenMajor
                            ? std::max(1, token_pv_steps(spans, nspans, G, s.D))
                            : s.D / Isa::pv_rows(first_tile, s.D % 8 == 0) * nspans;
      const int64_t lines = nk * s.k_mem.lines() + nv * s.v_mem.lines();
      pf.lines_per_step = static_cast<int>((lines + steps - 1) / steps);
    }
    // nh > 1: the item's V (all its heads, a run per token) streams in during the first head's
    // PV, not during QK, so that K and V do not wait in L2 together (work_items.h): the first
    // kVAhead blocks during the QK of the last kAhead, the others a share per step of that PV,
    // twice as fast as it reads them so that the stream stays ahead. Not on matrix tiles: their
    // first head's PV is short, so the stream came as a burst that held up PV's own loads, and
    // the hardware prefetchers follow the whole token rows alone (docs/CPU_KERNEL.md).
    // vLLM's layout on matrix tiles (one KV head an item) streams its V during PV too: its PV
    // (tiles of 16 dims, a block's 16 tokens deep) outlasts token-major's, and V then streams in
    // while PV runs instead of beside K (token-major's shorter PV gained nothing from it).
    // Matrix tiles, one KV head an item, either form: the PV stream (after the V, if any) takes
    // the first kAhead K blocks of the next item, which that item does not prefetch again
    // (k_prefetched): its QK starts on K in L2 (token-major 3-4.5% faster from DRAM, measured).
    constexpr int kVAhead = 2;
    constexpr bool kVDuringPv = kTiles && F == KvForm::kVllm;
    const int64_t heads_bytes = static_cast<int64_t>(nh) * s.D * sizeof(T);
    const SliceBytes v_item =
        nh == 1 ? s.v_mem : SliceBytes{s.bs, heads_bytes, s.v_mem.run_stride};
    int group_blocks = 1;  // kTiles: blocks per QK call; K is prefetched that many further ahead
    if constexpr (kTiles)
      group_blocks =
          std::min(TileQkBlocks<T>::kMax, Layer::template tiles_qk_blocks_per_call<F>(s));
    const int kAhead = 3 + group_blocks;
    float* v_ahead = scratch + layout.v_ahead;
    const bool v_prefetched = v_ahead[0] == 1.0f;  // by the item before
    // K blocks prefetched by the item before; only a perf hint, read NaN-safely (scratch a
    // caller did not zero holds anything)
    const int k_prefetched =
        v_ahead[1] >= 1.0f && v_ahead[1] <= kAhead ? static_cast<int>(v_ahead[1]) : 0;
    v_ahead[0] = nv > 0 ? 1.0f : 0.0f;
    v_ahead[1] = 0.0f;
    const int v_stream =
        ((nh > 1 && !kTiles) || kVDuringPv) ? std::max(0, nspans - kVAhead) : 0;
    const int next_k = kTiles && nh == 1 && next != nullptr && next->kv_heads == 1 &&
                               !blocksparse_active(p.blocksparse)
                           ? std::min(kAhead, partition_spans(p, *next, s.bs, next_spans))
                           : 0;
    if (v_stream + next_k > 0) {
      const char** blocks = reinterpret_cast<const char**>(scratch + layout.next_kv);
      for (int i = 0; i < v_stream; ++i)
        blocks[i] = reinterpret_cast<const char*>(V + spans[kVAhead + i].v_offset);
      for (int i = 0; i < next_k; ++i)
        blocks[v_stream + i] = reinterpret_cast<const char*>(K + next_spans[i].k_offset);
      v_ahead[1] = static_cast<float>(next_k);
      pf.blocks = blocks;
      pf.nblocks = v_stream + next_k;
      pf.nfirst = v_stream;
      pf.mem = v_item;
      pf.mem_rest = s.k_mem;
      int steps = 0;
      if constexpr (kTiles) steps = Layer::template tiles_pv_steps<F>(hi - lo, s);
      else steps = token_pv_steps(spans, nspans, G, s.D);
      const int64_t lines = 2 * v_stream * v_item.lines() + next_k * s.k_mem.lines();
      pf.lines_per_step = static_cast<int>((lines + steps - 1) / std::max(1, steps));
    }

    // QK, one pass over K for all heads (a block's K stays in L1 across the head tiles).
    // kTiles: the QK of a group of blocks runs after the last one is added
    // Prefetch with nh > 1: a block's slices of all the item's heads (one run per token), shared
    // out over the heads' QK calls by tokens: head j takes tokens [bs j / nh, bs (j + 1) / nh).
    const SliceBytes k_item = nh == 1 ? s.k_mem : SliceBytes{s.bs, heads_bytes, s.k_mem.run_stride};
    TaskShape share = s;  // nh > 1: the shape whose k_mem / v_mem are head j's share
    const auto head_share = [&](int j, const char** pk, const char** pv) -> const TaskShape& {
      if (nh == 1) return s;
      const int t0 = s.bs * j / nh, t1 = s.bs * (j + 1) / nh;
      share.k_mem = SliceBytes{t1 - t0, heads_bytes, s.k_mem.run_stride};
      share.v_mem = SliceBytes{t1 - t0, heads_bytes, s.v_mem.run_stride};
      if (*pk != nullptr) *pk += t0 * s.k_mem.run_stride;
      if (*pv != nullptr) *pv += t0 * s.v_mem.run_stride;
      return share;
    };
    for (int i = k_prefetched; i < std::min(kAhead, nspans); ++i)
      prefetch_lines(reinterpret_cast<const char*>(K + spans[i].k_offset), k_item, 0,
                     k_item.lines());
    TileQkBlocks<T> group;  // kTiles: blocks for one tile QK call
    for (int i = 0; i < nspans; ++i) {
      const char* pf_k = i + kAhead < nspans
                             ? reinterpret_cast<const char*>(K + spans[i + kAhead].k_offset)
                             : nullptr;
      // nh > 1: the first kVAhead blocks' V, from where the K prefetch has run out of blocks
      const int v_first = i - std::max(0, nspans - kAhead);
      const char* pf_v =
          nh > 1 || kVDuringPv ? (v_first >= 0 && v_first < kVAhead
                        ? reinterpret_cast<const char*>(V + spans[v_first].v_offset)
                        : nullptr)
          : v_prefetched ? nullptr
                         : reinterpret_cast<const char*>(V + spans[i].v_offset);
      if constexpr (kTiles) {  // all heads, group_blocks blocks at once
        group.add(K + spans[i].k_offset, logits + spans[i].buf, pf_k, pf_v);
        if (group.n == group_blocks || i + 1 == nspans) {
          for (int j = 0; j < nh; ++j) {
            TileQkBlocks<T> head = group;
            const TaskShape* sj = &s;
            for (int b = 0; b < head.n; ++b) {
              head.k[b] += j * k_head;
              head.logits[b] += static_cast<int64_t>(j) * G * s.L;
              sj = &head_share(j, &head.pf_k[b], &head.pf_v[b]);
            }
            Layer::template tiles_qk_blocks<F>(head, G, in.qk_scale, *sj, tiles, j);
          }
          group.n = 0;
        }
      } else {
        for (int j = 0; j < nh; ++j) {
          const char *pk = pf_k, *pv = pf_v;
          const TaskShape& sj = head_share(j, &pk, &pv);
          for (int g0 = 0; g0 < G;) {
            const int gt = tile_heads(G, g0, Isa::kQkHeads);
            const int64_t row = static_cast<int64_t>(j) * G + g0;  // first query row of the tile
            const float* qs_tile = kBf16Dot ? qs + row * s.D / 2  // 2 bf16 a float
                                            : qs + row * s.Dq;
            qk_tile<Cache, F>(gt, K + j * k_head + spans[i].k_offset, qs_tile, in.qk_scale, sj,
                              logits + row * s.L + spans[i].buf, pk, pv);
            pk = pv = nullptr;  // once per block
            g0 += gt;
          }
        }
      }
    }
  }

  // Softmax per head over the partition's tokens; ALiBi bias first.
  const int seq_len = p.seq_lens[task.seq];
  if (blocksparse_active(p.blocksparse)) mask_unattended_heads(p, task, s, h0, G, spans, nspans, logits);
  const int t_at_lo = task.partition * kPartitionSize;  // token index of buffer position lo
  const int64_t row0 = (static_cast<int64_t>(task.seq) * p.num_heads + h0) * in.num_partitions +
                       task.partition;  // [seq, h0, partition] in the result arrays
  for (int g = 0; g < Gi; ++g) {
    float* l = logits + static_cast<int64_t>(g) * s.L;
    if (p.alibi_slopes) {
      const float slope = p.alibi_slopes[h0 + g];
      for (int b = lo; b < hi; ++b)
        l[b] += slope * static_cast<float>(t_at_lo + (b - lo) - seq_len + 1);
    }
    float mx, sum;
    softmax_in_place(l, lo, hi, &mx, &sum);
    if constexpr (kBf16Dot) {
      if (!short_item) IsaFor<Cache>::type::probs_to_bf16(l, lo, hi);
    }
    in.max_logits[row0 + static_cast<int64_t>(g) * in.num_partitions] = mx;
    in.exp_sums[row0 + static_cast<int64_t>(g) * in.num_partitions] = sum;
    norm[g] = sum > 0.0f ? in.v_scale / sum : 0.0f;  // sum >= 1 unless nothing was attended
  }

  float* out = in.part_out + row0 * s.D;
  const int64_t out_stride = static_cast<int64_t>(in.num_partitions) * s.D;
  if (short_item) {
    short_pv(logits, short_rows + kShortTokens * s.Dq, hi - lo, s, G, lo, norm, out, out_stride);
  } else if constexpr (kTiles || F == KvForm::kTokenMajor) {
    PrefetchStream none;  // heads after the first: their V came with the first one's
    for (int j = 0; j < nh; ++j) {
      const int64_t row = static_cast<int64_t>(j) * G;
      PrefetchStream& pf_j = j == 0 ? pf : none;
      if constexpr (kTiles)
        Layer::template tiles_pv<F>(V + j * v_head, spans, nspans, logits + row * s.L, s, G,
                                    norm + row, out + row * out_stride, out_stride, pf_j, tiles);
      else
        pv_token_major<Cache>(V + j * v_head, spans, nspans, logits + row * s.L, s, G, norm + row,
                              out + row * out_stride, out_stride, pf_j);
    }
  } else {
    for (int g0 = 0; g0 < G;) {
      const int gt = tile_heads(G, g0, row_pv_heads<Cache>());
      pv_heads<Cache, F>(gt, V, spans, nspans, logits + static_cast<int64_t>(g0) * s.L, s,
                         norm + g0, out + g0 * out_stride, out_stride, pf);
      g0 += gt;
    }
  }
}

// The kernel for every cache kind in form F; bf16_dot: a bf16 cache's QK and PV on the layer's
// bf16 dot-product instruction (only where Isa::kHasBf16Dot and the CPU has it).
template <KvForm F>
void run_form(const PagedAttentionParams& p, const KernelInputs& in, PartitionTask task,
              const PartitionTask* next, float* scratch, bool bf16_dot) {
  switch (p.cache_kind) {
    case CacheKind::kFp8E4M3:
      return run_partition<E4M3, F>(p, in, task, next, scratch);
    case CacheKind::kFp8E5M2:
      return run_partition<E5M2, F>(p, in, task, next, scratch);
    case CacheKind::kAuto:
      break;
  }
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32:
      return run_partition<F32, F>(p, in, task, next, scratch);
    case ScalarKind::kFloat16:
      return run_partition<F16, F>(p, in, task, next, scratch);
    case ScalarKind::kBFloat16:
      if constexpr (Isa::kHasBf16Dot) {
        if (bf16_dot) return run_partition<BF16Dot, F>(p, in, task, next, scratch);
      }
      (void)bf16_dot;
      return run_partition<BF16, F>(p, in, task, next, scratch);
  }
}

// The kernel for every cache kind and layout form (core/kv_layout.h).
inline void run_any_cache(const PagedAttentionParams& p, const KernelInputs& in, PartitionTask task,
                          const PartitionTask* next, float* scratch, bool bf16_dot) {
  if (p.kv_form == KvForm::kTokenMajor)
    return run_form<KvForm::kTokenMajor>(p, in, task, next, scratch, bf16_dot);
  return run_form<KvForm::kVllm>(p, in, task, next, scratch, bf16_dot);
}

// Defines variant `name`'s entry point (attention_kernel.h) as this algorithm on ISA namespace
// `isa` for every cache kind and form; bf16_dot as run_form's. Used outside the namespaces.
#define PA_DEFINE_ENTRY_POINT(name, isa, bf16_dot)                                           \
  namespace paged_attn {                                                                    \
  namespace cpu {                                                                           \
  namespace name {                                                                          \
  void attention_partition(const PagedAttentionParams& p, const KernelInputs& in,           \
                           PartitionTask task, const PartitionTask* next, float* scratch) { \
    isa::run_any_cache(p, in, task, next, scratch, bf16_dot);                               \
  }                                                                                         \
  }                                                                                         \
  }                                                                                         \
  }

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
