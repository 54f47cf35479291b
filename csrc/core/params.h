// params.h — plain structs of pointers, strides and sizes handed from the torch glue (launchers)
// to the kernels. Framework-free: no torch header, usable from C++ and CUDA device code.
//
// Every stride is in ELEMENTS of the tensor it belongs to and is 64-bit.
// NOTE: block offsets are int64 (block_id * block_stride overflows int32 on large pools).
#pragma once

#include <cstdint>

#include "blocksparse.h"
#include "kv_layout.h"

namespace paged_attn {

// v2's partition length in tokens (CONTRACT.md: tmp_out.size(2) counts partitions of this size).
// The v2 op always uses it; the CUDA v1 / decode split (core/split_plan.h) picks its own size
// and passes it in PagedAttentionParams::partition_size.
constexpr int kPartitionSize = 512;

// How the KV cache stores its elements (kv_cache_dtype).
enum class CacheKind : int {
  kAuto = 0,     // cache dtype == query dtype (fp32 / fp16 / bf16)
  kFp8E4M3 = 1,  // uint8 bytes, float8_e4m3fn ("fp8", "fp8_e4m3"); value = decode(byte) * scale
  kFp8E5M2 = 2,  // uint8 bytes, float8_e5m2 ("fp8_e5m2"); value = decode(byte) * scale
};

// Element type of query / out / tmp_out (and of the cache when CacheKind::kAuto).
enum class ScalarKind : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// Bytes of one query / out / tmp_out element.
constexpr int scalar_bytes(ScalarKind s) { return s == ScalarKind::kFloat32 ? 4 : 2; }

// Bytes of one KV-cache element: the query dtype's for "auto", one for fp8.
constexpr int cache_element_bytes(ScalarKind s, CacheKind c) {
  return c == CacheKind::kAuto ? scalar_bytes(s) : 1;
}

struct PagedAttentionParams {
  // ---- outputs ----
  void* out;            // [num_seqs, num_heads, head_size], contiguous, query dtype
  float* exp_sums;      // [num_seqs, num_heads, max_num_partitions], contiguous (v2 only)
  float* max_logits;    // [num_seqs, num_heads, max_num_partitions], contiguous (v2 only)
  void* tmp_out;        // [num_seqs, num_heads, max_num_partitions, head_size], contiguous,
                        // query dtype (v2 only)
  // ---- inputs ----
  const void* query;        // [num_seqs, num_heads, head_size], last dim contiguous
  const void* key_cache;    // addressed by k_layout (v1 / v2: vLLM's K, decode: token-major)
  const void* value_cache;  // addressed by v_layout (v1 / v2: vLLM's V, decode: token-major)
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq], contiguous
  const int32_t* seq_lens;      // [num_seqs]
  const float* alibi_slopes;    // [num_heads] or nullptr

  // K/V dequantisation scales (used only for fp8 caches): a device/host pointer to one float
  // when the tensor overload was called (read on the device: no host sync), else nullptr and
  // the float value below is used.
  const float* k_scale_ptr;
  const float* v_scale_ptr;
  float k_scale;
  float v_scale;

  float scale;  // softmax scale applied to q.k
  BlocksparseParams blocksparse;  // inactive (dense) unless vert_stride > 1

  // ---- strides (elements) ----
  int64_t q_seq_stride;     // query.stride(0): any (query may be a slice of a fused qkv tensor)
  int64_t q_head_stride;    // query.stride(1)
  // ---- caches (core/kv_layout.h): K and V may have different strides ----
  KvForm kv_form;  // kVllm for v1 / v2, kTokenMajor for decode (both caches)
  KvLayout k_layout;
  KvLayout v_layout;

  // ---- sizes ----
  int num_seqs;
  int num_heads;
  int num_kv_heads;
  int head_size;
  int block_size;
  int max_blocks_per_seq;  // block_tables.size(1)
  int64_t num_blocks;      // key_cache.size(0): used block ids must lie in [0, num_blocks)
  int max_num_partitions;  // tmp_out.size(2) (v2; CUDA split: the plan's count); 1 for v1
  // Tokens per partition: 0 = one pass over the whole row writing `out` (v1, decode), else
  // partition z of a row holds tokens [z * partition_size, (z + 1) * partition_size) and writes
  // the scratch (v2: kPartitionSize; the CUDA v1 / decode split: core/split_plan.h's size).
  int partition_size;
  int max_seq_len;         // hint only: never used to drop tokens

  ScalarKind scalar_kind;
  CacheKind cache_kind;
};

struct ReshapeAndCacheParams {
  const void* key;      // [num_tokens, num_kv_heads, head_size], last dim contiguous, query dtype
  const void* value;    // [num_tokens, num_kv_heads, head_size], last dim contiguous
  void* key_cache;      // addressed by k_layout (reshape_and_cache: vLLM's K, _flash: token-major)
  void* value_cache;    // addressed by v_layout
  const int64_t* slot_mapping;  // [num_tokens]; slot = block * block_size + offset; < 0: skip

  const float* k_scale_ptr;  // as in PagedAttentionParams (fp8 stores fp8(x / scale), saturated)
  const float* v_scale_ptr;
  float k_scale;
  float v_scale;

  int64_t key_token_stride;    // key.stride(0)
  int64_t key_head_stride;     // key.stride(1)
  int64_t value_token_stride;  // value.stride(0)
  int64_t value_head_stride;   // value.stride(1)
  KvLayout k_layout;           // core/kv_layout.h
  KvLayout v_layout;

  int64_t num_tokens;
  int num_kv_heads;
  int head_size;
  int block_size;
  int64_t num_blocks;

  ScalarKind scalar_kind;
  CacheKind cache_kind;
};

}  // namespace paged_attn
