// launch.h — host entry points of the CUDA kernels (no torch, no kernel code). The torch glue
// (ops_cuda.cpp) calls these; the definitions are explicitly instantiated in the generated
// attention_<dtype>_<cache>.cu files (whose kernels are in attention_<dtype>_<cache>_d<N>.cu,
// attention_dims.h) and in reshape_and_cache.cu, many small files that ninja compiles in
// parallel.
#pragma once

#include <cuda_runtime_api.h>

#include "../core/params.h"

namespace paged_attn {
namespace cuda {

// Per-device tables on the host (the arch check, SM counts, the shared-memory opt-in of the
// pipelined kernels) have one slot per possible device index: c10::DeviceIndex is int8_t.
constexpr int kMaxDevices = 128;

// One pass (p.partition_size == 0; grid (num_seqs, num_kv_heads, 1), writes p.out) or phase 1
// of a split (p.partition_size > 0: v2's 512 or a core/split_plan.h plan; grid (num_seqs,
// num_kv_heads, p.max_num_partitions), writes the scratch). Preconditions: the params passed
// make_attention_params / make_decode_params, the head size is listed in dispatch.cuh,
// num_seqs > 0, max_num_partitions <= 65535, K/V 16-byte aligned.
template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention(const PagedAttentionParams& p, cudaStream_t stream);

// The same with the pipelined kernel (attention_kernel_pipelined.cuh); same preconditions.
template <ScalarKind kScalar, CacheKind kCache>
void launch_paged_attention_pipelined(const PagedAttentionParams& p, cudaStream_t stream);

// The pipelined kernel with the GQA group on tensor cores where dispatch.cuh's
// uses_tensor_cores() takes the shape (16-bit query, GQA >= 3), else the same as
// launch_paged_attention_pipelined; returns whether the tensor-core kernel was launched.
template <ScalarKind kScalar, CacheKind kCache>
bool launch_paged_attention_mma(const PagedAttentionParams& p, cudaStream_t stream);

// Phase 2 of a split (p.partition_size > 0); grid (num_seqs, num_heads), writes p.out.
// programmatic: launched with programmatic dependent launch (grid_dependency.cuh; only where the
// code was compiled for sm_90+, kernel_choice.h programmatic_reduce_launch; a build against a
// CUDA runtime before 12.0 launches it plainly). Returns the launch's error (cudaSuccess).
template <ScalarKind kScalar>
cudaError_t launch_v2_reduce(const PagedAttentionParams& p, cudaStream_t stream,
                             bool programmatic);

// reshape_and_cache and reshape_and_cache_flash (the caches' layouts are in p); grid
// (num_tokens); num_tokens > 0.
void launch_reshape_and_cache(const ReshapeAndCacheParams& p, cudaStream_t stream);

// Asks the driver to load one of our kernels on the current device (cudaFuncGetAttributes): the
// error a launch would meet (cudaErrorNoKernelImageForDevice, a PTX the driver cannot compile),
// without launching anything. On success *code_arch is the arch the code that runs there was
// compiled for, as major * 10 + minor (cudaFuncAttributes::ptxVersion: 80 for sm_80 SASS, 75 when
// the driver compiles compute_75 PTX for a newer GPU). Every .cu file is built with the same
// -gencode flags, so one kernel speaks for all.
cudaError_t probe_kernel_image(int* code_arch);

}  // namespace cuda
}  // namespace paged_attn
