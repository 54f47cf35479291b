// kernel_common.h — what every ISA file shares and must see BEFORE its target pragma: the
// standard headers, the kernel interface, the scalar cache decoders, and the ISA-neutral pieces
// of the partition kernel (its scratch layout, block spans, prefetch stream, lane ranges).
// Everything here is compiled for the build's baseline ISA, so no inline function of a standard
// header is ever emitted with a newer ISA's instructions (the linker could pick that copy for
// code that runs before the run-time check).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attention_kernel.h"
#include "cache_element.h"

// Always inlined into the algorithm's loops: the cache decode primitives of an ISA layer (the
// loads that widen cache elements to fp32) and the pieces of the QK loop (qk_rows, qk_row, the
// row-share prefetch). Left to the inliner's size limits, which loop calls one out of line
// would change with unrelated code of the same file, and a call spills the accumulators.
#define PA_DECODE_INLINE inline __attribute__((always_inline))

namespace paged_attn {
namespace cpu {

// bf16 cache whose QK and PV run on a bf16 dot-product instruction (an ISA may offer it: see
// Isa::kHasBf16Dot in partition_kernel.h). Its scalar decode is BF16's.
struct BF16Dot : BF16 {};

// bf16 cache whose QK and PV run on matrix tiles (the layer's tiles_* hooks, partition_kernel.h;
// AMX: amx_tiles.h). Its scalar decode is BF16's.
struct BF16Tiles : BF16 {};

// Lanes [lo, hi) of a 16-lane vector, clamped: the mask of ISAs without mask registers.
struct LaneRange {
  int lo, hi;
  bool full() const { return lo == 0 && hi == 16; }
  bool empty() const { return hi <= lo; }
};

inline LaneRange lane_range(int lo, int hi) { return LaneRange{std::max(lo, 0), std::min(hi, 16)}; }

// Copies lanes [r.lo, r.hi) of src into a 16-element dst zeroed elsewhere (reads nothing else).
template <typename T>
inline void copy_lanes(T* dst, const T* src, LaneRange r) {
  std::memset(dst, 0, 16 * sizeof(T));
  if (!r.empty()) std::memcpy(dst + r.lo, src + r.lo, (r.hi - r.lo) * sizeof(T));
}

// Two tokens' dims of a token-major K row into a 16-element dst (x = 8 form): dst[8 k + i] =
// src[k * stride + i] for k < ntok, i < dims (ntok <= 2, dims <= 8), zero elsewhere; reads
// nothing else.
template <typename T>
inline void copy_token_pair(T* dst, const T* src, int64_t stride, int ntok, int dims) {
  std::memset(dst, 0, 16 * sizeof(T));
  for (int k = 0; k < ntok; ++k) std::memcpy(dst + 8 * k, src + k * stride, dims * sizeof(T));
}

// exp(r) ~ 1 + r + r^2 * poly(r) on |r| <= ln(2) / 2 (Cephes expf), after x = n ln2 + r with ln2
// split in two for an exact n * ln2_hi. Every SIMD layer's exp uses these.
namespace exp_poly {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kCoef[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                            4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
}  // namespace exp_poly

// Prefetch into L2 (prefetcht1 on x86, PRFM PLDL2KEEP on aarch64), as a volatile asm: GCC takes
// __builtin_prefetch for free of side effects, so it may drop a whole call of a helper that only
// prefetches (it did: the QK-time row-share prefetch vanished from the compiled QK, and PV then
// waited on V from DRAM: 1.5-2x slower; docs/PERFORMANCE.md "Regression checks").
inline void prefetch_l2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl2keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 2);
#endif
}

// Prefetch into L1 (prefetcht0 / PRFM PLDL1KEEP), volatile for the same reason.
inline void prefetch_l1(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
#elif defined(__aarch64__)
  asm volatile("prfm pldl1keep, %0" : : "Q"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 0, 3);
#endif
}

// Register tiles of the layers with 8 Vec of registers (AVX2: 16 ymm, NEON: 32 q registers):
// QK gt * qk_vecs accumulators + K vectors + q; PV gt * pv_rows (pv_vecs) accumulators + one V
// row, the probabilities read from L1 as FMA operands (AVX2 overrides vLLM's layout's PV). A
// token-major K row is taken in x = 8 form (a vector = 8 dims of two tokens): the q row,
// reloaded per head and row, is then 8 dims (AVX2: one ymm load, as vLLM's x = 4 form) instead
// of 16, and the token sums need one fold less.
struct EightVecTiles {
  static constexpr int kQkHeads = 4, kRowPvHeads = 3, kTokenPvHeads = 3, kE4m3RowPvHeads = 3;
  static constexpr bool kTokenPvSixes = false;
  static constexpr int kTokenMajorX = 8;
  static constexpr int qk_vecs(int gt) { return gt == 1 ? 4 : gt == 2 ? 2 : 1; }
  static constexpr int pv_rows(int gt, bool /*wide*/) { return gt == 1 ? 4 : 2; }
  static constexpr int pv_vecs(int gt, bool /*wide*/) { return gt == 1 ? 4 : 2; }
  static constexpr bool kRowProbsInRegisters = false, kTokenProbsInRegisters = false;
};

// Up to kMax consecutive blocks of a partition for one call of a matrix-tile QK (the layer's
// tiles_qk_blocks, partition_kernel.h): each block's K slice, its logits at slot 0 (head stride
// L) and the slices to prefetch into L2 meanwhile (null: none).
template <typename T>
struct TileQkBlocks {
  static constexpr int kMax = 4;
  const T* k[kMax];
  float* logits[kMax];
  const char* pf_k[kMax];
  const char* pf_v[kMax];
  int n = 0;
  void add(const T* kblk, float* lg, const char* pk, const char* pv) {
    k[n] = kblk, logits[n] = lg, pf_k[n] = pk, pf_v[n] = pv, ++n;
  }
};

// One block of the partition: where its [kv_head] slices start and which slots are ours.
struct Span {
  int64_t k_offset;  // elements from the K cache base: k_layout.slice(block, kv_head)
  int64_t v_offset;  // elements from the V cache base: v_layout.slice(block, kv_head)
  int lo, hi;        // slots [lo, hi) belong to the partition (and are < seq_len)
  int buf;           // index in the logits buffer of slot 0 of this block
};

// The memory of one block's [kv_head] slice of K or V: `runs` runs of run_bytes, run_stride
// bytes apart (vLLM's layout and HND: one run; NHD: one run per token), as 64-byte lines.
struct SliceBytes {
  int64_t runs = 1, run_bytes = 0, run_stride = 0;
  int64_t lines_per_run() const { return (run_bytes + 63) / 64; }
  int64_t lines() const { return runs * lines_per_run(); }
};

// Prefetches lines [i0, i1) of a slice at base into L2 (one division, then it walks the runs).
inline void prefetch_lines(const char* base, const SliceBytes& m, int64_t i0, int64_t i1) {
  if (base == nullptr || i1 <= i0) return;
  const int64_t per = m.lines_per_run();
  const char* run = base + (i0 / per) * m.run_stride;
  int64_t k = i0 % per;
  for (int64_t i = i0; i < i1; ++i) {
    prefetch_l2(run + 64 * k);
    if (++k == per) k = 0, run += m.run_stride;
  }
}

// The slice memory of a cache: token-major slices whose tokens are not adjacent are a run per
// token; every other slice is one contiguous run of head_size * block_size elements.
inline SliceBytes slice_bytes(KvForm form, const KvLayout& l, int head_size, int block_size,
                              int element_bytes) {
  SliceBytes b;
  const int64_t token_bytes = static_cast<int64_t>(head_size) * element_bytes;
  if (form == KvForm::kTokenMajor && l.token_stride != head_size) {
    b.runs = block_size;
    b.run_bytes = token_bytes;
    b.run_stride = l.token_stride * element_bytes;
  } else {
    b.run_bytes = token_bytes * block_size;
  }
  return b;
}

struct TaskShape {
  int D, bs, C, R;     // head size, block size, K rows, K row length (elements, x form)
  int Dq;              // query row stride of qs (D rounded up to 16, zero padded)
  int L;               // logits buffer stride per head
  int64_t kv_bytes;    // bytes of data in one block's [kv_head] slice of K (or V)
  int64_t k_token_stride, v_token_stride;  // token-major form: elements between tokens
  SliceBytes k_mem, v_mem;                 // where a slice's bytes are (prefetch)
};

// Logits buffer stride per head: a partition's slots plus a block of slack on each side, padded
// to 16 floats.
inline int logits_stride(int block_size) {
  return (kPartitionSize + 2 * block_size + 16 + 15) & ~15;
}

inline int max_spans_of(int block_size) { return kPartitionSize / block_size + 2; }

inline int round_up16(int n) { return (n + 15) & ~15; }

// Items of at most this many tokens take the short path (partition_kernel.h, "short items").
constexpr int kShortTokens = 4;

// A work item's per-thread scratch, as float offsets: logits [G][L] | qs [G][Dq] | norm [G] |
// spans [2][max_spans] (this item's, the next one's) | next K and V block addresses
// [2][max_spans] | v_ahead: [0] nonzero when the item before (on this thread, scratch zeroed at
// the start) prefetched this item's V, [1] how many of this item's first K blocks it prefetched |
// short_rows [2][kShortTokens][Dq]: a short item's K and V
// tokens as fp32 rows. Every part starts on a 16-float boundary.
struct ScratchLayout {
  int64_t qs, norm, spans, next_kv, v_ahead, short_rows, total;
  ScratchLayout(int64_t G, int64_t D, int block_size) {
    constexpr int64_t kSpanFloats = (sizeof(Span) + 3) / 4, kPointerFloats = (sizeof(char*) + 3) / 4;
    const int64_t max_spans = max_spans_of(block_size);
    qs = G * logits_stride(block_size);
    norm = qs + G * round_up16(static_cast<int>(D));
    spans = norm + ((G + 15) & ~15);
    next_kv = spans + ((2 * max_spans * kSpanFloats + 15) & ~15);
    v_ahead = next_kv + ((2 * max_spans * kPointerFloats + 15) & ~15);
    short_rows = v_ahead + 16;
    total = short_rows + 2 * kShortTokens * round_up16(static_cast<int>(D));
  }
};

// Prefetches into L2, while a block's K rows are scored, each row's share of two slices: a K
// slice at pf_k and a V slice at pf_v (either may be null). Row c of the s.C rows, called in
// order, takes lines [n c / C, n (c + 1) / C) of a slice's n lines. Incremental: two
// divisions per slice per block, none per row (a division per bound per row cost about as
// much as the QK arithmetic of a bf16 block on avx2-fma, docs/CPU_KERNEL.md).
class RowSharePrefetch {
 public:
  // rows: row() calls per block (the K rows s.C for the x-form QK loops).
  PA_DECODE_INLINE RowSharePrefetch(const char* pf_k, const char* pf_v, const TaskShape& s,
                                    int rows)
      : k_(pf_k, s.k_mem, rows), v_(pf_v, s.v_mem, rows) {}
  bool active() const { return k_.line_left > 0 || v_.line_left > 0; }
  PA_DECODE_INLINE void row() {  // inlined: a call in the QK loop would spill its accumulators
    k_.row();
    v_.row();
  }

 private:
  struct Slice {
    const char* run;      // the run holding the next line
    int64_t k = 0;        // the next line: run + 64 k
    int64_t per, stride;  // lines per run, bytes between runs
    int64_t line_left;    // lines not prefetched yet (0: nothing to do)
    int64_t q, r, acc = 0;  // lines per row = q, plus one where acc (r per row) passes C
    int C;
    PA_DECODE_INLINE Slice(const char* base, const SliceBytes& m, int rows)
        : run(base), per(m.lines_per_run()), stride(m.run_stride),
          line_left(base && rows > 0 ? m.lines() : 0), q(0), r(0), C(rows) {
      if (line_left > 0) q = line_left / rows, r = line_left % rows;  // no division when idle
    }
    PA_DECODE_INLINE void row() {
      int64_t n = q;
      if ((acc += r) >= C) acc -= C, ++n;
      for (n = std::min(n, line_left), line_left -= n; n > 0; --n) {
        prefetch_l2(run + 64 * k);
        if (++k == per) k = 0, run += stride;
      }
    }
  };
  Slice k_, v_;
};

// Cache lines of a list of slices, prefetched into L2 a few lines per step(): spreads the next
// work item's K (and V) over this item's loops (a burst would stall on the miss buffers).
// Slices [0, nfirst) have the memory `mem`, the rest `mem_rest` (K and V may differ).
struct PrefetchStream {
  const char* const* blocks = nullptr;
  int nblocks = 0, nfirst = 0;
  SliceBytes mem, mem_rest;
  int lines_per_step = 0;
  int b = -1;                     // slice being prefetched (-1: none yet)
  const char* run = nullptr;      // its run being prefetched
  const char* line = nullptr;     // the next line of that run
  int64_t line_left = 0, runs_left = 0;  // lines left in the run, runs after it in the slice
  void step(int times = 1) {
    for (int n = times * lines_per_step; n > 0; --n) {
      if (line_left == 0 && !next_run()) return;
      prefetch_l2(line);
      line += 64;
      --line_left;
    }
  }
  // Moves to the next run (of this slice or the next one); false at the end.
  bool next_run() {
    if (runs_left == 0) {
      if (b + 1 >= nblocks) return false;
      run = blocks[++b];
      runs_left = slice().runs;
    } else {
      run += slice().run_stride;
    }
    --runs_left;
    line = run;
    line_left = slice().lines_per_run();
    return line_left > 0;
  }
  const SliceBytes& slice() const { return b < nfirst ? mem : mem_rest; }
};

// The blocks of the partition of `task` (tokens [t_begin, t_end)); returns their count.
inline int partition_spans(const PagedAttentionParams& p, PartitionTask task, int bs, Span* spans) {
  const int seq_len = p.seq_lens[task.seq];
  const int t_begin = task.partition * kPartitionSize;
  const int t_end = std::min(seq_len, t_begin + kPartitionSize);
  const int b_first = t_begin / bs, b_last = (t_end - 1) / bs;
  const int32_t* table = p.block_tables + static_cast<int64_t>(task.seq) * p.max_blocks_per_seq;
  int n = 0;
  for (int b = b_first; b <= b_last; ++b, ++n) {
    Span& sp = spans[n];
    sp.k_offset = p.k_layout.slice(table[b], task.kv_head);  // NOTE: 64-bit
    sp.v_offset = p.v_layout.slice(table[b], task.kv_head);
    sp.lo = std::max(t_begin - b * bs, 0);
    sp.hi = std::min(t_end - b * bs, bs);
    sp.buf = n * bs;
  }
  return n;
}

}  // namespace cpu
}  // namespace paged_attn
