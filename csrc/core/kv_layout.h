// kv_layout.h — where element (block, token, kv_head, dim) of a paged K or V cache lives, for
// every cache layout the ops take. Framework-free, host and device.
//
// Every layout is one formula (elements of the cache tensor):
//   offset = block * block_stride + kv_head * head_stride + token * token_stride
//            + (dim / chunk) * chunk_stride + dim % chunk
// a token's dims are stored in chunks of `chunk` contiguous elements:
//   vLLM K  [num_blocks, num_kv_heads, head_size / x, block_size, x]:
//           chunk = x, token_stride = x, chunk_stride = block_size * x
//   vLLM V  [num_blocks, num_kv_heads, head_size, block_size]:
//           chunk = 1, token_stride = 1, chunk_stride = block_size
//   token-major [num_blocks, block_size, num_kv_heads, head_size] with any strides, stride(-1) 1
//           (NHD as it is, HND [num_blocks, num_kv_heads, block_size, head_size] as its
//           transpose(1, 2) view, K or V of a combined [num_blocks, 2, ...] tensor):
//           chunk = head_size (one chunk per token), token_stride = the view's stride(1)
// A kernel reads whole vectors, so it also needs the FORM of its cache (KvForm): where the
// contiguous runs are (a chunk of one token) and which of them a vector holds.
// NOTE: strides and offsets are int64 (block * block_stride overflows int32 on large pools).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PA_KV_HOST_DEVICE __host__ __device__ inline
#else
#define PA_KV_HOST_DEVICE inline
#endif

namespace paged_attn {

// The two families of cache layouts the kernels are written for.
enum class KvForm : int {
  kVllm = 0,        // v1 / v2 / reshape_and_cache: K in chunks of x dims, V dim-major (above)
  kTokenMajor = 1,  // decode / reshape_and_cache_flash: each token's head_size dims contiguous
};

struct KvLayout {
  int64_t block_stride;  // elements between blocks
  int64_t head_stride;   // between KV heads
  int64_t token_stride;  // between consecutive tokens of a block (same chunk)
  int64_t chunk_stride;  // between consecutive chunks of a token's dims
  int64_t chunk;         // dims stored contiguously per chunk

  // Offset of the [block, kv_head] slice (token 0, dim 0).
  PA_KV_HOST_DEVICE int64_t slice(int64_t block, int64_t kv_head) const {
    return block * block_stride + kv_head * head_stride;
  }
  // Offset of one element within a [block, kv_head] slice.
  PA_KV_HOST_DEVICE int64_t in_slice(int64_t token, int64_t dim) const {
    return token * token_stride + (dim / chunk) * chunk_stride + dim % chunk;
  }
  PA_KV_HOST_DEVICE int64_t offset(int64_t block, int64_t token, int64_t kv_head,
                                   int64_t dim) const {
    return slice(block, kv_head) + in_slice(token, dim);
  }
};

// vLLM's K stores a token's dims in 16-byte chunks: x = 16 / element size dims per chunk
// (key_cache.size(4)).
PA_KV_HOST_DEVICE constexpr int64_t vllm_key_x(int64_t element_bytes) { return 16 / element_bytes; }

// vLLM's K: chunk_stride and token_stride follow from its (checked) contiguous inner dims.
PA_KV_HOST_DEVICE KvLayout vllm_key_layout(int64_t block_stride, int64_t head_stride,
                                           int64_t block_size, int64_t x) {
  return KvLayout{block_stride, head_stride, x, block_size * x, x};
}

// vLLM's V: [head_size, block_size] per slice, contiguous.
PA_KV_HOST_DEVICE KvLayout vllm_value_layout(int64_t block_stride, int64_t head_stride,
                                             int64_t block_size) {
  return KvLayout{block_stride, head_stride, 1, block_size, 1};
}

// A token-major cache viewed as [num_blocks, block_size, num_kv_heads, head_size] with these
// strides (dim stride 1): one chunk of head_size dims per token.
PA_KV_HOST_DEVICE KvLayout token_major_layout(int64_t block_stride, int64_t token_stride,
                                              int64_t head_stride, int64_t head_size) {
  return KvLayout{block_stride, head_stride, token_stride, head_size, head_size};
}

}  // namespace paged_attn
