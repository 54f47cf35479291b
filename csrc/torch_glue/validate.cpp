// validate.cpp — argument checks of CONTRACT.md and tensors -> params (see validate.h).
#include "validate.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <sstream>

namespace paged_attn {
namespace {

// TORCH_CHECK_VALUE with the "paged_attn.<op>: " prefix every message carries.
#define PA_CHECK(cond, ...) TORCH_CHECK_VALUE(cond, "paged_attn.", op, ": ", __VA_ARGS__)

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

void check_same_device(const char* op, const at::Tensor& ref, const char* ref_name,
                       const at::Tensor& t, const char* name) {
  PA_CHECK(t.device() == ref.device(), name, " is on device ", t.device(), " but ", ref_name,
           " is on device ", ref.device(), " (all tensors must be on one device)");
}

bool is_attention_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

ScalarKind scalar_kind_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ScalarKind::kFloat32;
    case at::kHalf: return ScalarKind::kFloat16;
    default: return ScalarKind::kBFloat16;
  }
}

// The kv_cache_dtype names (paged_attention_ext/schemas.py's KV_CACHE_DTYPES, written by the
// build): name, cache kind, the kind's own name.
struct KvCacheDtype {
  const char* name;
  CacheKind kind;
  const char* kind_name;
};
constexpr KvCacheDtype kKvCacheDtypes[] = {
#define PAGED_ATTN_KV_CACHE_DTYPE(name, enumerator, kind_name) \
  {name, CacheKind::enumerator, kind_name},
#include "paged_attn_kv_cache_dtypes.inc"
#undef PAGED_ATTN_KV_CACHE_DTYPE
};

const char* kv_cache_dtype_name(CacheKind kind) {
  for (const KvCacheDtype& d : kKvCacheDtypes)
    if (d.kind == kind) return d.kind_name;
  return "?";  // never: every CacheKind has a kind name (tests/test_core_constants.py)
}

// Sizes of the caches as the checks found them.
struct CacheShape {
  int64_t num_blocks, num_kv_heads, head_size, block_size, x;
};

// K [num_blocks, num_kv_heads, head_size / x, block_size, x], V [num_blocks, num_kv_heads,
// head_size, block_size]; `elem_dtype` is the query/key dtype (the cache dtype when "auto").
CacheShape check_caches(const char* op, const at::Tensor& key_cache,
                        const at::Tensor& value_cache, CacheKind kind,
                        at::ScalarType elem_dtype, const char* elem_name) {
  PA_CHECK(key_cache.dim() == 5, "key_cache must be 5-D [num_blocks, num_kv_heads, ",
           "head_size / x, block_size, x], got shape ", shape_str(key_cache));
  PA_CHECK(value_cache.dim() == 4, "value_cache must be 4-D [num_blocks, num_kv_heads, ",
           "head_size, block_size], got shape ", shape_str(value_cache));
  if (kind == CacheKind::kAuto) {
    PA_CHECK(key_cache.scalar_type() == elem_dtype, "key_cache dtype ", key_cache.scalar_type(),
             " must match ", elem_name, " dtype ", elem_dtype, " for kv_cache_dtype=auto");
    PA_CHECK(value_cache.scalar_type() == elem_dtype, "value_cache dtype ",
             value_cache.scalar_type(), " must match ", elem_name, " dtype ", elem_dtype,
             " for kv_cache_dtype=auto");
  } else {
    PA_CHECK(key_cache.scalar_type() == at::kByte, "key_cache dtype ", key_cache.scalar_type(),
             " must be uint8 for kv_cache_dtype=", kv_cache_dtype_name(kind));
    PA_CHECK(value_cache.scalar_type() == at::kByte, "value_cache dtype ",
             value_cache.scalar_type(), " must be uint8 for kv_cache_dtype=",
             kv_cache_dtype_name(kind));
  }
  const int64_t x = vllm_key_x(key_cache.element_size());
  PA_CHECK(key_cache.size(4) == x, "key_cache.size(4) must be x = 16 / element size = ", x,
           ", got ", key_cache.size(4));
  const bool same_blocks = value_cache.size(0) == key_cache.size(0) &&
                           value_cache.size(1) == key_cache.size(1) &&
                           value_cache.size(3) == key_cache.size(3);
  PA_CHECK(same_blocks, "value_cache shape ", shape_str(value_cache),
           " does not match key_cache shape ", shape_str(key_cache),
           " (num_blocks, num_kv_heads and block_size must agree)");
  PA_CHECK(value_cache.stride(0) == key_cache.stride(0) &&
               value_cache.stride(1) == key_cache.stride(1),
           "value_cache block/head strides (", value_cache.stride(0), ", ", value_cache.stride(1),
           ") do not match key_cache strides (", key_cache.stride(0), ", ", key_cache.stride(1),
           ")");
  const int64_t block_size = key_cache.size(3);
  PA_CHECK(key_cache.stride(4) == 1 && key_cache.stride(3) == x &&
               key_cache.stride(2) == block_size * x,
           "key_cache must be contiguous in its inner dims [head_size / x, block_size, x] ",
           "(got stride ", key_cache.strides(), ")");
  PA_CHECK(value_cache.stride(3) == 1 && value_cache.stride(2) == block_size,
           "value_cache must be contiguous in its inner dims [head_size, block_size] (got stride ",
           value_cache.strides(), ")");
  check_same_device(op, key_cache, "key_cache", value_cache, "value_cache");
  return CacheShape{key_cache.size(0), key_cache.size(1), value_cache.size(2), block_size, x};
}

// head_size (of the query or key) against the caches: divisible by x, and K's
// size(2) * x and V's size(2) equal to it.
void check_head_size(const char* op, int64_t head_size, const at::Tensor& key_cache,
                     const CacheShape& cache) {
  PA_CHECK(head_size % cache.x == 0, "head_size (", head_size, ") must be divisible by x (",
           cache.x, ")");
  PA_CHECK(key_cache.size(2) * cache.x == head_size, "head_size (", head_size,
           ") does not match key_cache (size(2) * x = ", key_cache.size(2) * cache.x, ")");
  PA_CHECK(cache.head_size == head_size, "head_size (", head_size,
           ") does not match value_cache.size(2) (", cache.head_size, ")");
}

// A k_scale / v_scale tensor: one float32 element on the query's device.
const float* scale_pointer(const char* op, const ScaleArg& s, const char* name,
                           const at::Tensor& query) {
  if (s.tensor == nullptr) return nullptr;
  const at::Tensor& t = *s.tensor;
  PA_CHECK(t.numel() == 1 && t.scalar_type() == at::kFloat, name,
           " must be a float or a 1-element float32 tensor, got dtype ", t.scalar_type(),
           " with ", t.numel(), " elements");
  check_same_device(op, query, "query", t, name);
  return t.data_ptr<float>();
}

void check_scratch(const char* op, const at::Tensor& t, const char* name, int64_t num_seqs,
                   int64_t num_heads, int64_t num_partitions, int64_t head_size,
                   at::ScalarType dtype, const at::Tensor& query) {
  const bool is_tmp_out = head_size > 0;
  std::vector<int64_t> want{num_seqs, num_heads, num_partitions};
  if (is_tmp_out) want.push_back(head_size);
  PA_CHECK(t.sizes().vec() == want, name, " shape ", shape_str(t), " must be ",
           is_tmp_out ? "[num_seqs, num_heads, max_num_partitions, head_size] = "
                      : "[num_seqs, num_heads, max_num_partitions] = ",
           c10::IntArrayRef(want));
  if (is_tmp_out) {
    PA_CHECK(t.scalar_type() == dtype, name, " dtype ", t.scalar_type(),
             " must match query dtype ", dtype);
  } else {
    PA_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ", t.scalar_type());
  }
  PA_CHECK(t.is_contiguous(), name, " must be contiguous");
  check_same_device(op, query, "query", t, name);
}

}  // namespace

CacheKind parse_kv_cache_dtype(const char* op, const std::string& kv_cache_dtype) {
  std::string expected;  // "'auto', 'fp8', 'fp8_e4m3' or 'fp8_e5m2'"
  constexpr size_t count = sizeof(kKvCacheDtypes) / sizeof(kKvCacheDtypes[0]);
  for (size_t i = 0; i < count; ++i) {
    if (kv_cache_dtype == kKvCacheDtypes[i].name) return kKvCacheDtypes[i].kind;
    expected += (i == 0 ? "'" : (i + 1 == count ? " or '" : ", '"));
    expected += std::string(kKvCacheDtypes[i].name) + "'";
  }
  PA_CHECK(false, "unknown kv_cache_dtype '", kv_cache_dtype, "' (expected ", expected, ")");
  return CacheKind::kAuto;  // unreachable
}

namespace {

// Active blocksparse arguments must make sense (sparse block size > 0, local blocks >= 0,
// tp_rank >= 0, each a 32-bit int, as vLLM's kernel takes them); inactive ones are ignored.
void check_blocksparse(const char* op, const AttentionArgs& a) {
  if (a.blocksparse_vert_stride <= 1) return;  // inactive: vLLM ignores the other four
  const std::string why = "when blocksparse is active (blocksparse_vert_stride = " +
                          std::to_string(a.blocksparse_vert_stride) + " > 1)";
  PA_CHECK(a.blocksparse_block_size > 0, "blocksparse_block_size (", a.blocksparse_block_size,
           ") must be > 0 ", why);
  PA_CHECK(a.blocksparse_local_blocks >= 0, "blocksparse_local_blocks (",
           a.blocksparse_local_blocks, ") must be >= 0 ", why);
  PA_CHECK(a.tp_rank >= 0, "tp_rank (", a.tp_rank, ") must be >= 0 ", why);
  constexpr int64_t kInt32Max = 2147483647;
  for (auto [name, value] :
       {std::pair<const char*, int64_t>{"tp_rank", a.tp_rank},
        {"blocksparse_local_blocks", a.blocksparse_local_blocks},
        {"blocksparse_vert_stride", a.blocksparse_vert_stride},
        {"blocksparse_block_size", a.blocksparse_block_size},
        {"blocksparse_head_sliding_step", a.blocksparse_head_sliding_step}})
    PA_CHECK(value >= -kInt32Max && value <= kInt32Max, name, " (", value,
             ") must fit in a 32-bit int (|value| <= ", kInt32Max, ") ", why);
}

// query [num_seqs, num_heads, head_size], last dim contiguous.
void check_query(const char* op, const at::Tensor& query) {
  PA_CHECK(query.dim() == 3, "query must be 3-D [num_seqs, num_heads, head_size], got shape ",
           shape_str(query));
  PA_CHECK(is_attention_dtype(query.scalar_type()), "query dtype ", query.scalar_type(),
           " must be float32, float16 or bfloat16");
  PA_CHECK(query.stride(2) == 1, "query must have a contiguous last dim (got stride ",
           query.strides(), ")");
}

// block_tables, seq_lens and out of every attention op (v1, v2, decode).
void check_rows_and_out(const char* op, const at::Tensor& out, const at::Tensor& query,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens) {
  const int64_t num_seqs = query.size(0);
  PA_CHECK(block_tables.scalar_type() == at::kInt, "block_tables must be int32, got ",
           block_tables.scalar_type());
  PA_CHECK(seq_lens.scalar_type() == at::kInt, "seq_lens must be int32, got ",
           seq_lens.scalar_type());
  PA_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs, "block_tables shape ",
           shape_str(block_tables), " must be [num_seqs = ", num_seqs, ", max_blocks_per_seq]");
  PA_CHECK(seq_lens.dim() == 1 && seq_lens.size(0) == num_seqs, "seq_lens shape ",
           shape_str(seq_lens), " must be [num_seqs = ", num_seqs, "]");
  PA_CHECK(block_tables.is_contiguous(), "block_tables must be contiguous");
  PA_CHECK(seq_lens.is_contiguous(), "seq_lens must be contiguous");

  PA_CHECK(out.sizes() == query.sizes(), "out shape ", shape_str(out),
           " must be [num_seqs, num_heads, head_size] = ", query.sizes());
  PA_CHECK(out.scalar_type() == query.scalar_type(), "out dtype ", out.scalar_type(),
           " must match query dtype ", query.scalar_type());
  PA_CHECK(out.is_contiguous(), "out must be contiguous");
}

// alibi_slopes: float32 [num_heads] or None (nullptr).
const float* check_alibi(const char* op, const at::Tensor& query,
                         const std::optional<at::Tensor>& alibi_slopes) {
  const int64_t num_heads = query.size(1);
  if (!alibi_slopes.has_value()) return nullptr;
  const at::Tensor& a = *alibi_slopes;
  PA_CHECK(a.dim() == 1 && a.size(0) == num_heads && a.scalar_type() == at::kFloat &&
               a.is_contiguous(),
           "alibi_slopes must be a contiguous float32 tensor of shape [num_heads = ", num_heads,
           "], got dtype ", a.scalar_type(), " shape ", shape_str(a));
  check_same_device(op, query, "query", a, "alibi_slopes");
  return a.data_ptr<float>();
}

// The checks every attention op (v1, v2, decode; `Args`: AttentionArgs or DecodeArgs) starts
// with: kv_cache_dtype, the query, and one device for every tensor. Returns the cache kind.
template <typename Args>
CacheKind check_attention_common(const char* op, const Args& a) {
  const CacheKind cache_kind = parse_kv_cache_dtype(op, a.kv_cache_dtype);
  check_query(op, a.query);
  for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&a.out, "out"},
                         {&a.key_cache, "key_cache"}, {&a.value_cache, "value_cache"},
                         {&a.block_tables, "block_tables"}, {&a.seq_lens, "seq_lens"}}) {
    check_same_device(op, a.query, "query", *t, name);
  }
  return cache_kind;
}

// Everything of the params but the caches' layouts, heads and sizes (filled by the caller), once
// the checks passed.
template <typename Args>
PagedAttentionParams attention_params(const char* op, const Args& a, CacheKind cache_kind) {
  const at::Tensor& query = a.query;
  PagedAttentionParams p{};
  p.out = a.out.data_ptr();
  p.query = query.data_ptr();
  p.key_cache = a.key_cache.data_ptr();
  p.value_cache = a.value_cache.data_ptr();
  p.block_tables = a.block_tables.template data_ptr<int32_t>();
  p.seq_lens = a.seq_lens.template data_ptr<int32_t>();
  p.alibi_slopes = check_alibi(op, query, a.alibi_slopes);
  p.k_scale_ptr = scale_pointer(op, a.k_scale, "k_scale", query);
  p.v_scale_ptr = scale_pointer(op, a.v_scale, "v_scale", query);
  p.k_scale = static_cast<float>(a.k_scale.value);
  p.v_scale = static_cast<float>(a.v_scale.value);
  p.scale = static_cast<float>(a.scale);
  p.q_seq_stride = query.stride(0);
  p.q_head_stride = query.stride(1);
  p.num_seqs = static_cast<int>(query.size(0));
  p.num_heads = static_cast<int>(query.size(1));
  p.head_size = static_cast<int>(query.size(2));
  p.max_blocks_per_seq = static_cast<int>(a.block_tables.size(1));
  p.num_blocks = a.key_cache.size(0);
  p.max_num_partitions = 1;
  p.scalar_kind = scalar_kind_of(query.scalar_type());
  p.cache_kind = cache_kind;
  return p;
}

// Token-major caches [num_blocks, block_size, num_kv_heads, head_size] (decode and
// reshape_and_cache_flash, validation.py _check_flash_caches): one shape for K and V, any
// strides with stride(-1) == 1 (K and V may differ), block_size > 0.
void check_token_major_caches(const char* op, const at::Tensor& key_cache,
                              const at::Tensor& value_cache, CacheKind kind,
                              at::ScalarType elem_dtype, const char* elem_name) {
  constexpr const char* kNhd = "[num_blocks, block_size, num_kv_heads, head_size]";
  const std::pair<const at::Tensor*, const char*> caches[] = {{&key_cache, "key_cache"},
                                                              {&value_cache, "value_cache"}};
  for (auto [t, name] : caches)
    PA_CHECK(t->dim() == 4, name, " must be 4-D ", kNhd,
             " (an HND cache is passed as cache.transpose(1, 2)), got shape ", shape_str(*t));
  for (auto [t, name] : caches) {
    if (kind == CacheKind::kAuto) {
      PA_CHECK(t->scalar_type() == elem_dtype, name, " dtype ", t->scalar_type(), " must match ",
               elem_name, " dtype ", elem_dtype, " for kv_cache_dtype=auto");
    } else {
      PA_CHECK(t->scalar_type() == at::kByte, name, " dtype ", t->scalar_type(),
               " must be uint8 for kv_cache_dtype=", kv_cache_dtype_name(kind));
    }
  }
  PA_CHECK(value_cache.sizes() == key_cache.sizes(), "value_cache shape ", shape_str(value_cache),
           " does not match key_cache shape ", shape_str(key_cache),
           " (the K and V caches must have one shape ", kNhd, ")");
  for (auto [t, name] : caches)
    PA_CHECK(t->stride(3) == 1, name, " must have a contiguous last dim (head_size) (got stride ",
             t->strides(), ")");
  check_same_device(op, key_cache, "key_cache", value_cache, "value_cache");
  PA_CHECK(key_cache.size(1) > 0, "block_size (key_cache.size(1) = ", key_cache.size(1),
           ") must be > 0");
}

KvLayout token_major_of(const at::Tensor& cache) {
  return token_major_layout(cache.stride(0), cache.stride(1), cache.stride(2), cache.size(3));
}

}  // namespace

PagedAttentionParams make_attention_params(const char* op, const AttentionArgs& a) {
  check_blocksparse(op, a);
  const CacheKind cache_kind = check_attention_common(op, a);
  const at::Tensor& query = a.query;
  const int64_t num_seqs = query.size(0), num_heads = query.size(1), head_size = query.size(2);

  // ---- heads ----
  PA_CHECK(a.num_kv_heads > 0 && num_heads % a.num_kv_heads == 0, "num_heads (", num_heads,
           ") must be divisible by num_kv_heads (", a.num_kv_heads, ")");

  // ---- caches ----
  const CacheShape cache =
      check_caches(op, a.key_cache, a.value_cache, cache_kind, query.scalar_type(), "query");
  PA_CHECK(cache.num_kv_heads == a.num_kv_heads, "num_kv_heads (", a.num_kv_heads,
           ") does not match key_cache.size(1) (", cache.num_kv_heads, ")");
  check_head_size(op, head_size, a.key_cache, cache);
  PA_CHECK(a.block_size == cache.block_size, "block_size (", a.block_size,
           ") does not match key_cache.size(3) (", cache.block_size, ")");

  // ---- block table, lengths, outputs ----
  check_rows_and_out(op, a.out, query, a.block_tables, a.seq_lens);
  int64_t max_num_partitions = 1;
  const bool is_v2 = a.tmp_out != nullptr;
  if (is_v2) {
    const at::Tensor& tmp_out = *a.tmp_out;
    PA_CHECK(tmp_out.dim() == 4, "tmp_out shape ", shape_str(tmp_out),
             " must be [num_seqs, num_heads, max_num_partitions, head_size]");
    max_num_partitions = tmp_out.size(2);
    PA_CHECK(max_num_partitions >= 1, "tmp_out shape ", shape_str(tmp_out),
             " must have max_num_partitions >= 1");
    check_scratch(op, *a.exp_sums, "exp_sums", num_seqs, num_heads, max_num_partitions, 0,
                  query.scalar_type(), query);
    check_scratch(op, *a.max_logits, "max_logits", num_seqs, num_heads, max_num_partitions, 0,
                  query.scalar_type(), query);
    check_scratch(op, tmp_out, "tmp_out", num_seqs, num_heads, max_num_partitions, head_size,
                  query.scalar_type(), query);
  }

  PagedAttentionParams p = attention_params(op, a, cache_kind);
  p.exp_sums = is_v2 ? a.exp_sums->data_ptr<float>() : nullptr;
  p.max_logits = is_v2 ? a.max_logits->data_ptr<float>() : nullptr;
  p.tmp_out = is_v2 ? a.tmp_out->data_ptr() : nullptr;
  p.blocksparse = BlocksparseParams{a.blocksparse_vert_stride, a.blocksparse_block_size,
                                     a.blocksparse_local_blocks, a.blocksparse_head_sliding_step,
                                     a.tp_rank};
  p.kv_form = KvForm::kVllm;
  p.k_layout =
      vllm_key_layout(a.key_cache.stride(0), a.key_cache.stride(1), a.block_size, cache.x);
  p.v_layout = vllm_value_layout(a.value_cache.stride(0), a.value_cache.stride(1), a.block_size);
  p.num_kv_heads = static_cast<int>(a.num_kv_heads);
  p.block_size = static_cast<int>(a.block_size);
  p.max_num_partitions = static_cast<int>(max_num_partitions);
  p.partition_size = is_v2 ? kPartitionSize : 0;
  p.max_seq_len = static_cast<int>(a.max_seq_len);
  return p;
}

PagedAttentionParams make_decode_params(const char* op, const DecodeArgs& a) {
  const CacheKind cache_kind = check_attention_common(op, a);
  const at::Tensor& query = a.query;
  const int64_t num_heads = query.size(1), head_size = query.size(2);
  check_token_major_caches(op, a.key_cache, a.value_cache, cache_kind, query.scalar_type(),
                           "query");
  const int64_t block_size = a.key_cache.size(1), num_kv_heads = a.key_cache.size(2);
  PA_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads (", num_heads,
           ") must be divisible by num_kv_heads (", num_kv_heads, ", key_cache.size(2))");
  PA_CHECK(a.key_cache.size(3) == head_size, "head_size (", head_size,
           ") does not match key_cache.size(3) (", a.key_cache.size(3), ")");
  check_rows_and_out(op, a.out, query, a.block_tables, a.seq_lens);

  PagedAttentionParams p = attention_params(op, a, cache_kind);
  p.kv_form = KvForm::kTokenMajor;
  p.k_layout = token_major_of(a.key_cache);
  p.v_layout = token_major_of(a.value_cache);
  p.num_kv_heads = static_cast<int>(num_kv_heads);
  p.block_size = static_cast<int>(block_size);
  p.max_seq_len = static_cast<int>(std::min<int64_t>(a.block_tables.size(1) * block_size,
                                                     2147483647));
  return p;
}

void check_attention_data(const char* op, const PagedAttentionParams& p, bool is_v2) {
  const int64_t capacity = static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int64_t seq_len = p.seq_lens[s];
    PA_CHECK(seq_len >= 0, "seq_lens[", s, "] = ", seq_len, " is negative");
    PA_CHECK(seq_len <= capacity, "seq_lens[", s, "] = ", seq_len,
             " exceeds the block table's capacity max_blocks_per_seq * block_size = ", capacity);
    if (is_v2) {
      const int64_t needed = (seq_len + kPartitionSize - 1) / kPartitionSize;
      PA_CHECK(needed <= p.max_num_partitions, "max_num_partitions (tmp_out.size(2) = ",
               p.max_num_partitions, ") is too small for seq_lens[", s, "] = ", seq_len,
               ", which needs ", needed, " partitions of ", kPartitionSize, " tokens");
    }
    const int64_t used_blocks = (seq_len + p.block_size - 1) / p.block_size;
    const int32_t* row = p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq;
    for (int64_t b = 0; b < used_blocks; ++b) {
      PA_CHECK(row[b] >= 0 && row[b] < p.num_blocks, "block_tables[", s, ", ", b, "] = ", row[b],
               " is out of range [0, num_blocks = ", p.num_blocks, ")");
    }
  }
}

namespace {

// Both cache writes: kv_cache_dtype, and key / value [num_tokens, num_kv_heads, head_size] (one
// shape and dtype, last dim contiguous) on the device of every other tensor. Returns the cache
// kind.
CacheKind check_new_tokens(const char* op, const CacheArgs& a) {
  const CacheKind cache_kind = parse_kv_cache_dtype(op, a.kv_cache_dtype);
  const at::Tensor &key = a.key, &value = a.value;
  PA_CHECK(key.dim() == 3, "key shape ", shape_str(key),
           " must be [num_tokens, num_kv_heads, head_size]");
  PA_CHECK(is_attention_dtype(key.scalar_type()), "key dtype ", key.scalar_type(),
           " must be float32, float16 or bfloat16");
  PA_CHECK(value.sizes() == key.sizes(), "value shape ", shape_str(value),
           " must equal key shape ", shape_str(key));
  PA_CHECK(value.scalar_type() == key.scalar_type(), "value dtype ", value.scalar_type(),
           " must match key dtype ", key.scalar_type());
  PA_CHECK(key.stride(2) == 1 && value.stride(2) == 1,
           "key and value must have a contiguous last dim (got strides ", key.strides(), " and ",
           value.strides(), ")");
  for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&value, "value"},
                         {&a.key_cache, "key_cache"}, {&a.value_cache, "value_cache"},
                         {&a.slot_mapping, "slot_mapping"}}) {
    check_same_device(op, key, "key", *t, name);
  }
  return cache_kind;
}

// Both cache writes: the pointers, scales and token strides (the caller adds the layouts / sizes).
ReshapeAndCacheParams new_token_params(const char* op, const CacheArgs& a, CacheKind cache_kind) {
  ReshapeAndCacheParams p{};
  p.key = a.key.data_ptr();
  p.value = a.value.data_ptr();
  p.key_cache = a.key_cache.data_ptr();
  p.value_cache = a.value_cache.data_ptr();
  p.slot_mapping = a.slot_mapping.data_ptr<int64_t>();
  p.k_scale_ptr = scale_pointer(op, a.k_scale, "k_scale", a.key);
  p.v_scale_ptr = scale_pointer(op, a.v_scale, "v_scale", a.key);
  p.k_scale = static_cast<float>(a.k_scale.value);
  p.v_scale = static_cast<float>(a.v_scale.value);
  p.key_token_stride = a.key.stride(0);
  p.key_head_stride = a.key.stride(1);
  p.value_token_stride = a.value.stride(0);
  p.value_head_stride = a.value.stride(1);
  p.scalar_kind = scalar_kind_of(a.key.scalar_type());
  p.cache_kind = cache_kind;
  return p;
}

}  // namespace

ReshapeAndCacheParams make_cache_params(const char* op, const CacheArgs& a) {
  const CacheKind cache_kind = check_new_tokens(op, a);
  const CacheShape cache =
      check_caches(op, a.key_cache, a.value_cache, cache_kind, a.key.scalar_type(), "key");
  const int64_t num_rows = a.key.size(0), head_size = a.key.size(2);
  PA_CHECK(a.key.size(1) == cache.num_kv_heads, "key shape ", shape_str(a.key),
           " does not match key_cache (num_kv_heads = ", cache.num_kv_heads, ")");
  check_head_size(op, head_size, a.key_cache, cache);
  PA_CHECK(a.slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
           a.slot_mapping.scalar_type());
  // vLLM's rule: slot_mapping says how many tokens to store; key may hold more rows (padding).
  PA_CHECK(a.slot_mapping.dim() == 1 && a.slot_mapping.size(0) <= num_rows &&
               a.slot_mapping.is_contiguous(),
           "slot_mapping shape ", shape_str(a.slot_mapping),
           " must be [num_tokens] with num_tokens <= key.size(0) = ", num_rows,
           ", and contiguous");

  ReshapeAndCacheParams p = new_token_params(op, a, cache_kind);
  p.k_layout = vllm_key_layout(a.key_cache.stride(0), a.key_cache.stride(1), cache.block_size,
                               cache.x);
  p.v_layout =
      vllm_value_layout(a.value_cache.stride(0), a.value_cache.stride(1), cache.block_size);
  p.num_tokens = a.slot_mapping.size(0);
  p.num_kv_heads = static_cast<int>(cache.num_kv_heads);
  p.head_size = static_cast<int>(head_size);
  p.block_size = static_cast<int>(cache.block_size);
  p.num_blocks = cache.num_blocks;
  return p;
}

ReshapeAndCacheParams make_flash_cache_params(const char* op, const CacheArgs& a) {
  const CacheKind cache_kind = check_new_tokens(op, a);
  const at::Tensor &key = a.key, &key_cache = a.key_cache, &slot_mapping = a.slot_mapping;
  check_token_major_caches(op, key_cache, a.value_cache, cache_kind, key.scalar_type(), "key");
  PA_CHECK(key.size(1) == key_cache.size(2), "key shape ", shape_str(key),
           " does not match key_cache (num_kv_heads = key_cache.size(2) = ", key_cache.size(2),
           ")");
  PA_CHECK(key.size(2) == key_cache.size(3), "head_size (", key.size(2),
           ") does not match key_cache.size(3) (", key_cache.size(3), ")");
  PA_CHECK(slot_mapping.scalar_type() == at::kLong, "slot_mapping must be int64, got ",
           slot_mapping.scalar_type());
  // vLLM's rule: slot_mapping says how many tokens to store; key may hold more rows (padding).
  PA_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) <= key.size(0) &&
               slot_mapping.is_contiguous(),
           "slot_mapping shape ", shape_str(slot_mapping),
           " must be [num_tokens] with num_tokens <= key.size(0) = ", key.size(0),
           ", and contiguous");

  ReshapeAndCacheParams p = new_token_params(op, a, cache_kind);
  p.k_layout = token_major_of(key_cache);
  p.v_layout = token_major_of(a.value_cache);
  p.num_tokens = slot_mapping.size(0);
  p.num_kv_heads = static_cast<int>(key_cache.size(2));
  p.head_size = static_cast<int>(key_cache.size(3));
  p.block_size = static_cast<int>(key_cache.size(1));
  p.num_blocks = key_cache.size(0);
  return p;
}

void check_cache_data(const char* op, const ReshapeAndCacheParams& p) {
  const int64_t num_slots = p.num_blocks * p.block_size;
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    const int64_t slot = p.slot_mapping[i];
    PA_CHECK(slot < num_slots, "slot_mapping[", i, "] = ", slot,
             " is out of range [0, num_blocks * block_size = ", num_slots, ")");
  }
}

}  // namespace paged_attn
