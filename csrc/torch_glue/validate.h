// validate.h — torch glue shared by the CPU and CUDA launchers: checks op arguments against
// CONTRACT.md and turns tensors into the plain params structs of csrc/core/params.h.
//
// Every failure throws c10::ValueError (Python ValueError) with a message that starts with
// "paged_attn.<op>: " and names the argument (docs/DESIGN.md lists the messages).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <optional>
#include <string>

#include "../core/params.h"

namespace paged_attn {

// k_scale / v_scale as either overload passes them: a 1-element float32 tensor (read by the
// kernel through a pointer, no host sync) or a plain double.
struct ScaleArg {
  const at::Tensor* tensor = nullptr;  // non-null for the .scale_tensor overload
  double value = 1.0;
};

// The blocksparse arguments (docs/CONTRACT.md, "Blocksparse"); active when vert_stride > 1.
struct BlocksparseArgs {
  int64_t tp_rank, local_blocks, vert_stride, block_size, head_sliding_step;
};

// Active blocksparse arguments must make sense (sparse block size > 0, local blocks >= 0,
// tp_rank >= 0, each a 32-bit int, as vLLM's kernel takes them); inactive ones are ignored.
void check_blocksparse(const char* op, const BlocksparseArgs& b);

// Parses kv_cache_dtype ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"); anything else throws.
CacheKind parse_kv_cache_dtype(const char* op, const std::string& kv_cache_dtype);

// Shape/dtype/device/stride checks of v1 (exp_sums, max_logits, tmp_out == nullptr) or v2.
// Reads no tensor data. Returns params with every pointer, stride and size filled in.
PagedAttentionParams make_attention_params(
    const char* op, const at::Tensor& out, const at::Tensor* exp_sums,
    const at::Tensor* max_logits, const at::Tensor* tmp_out, const at::Tensor& query,
    const at::Tensor& key_cache, const at::Tensor& value_cache, int64_t num_kv_heads,
    double scale, const at::Tensor& block_tables, const at::Tensor& seq_lens,
    int64_t block_size, int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale,
    BlocksparseArgs blocksparse);

// decode's checks (token-major caches [num_blocks, block_size, num_kv_heads, head_size], any
// strides with stride(-1) == 1; num_kv_heads and block_size from their shape). Reads no data.
PagedAttentionParams make_decode_params(const char* op, const at::Tensor& out,
                                        const at::Tensor& query, const at::Tensor& key_cache,
                                        const at::Tensor& value_cache,
                                        const at::Tensor& block_tables,
                                        const at::Tensor& seq_lens, double scale,
                                        const std::optional<at::Tensor>& alibi_slopes,
                                        const std::string& kv_cache_dtype, ScaleArg k_scale,
                                        ScaleArg v_scale);

// Data-dependent checks (reads block_tables / seq_lens; they must be CPU tensors' pointers):
// 0 <= seq_len <= max_blocks_per_seq * block_size, every USED block id in [0, num_blocks),
// and (v2) max_num_partitions >= ceil(seq_len / 512). Entries past a row's used blocks are
// garbage and are not read.
void check_attention_data(const char* op, const PagedAttentionParams& p, bool is_v2);

// reshape_and_cache checks; reads no data.
ReshapeAndCacheParams make_cache_params(const char* op, const at::Tensor& key,
                                        const at::Tensor& value, const at::Tensor& key_cache,
                                        const at::Tensor& value_cache,
                                        const at::Tensor& slot_mapping,
                                        const std::string& kv_cache_dtype, ScaleArg k_scale,
                                        ScaleArg v_scale);

// reshape_and_cache_flash checks (token-major caches as decode's); reads no data.
ReshapeAndCacheParams make_flash_cache_params(const char* op, const at::Tensor& key,
                                              const at::Tensor& value,
                                              const at::Tensor& key_cache,
                                              const at::Tensor& value_cache,
                                              const at::Tensor& slot_mapping,
                                              const std::string& kv_cache_dtype,
                                              ScaleArg k_scale, ScaleArg v_scale);

// Data-dependent: every non-negative slot < num_blocks * block_size (CPU pointers).
void check_cache_data(const char* op, const ReshapeAndCacheParams& p);

}  // namespace paged_attn
