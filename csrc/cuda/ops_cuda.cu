// ops_cuda.cu — torch glue of the CUDA kernels: tensors -> params (csrc/torch_glue/validate.h),
// CUDA-only checks, stream / device guard, dispatch onto launch.h, and the registration
// TORCH_LIBRARY_IMPL(paged_attn, CUDA, m) of both overloads of v1, v2 and reshape_and_cache.
// The overloads' signatures are torch_glue/overloads.h (shared with the CPU kernels).
//
// NOTE: graph-safe. Nothing here reads tensor data on the host (no data checks, no .item(), no
// sync); launch grids come from shapes only (v2: tmp_out.size(2)), never from seq_lens or
// max_seq_len. Bad data (block ids, lengths) is the kernels' business: they never read out of
// bounds and write NaN rows (docs/DESIGN.md); api.paged_attention(..., validate=True) raises
// instead.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "../torch_glue/overloads.h"
#include "../torch_glue/validate.h"
#include "dispatch.cuh"
#include "launch.h"

namespace paged_attn {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // CUDA grid dims y and z

// Checks the CUDA kernels add to make_attention_params' (shapes only, no data).
void check_cuda_attention(const char* op, const PagedAttentionParams& p,
                          const at::Tensor& key_cache, const at::Tensor& value_cache) {
  TORCH_CHECK_VALUE(cuda::is_supported_head_size(p.head_size), "paged_attn.", op,
                    ": Unsupported head size: ", p.head_size, " (CUDA kernels are compiled for ",
                    cuda::kHeadSizesText, ")");
  // NOTE: the kernels load K and V with 16-byte (fp8 V: 8-byte) vector loads.
  const int64_t elem = key_cache.element_size();
  const bool aligned = reinterpret_cast<uintptr_t>(key_cache.data_ptr()) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(value_cache.data_ptr()) % 16 == 0 &&
                       (p.kv_block_stride * elem) % 16 == 0 &&
                       (p.kv_head_stride * elem) % 16 == 0;
  TORCH_CHECK_VALUE(aligned, "paged_attn.", op,
                    ": key_cache / value_cache must be 16-byte aligned (data pointers and "
                    "block / head strides) for the CUDA kernels");
  TORCH_CHECK_VALUE(p.num_kv_heads <= kMaxGridYZ && p.num_heads <= kMaxGridYZ, "paged_attn.", op,
                    ": num_heads (", p.num_heads, ") exceeds the CUDA grid limit ", kMaxGridYZ);
  TORCH_CHECK_VALUE(p.max_num_partitions <= kMaxGridYZ, "paged_attn.", op,
                    ": max_num_partitions (tmp_out.size(2) = ", p.max_num_partitions,
                    ") exceeds the CUDA grid limit ", kMaxGridYZ);
}

void launch_attention(const PagedAttentionParams& p, bool is_v2, cudaStream_t stream) {
  using cuda::launch_paged_attention;
  const CacheKind c = p.cache_kind;
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32:
      if (c == CacheKind::kAuto) launch_paged_attention<ScalarKind::kFloat32, CacheKind::kAuto>(p, is_v2, stream);
      if (c == CacheKind::kFp8E4M3) launch_paged_attention<ScalarKind::kFloat32, CacheKind::kFp8E4M3>(p, is_v2, stream);
      if (c == CacheKind::kFp8E5M2) launch_paged_attention<ScalarKind::kFloat32, CacheKind::kFp8E5M2>(p, is_v2, stream);
      break;
    case ScalarKind::kFloat16:
      if (c == CacheKind::kAuto) launch_paged_attention<ScalarKind::kFloat16, CacheKind::kAuto>(p, is_v2, stream);
      if (c == CacheKind::kFp8E4M3) launch_paged_attention<ScalarKind::kFloat16, CacheKind::kFp8E4M3>(p, is_v2, stream);
      if (c == CacheKind::kFp8E5M2) launch_paged_attention<ScalarKind::kFloat16, CacheKind::kFp8E5M2>(p, is_v2, stream);
      break;
    case ScalarKind::kBFloat16:
      if (c == CacheKind::kAuto) launch_paged_attention<ScalarKind::kBFloat16, CacheKind::kAuto>(p, is_v2, stream);
      if (c == CacheKind::kFp8E4M3) launch_paged_attention<ScalarKind::kBFloat16, CacheKind::kFp8E4M3>(p, is_v2, stream);
      if (c == CacheKind::kFp8E5M2) launch_paged_attention<ScalarKind::kBFloat16, CacheKind::kFp8E5M2>(p, is_v2, stream);
      break;
  }
}

void launch_reduce(const PagedAttentionParams& p, cudaStream_t stream) {
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: cuda::launch_v2_reduce<ScalarKind::kFloat32>(p, stream); break;
    case ScalarKind::kFloat16: cuda::launch_v2_reduce<ScalarKind::kFloat16>(p, stream); break;
    case ScalarKind::kBFloat16: cuda::launch_v2_reduce<ScalarKind::kBFloat16>(p, stream); break;
  }
}

// v1 (exp_sums == nullptr) or v2.
void attention(const char* op, const at::Tensor& out, const at::Tensor* exp_sums,
               const at::Tensor* max_logits, const at::Tensor* tmp_out, const at::Tensor& query,
               const at::Tensor& key_cache,
               const at::Tensor& value_cache, int64_t num_kv_heads, double scale,
               const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t block_size,
               int64_t max_seq_len, const std::optional<at::Tensor>& alibi_slopes,
               const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale,
               BlocksparseArgs blocksparse) {
  const c10::cuda::CUDAGuard device_guard(query.device());
  const PagedAttentionParams p = make_attention_params(
      op, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, scale,
      block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale,
      v_scale, blocksparse);
  check_cuda_attention(op, p, key_cache, value_cache);
  if (p.num_seqs == 0 || p.num_heads == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const bool is_v2 = tmp_out != nullptr;
  launch_attention(p, is_v2, stream);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (is_v2) {
    launch_reduce(p, stream);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

void cache(const at::Tensor& key, const at::Tensor& value, const at::Tensor& key_cache,
           const at::Tensor& value_cache, const at::Tensor& slot_mapping,
           const std::string& kv_cache_dtype, ScaleArg k_scale, ScaleArg v_scale) {
  const c10::cuda::CUDAGuard device_guard(key.device());
  const ReshapeAndCacheParams p =
      make_cache_params("reshape_and_cache", key, value, key_cache, value_cache, slot_mapping,
                        kv_cache_dtype, k_scale, v_scale);
  if (p.num_tokens == 0 || p.num_kv_heads == 0 || p.head_size == 0) return;
  TORCH_CHECK_VALUE(p.num_tokens <= 0x7fffffff, "paged_attn.reshape_and_cache: num_tokens (",
                    p.num_tokens, ") exceeds the CUDA grid limit");
  cuda::launch_reshape_and_cache(p, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace paged_attn

TORCH_LIBRARY_IMPL(paged_attn, CUDA, m) {
  paged_attn::overloads::register_ops<paged_attn::attention, paged_attn::cache>(m);
}
