// short_items.h — the items of at most kShortTokens tokens: their K and V tokens gathered
// into fp32 rows, QK and PV per token.
// Included by partition_kernel.h (after its Vec, Mask, IsaFor, form_x and tile_heads), in the
// namespace of the ISA that includes it: compiled once per ISA file, like the algorithm.
#ifndef PA_ISA
#error "short_items.h is included by partition_kernel.h, inside an ISA file's target region"
#endif

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

// An item of at most kShortTokens tokens (kernel_common.h; a sequence's first decode steps):
// the block-wide QK and PV (qk_register_tiles.h, pv_register_tiles.h) cost as much for one token
// as for a whole block (every slot of a K row; in vLLM's layout one horizontal sum per head dim),
// so here the item's K and V tokens are first gathered into fp32 rows and the work is per token:
// a dot product per (head, token), a weighted sum of V rows per head. Only the item's slots are
// read.
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

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
