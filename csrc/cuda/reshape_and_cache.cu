// reshape_and_cache.cu — launch_reshape_and_cache (launch.h): dtype dispatch onto
// reshape_and_cache_kernel.cuh (3 query dtypes x {auto, fp8 e4m3, fp8 e5m2}).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "launch.h"
#include "reshape_and_cache_kernel.cuh"

namespace paged_attn {
namespace cuda {
namespace {

constexpr int kCacheThreads = 256;

template <typename Scalar>
void launch_for_scalar(const ReshapeAndCacheParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_tokens));
  switch (p.cache_kind) {
    case CacheKind::kAuto:
      reshape_and_cache_kernel<Scalar, Scalar, kCacheThreads><<<grid, kCacheThreads, 0, stream>>>(p);
      break;
    case CacheKind::kFp8E4M3:
      reshape_and_cache_kernel<Scalar, uint8_t, kCacheThreads>
          <<<grid, kCacheThreads, 0, stream>>>(p, false);
      break;
    case CacheKind::kFp8E5M2:
      reshape_and_cache_kernel<Scalar, uint8_t, kCacheThreads>
          <<<grid, kCacheThreads, 0, stream>>>(p, true);
      break;
  }
}

}  // namespace

void launch_reshape_and_cache(const ReshapeAndCacheParams& p, cudaStream_t stream) {
  switch (p.scalar_kind) {
    case ScalarKind::kFloat32: launch_for_scalar<float>(p, stream); break;
    case ScalarKind::kFloat16: launch_for_scalar<__half>(p, stream); break;
    case ScalarKind::kBFloat16: launch_for_scalar<__nv_bfloat16>(p, stream); break;
  }
}

cudaError_t probe_kernel_image(int* code_arch) {
  cudaFuncAttributes attributes;
  const cudaError_t err =
      cudaFuncGetAttributes(&attributes, reshape_and_cache_kernel<float, float, kCacheThreads>);
  if (err == cudaSuccess) *code_arch = attributes.ptxVersion;
  return err;
}

}  // namespace cuda
}  // namespace paged_attn
