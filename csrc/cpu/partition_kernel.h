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
//   kTokenPvSixes      token-major PV in tiles of six heads while six or more remain
//                      (token_pv_tile_heads), not only for G = 6
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
//           masked (qs is zero padded). (qk_register_tiles.h)
//   softmax m = max, p = exp(l - m), s = sum p, per head (ALiBi added first).
//   PV      per head tile and tile of DT head dims, registers acc[g][dt] (16 token lanes each)
//           accumulate p[g][tokens] * V[d][tokens] over all blocks of the partition; one
//           horizontal reduction per (g, d) at the end. V rows are [block_size] contiguous per d.
//           Token-major V (pv_token_major): dims in lanes, acc[g][dt] (16 dims each) +=
//           p[g][t] (broadcast) * V[t][16 dims], no horizontal reduction; block by block, all
//           head tiles and dim tiles of a block before the next (its V read into L1 once), the
//           sums kept in the output rows between blocks. (pv_register_tiles.h)
// Slots outside [lo, hi) are masked to zero in BOTH p and V loads (0 * NaN would be NaN).
// Short items (at most kShortTokens tokens, dense): QK and PV per token over the tokens' K and V
// gathered into fp32 rows (short_items.h) instead of block by block.
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

// The x form of a cache's K: a 16-lane vector holds 16 / X tokens x X dims of a K "row" (X
// consecutive dims of every token of the block). vLLM's K is stored in it (X = x); a token-major
// K row is X = Isa::kTokenMajorX: one vector is 16 dims of one token, or 8 dims of two tokens.
template <typename Cache, KvForm F>
constexpr int form_x() {
  return F == KvForm::kTokenMajor
             ? Isa::kTokenMajorX
             : static_cast<int>(vllm_key_x(sizeof(typename Cache::storage)));
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

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn

#include "qk_register_tiles.h"
#include "pv_register_tiles.h"
#include "short_items.h"

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

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
