// qk_register_tiles.h — QK on register tiles: the logits of a head tile for one block's K in
// x form (vLLM's layout, token-major), K rows scored into 16-token sums (partition_kernel.h's
// overview, "QK").
// Included by partition_kernel.h (after its Vec, Mask, IsaFor, form_x and tile_heads), in the
// namespace of the ISA that includes it: compiled once per ISA file, like the algorithm.
#ifndef PA_ISA
#error "qk_register_tiles.h is included by partition_kernel.h, inside an ISA file's target region"
#endif

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

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

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
