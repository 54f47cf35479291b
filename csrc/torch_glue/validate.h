// validate.h — torch glue shared by the CPU and CUDA backends: THE place where an op's arguments
// (op_args.h) are checked against CONTRACT.md and turned into the plain params structs of
// csrc/core/params.h, which are all the launchers get.
//
// Every failure throws c10::ValueError (Python ValueError) with a message that starts with
// "paged_attn.<op>: " and names the argument (docs/DESIGN.md lists the messages).
#pragma once

#include <string>

#include "../core/params.h"
#include "op_args.h"

namespace paged_attn {

// Parses kv_cache_dtype ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"); anything else throws.
CacheKind parse_kv_cache_dtype(const char* op, const std::string& kv_cache_dtype);

// Shape/dtype/device/stride checks of v1 (a.tmp_out == nullptr) or v2, and of the blocksparse
// arguments when active (docs/CONTRACT.md, "Blocksparse"). Reads no tensor data. Returns params
// with every pointer, stride and size filled in.
PagedAttentionParams make_attention_params(const char* op, const AttentionArgs& a);

// decode's checks (token-major caches [num_blocks, block_size, num_kv_heads, head_size], any
// strides with stride(-1) == 1; num_kv_heads and block_size from their shape). Reads no data.
PagedAttentionParams make_decode_params(const char* op, const DecodeArgs& a);

// Data-dependent checks of made params (reads block_tables / seq_lens, so only for params whose
// pointers are host memory): 0 <= seq_len <= max_blocks_per_seq * block_size, every USED block
// id in [0, num_blocks), and (v2) max_num_partitions >= ceil(seq_len / 512). Entries past a
// row's used blocks are garbage and are not read.
void check_attention_data(const char* op, const PagedAttentionParams& p, bool is_v2);

// reshape_and_cache checks (vLLM's caches); reads no data.
ReshapeAndCacheParams make_cache_params(const char* op, const CacheArgs& a);

// reshape_and_cache_flash checks (token-major caches as decode's); reads no data.
ReshapeAndCacheParams make_flash_cache_params(const char* op, const CacheArgs& a);

// Data-dependent, host pointers: every non-negative slot < num_blocks * block_size.
void check_cache_data(const char* op, const ReshapeAndCacheParams& p);

}  // namespace paged_attn
