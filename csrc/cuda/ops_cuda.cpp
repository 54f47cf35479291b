// ops_cuda.cpp — torch glue of the CUDA kernels: the two backend entry points of
// torch_glue/overloads.h (which turns the arguments into params, shared with the CPU kernels):
// CUDA-only checks, stream / device guard, dispatch onto launch.h, and the registration
// TORCH_LIBRARY_IMPL(paged_attn, CUDA, m) of both overloads of v1, v2, reshape_and_cache, decode
// and reshape_and_cache_flash.
//
// NOTE: compiled by the host compiler like the rest of the torch glue, not by nvcc: no kernel
// and no launch syntax here (the launchers are in the .cu files, launch.h).
//
// NOTE: graph-safe. Nothing here reads tensor data on the host (no data checks, no .item(), no
// sync); launch grids come from shapes only (v2: tmp_out.size(2); v1 / decode: the split plan of
// core/split_plan.h, from the shapes and the device's SM count), never from seq_lens or
// max_seq_len. The split's scratch is allocated with at::empty on the current stream (inside a
// CUDA-graph capture: from the graph's pool). Bad data (block ids, lengths) is the kernels'
// business: they never read out of bounds and write NaN rows (docs/DESIGN.md);
// api.paged_attention(..., validate=True) raises instead.
//
// Arch check: before the first launch on each device, require_kernels_for() decides whether this
// build's images (build_info.h compiled_archs(): the real -gencode flags) can run on
// that GPU (csrc/core/cuda_arch.h) and asks the driver to load one kernel; either failing raises
// an error naming the GPU's arch, the compiled archs and the rebuild command. The answer is cached
// per device: later calls cost one atomic load (no CUDA call, no sync).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <mutex>
#include <string>

#include "../core/cuda_arch.h"
#include "../core/split_plan.h"
#include "../torch_glue/overloads.h"
#include "build_info.h"
#include "dispatch.cuh"
#include "kernel_choice.h"
#include "launch.h"

namespace paged_attn {
namespace {

constexpr int64_t kMaxGridYZ = 65535;  // CUDA grid dims y and z

// Per device: 0 not checked yet, 1 our kernels run there, 2 they do not (g_device_error says why);
// with state 1, g_code_arch is the arch the code that runs there was compiled for (written
// before the state is published).
using cuda::kMaxDevices;
std::array<std::atomic<uint8_t>, kMaxDevices> g_device_state{};
std::array<std::string, kMaxDevices> g_device_error;
std::array<int, kMaxDevices> g_code_arch{};
std::mutex g_device_mutex;

// The slow path, once per device (the caller holds a CUDAGuard for it): "" when our kernels can
// run there (*code_arch: probe_kernel_image's), else the error text.
std::string check_device(int device, int* code_arch) {
  int major = 0, minor = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  std::vector<arch::Target> targets;
  arch::parse_targets(cuda::compiled_archs(), targets);
  auto device_text = [&] {
    cudaDeviceProp prop{};
    std::string text = "cuda:" + std::to_string(device);
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
      text += " (" + std::string(prop.name) + ")";
    return text;
  };
  if (!targets.empty() && !arch::match(major, minor, targets).runs)
    return arch::mismatch_message(major, minor, targets, device_text());
  // The driver's answer for one kernel: catches what the list cannot (no list, a driver too old
  // for the PTX). Loads (or JIT-compiles) that kernel now instead of at its first launch.
  const cudaError_t err = cuda::probe_kernel_image(code_arch);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // NOTE: do not leave our error for the next launch check to find
    const std::string what = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction)
      return arch::mismatch_message(major, minor, targets, device_text()) + " (driver: " + what +
             ")";
    return arch::load_failure_message(major, minor, targets, device_text(), what);
  }
  return "";
}

// Raises unless this build's kernels can run on `device`; returns the arch their code there was
// compiled for (major * 10 + minor). Hot path: one atomic load.
int require_kernels_for(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "paged_attn: CUDA device index ", int(device),
              " out of range");
  uint8_t state = g_device_state[device].load(std::memory_order_acquire);
  if (C10_LIKELY(state == 1)) return g_code_arch[device];
  if (state == 0) {
    const std::lock_guard<std::mutex> lock(g_device_mutex);
    state = g_device_state[device].load(std::memory_order_acquire);
    if (state == 0) {
      g_device_error[device] = check_device(device, &g_code_arch[device]);
      state = g_device_error[device].empty() ? 1 : 2;
      g_device_state[device].store(state, std::memory_order_release);
    }
  }
  TORCH_CHECK(state == 1, g_device_error[device]);
  return g_code_arch[device];
}

// Multiprocessors of each device, read once (cudaDeviceGetAttribute: no sync) and cached; 0: not
// read yet. Hot path: one atomic load. The device index was checked by require_kernels_for.
std::array<std::atomic<int>, kMaxDevices> g_sm_count{};

int sm_count_of(c10::DeviceIndex device) {
  int count = g_sm_count[device].load(std::memory_order_relaxed);
  if (C10_LIKELY(count > 0)) return count;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  g_sm_count[device].store(count, std::memory_order_relaxed);  // a racing writer stores the same
  return count;
}

// Checks the CUDA kernels add to make_attention_params' (shapes only, no data).
void check_cuda_attention(const char* op, const PagedAttentionParams& p) {
  TORCH_CHECK_VALUE(cuda::is_supported_head_size(p.head_size), "paged_attn.", op,
                    ": Unsupported head size: ", p.head_size, " (CUDA kernels are compiled for ",
                    cuda::kHeadSizesText, ")");
  // NOTE: the kernels load K (and vLLM's V) with 16-byte (fp8 V: 8-byte) vector loads: every
  // token of K starts 16-byte aligned, and a token-major K row is whole 16-byte vectors.
  const int64_t elem = cache_element_bytes(p.scalar_kind, p.cache_kind);
  const bool aligned = reinterpret_cast<uintptr_t>(p.key_cache) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(p.value_cache) % 16 == 0 &&
                       (p.k_layout.block_stride * elem) % 16 == 0 &&
                       (p.k_layout.head_stride * elem) % 16 == 0 &&
                       (p.k_layout.token_stride * elem) % 16 == 0 &&
                       (p.v_layout.block_stride * elem) % 16 == 0 &&
                       (p.v_layout.head_stride * elem) % 16 == 0;
  TORCH_CHECK_VALUE(aligned, "paged_attn.", op,
                    ": key_cache / value_cache must be 16-byte aligned (data pointers and "
                    "block / head / token strides) for the CUDA kernels");
  TORCH_CHECK_VALUE((p.head_size * elem) % 16 == 0, "paged_attn.", op, ": head_size (",
                    p.head_size, ") times the cache element size must be a multiple of 16 bytes "
                    "for the CUDA kernels");
  TORCH_CHECK_VALUE(p.num_kv_heads <= kMaxGridYZ && p.num_heads <= kMaxGridYZ, "paged_attn.", op,
                    ": num_heads (", p.num_heads, ") exceeds the CUDA grid limit ", kMaxGridYZ);
  TORCH_CHECK_VALUE(p.max_num_partitions <= kMaxGridYZ, "paged_attn.", op,
                    ": max_num_partitions (tmp_out.size(2) = ", p.max_num_partitions,
                    ") exceeds the CUDA grid limit ", kMaxGridYZ);
}

// One branch per pair of dispatch.cuh's PAGED_ATTN_CUDA_PAIRS (the build compiles each pair's
// launchers and kernels in files generated from the same list), onto the kernel kernel_choice.h
// picks for the device (PAGED_ATTN_CUDA_KERNEL, else the rule; a bad setting raises here).
// Returns the kernel launched.
cuda::AttentionKernel launch_attention(const PagedAttentionParams& p, cudaStream_t stream,
                                       c10::DeviceIndex device, int code_arch) {
  std::string error;
  const cuda::AttentionKernel kernel = cuda::choose_attention_kernel(device, code_arch, &error);
  TORCH_CHECK(error.empty(), "paged_attn: ", error);
#define PAGED_ATTN_LAUNCH_PAIR(S, C)                                                           \
  if (p.scalar_kind == ScalarKind::S && p.cache_kind == CacheKind::C) {                        \
    cuda::AttentionKernel ran = kernel;                                                        \
    if (kernel == cuda::AttentionKernel::kMma) {                                               \
      if (!cuda::launch_paged_attention_mma<ScalarKind::S, CacheKind::C>(p, stream))           \
        ran = cuda::AttentionKernel::kPipelined; /* a shape tensor cores do not take */        \
    } else if (kernel == cuda::AttentionKernel::kPipelined) {                                  \
      cuda::launch_paged_attention_pipelined<ScalarKind::S, CacheKind::C>(p, stream);          \
    } else {                                                                                   \
      cuda::launch_paged_attention<ScalarKind::S, CacheKind::C>(p, stream);                    \
    }                                                                                          \
    cuda::count_attention_launch(ran);                                                         \
    return ran;                                                                                \
  }
  PAGED_ATTN_CUDA_PAIRS(PAGED_ATTN_LAUNCH_PAIR)
#undef PAGED_ATTN_LAUNCH_PAIR
  TORCH_CHECK(false, "paged_attn: no CUDA kernel compiled for this query dtype and cache kind");
}

// The reduce kernel (phase 2 of a split) of each query dtype of PAGED_ATTN_CUDA_PAIRS; returns
// the launch's error.
cudaError_t launch_reduce(const PagedAttentionParams& p, cudaStream_t stream, bool programmatic) {
#define PAGED_ATTN_LAUNCH_REDUCE(S, C)                                        \
  if (p.scalar_kind == ScalarKind::S)                                         \
    return cuda::launch_v2_reduce<ScalarKind::S>(p, stream, programmatic);
  PAGED_ATTN_CUDA_PAIRS(PAGED_ATTN_LAUNCH_REDUCE)
#undef PAGED_ATTN_LAUNCH_REDUCE
  TORCH_CHECK(false, "paged_attn: no CUDA v2 reduce kernel compiled for this query dtype");
}

// A split's scratch in one allocation (one caching-allocator call per call, not three), set into
// p: exp_sums and max_logits float32 [num_seqs, num_heads, P] each, then tmp_out [num_seqs,
// num_heads, P, head_size] in the query dtype from the next 256-byte boundary. The returned
// tensor owns it: alive until both launches (the allocator's stream semantics do the rest).
at::Tensor split_workspace(PagedAttentionParams& p, int num_partitions, c10::Device device) {
  const int64_t stats = static_cast<int64_t>(p.num_seqs) * p.num_heads * num_partitions;
  const int64_t out_offset = (2 * stats * static_cast<int64_t>(sizeof(float)) + 255) / 256 * 256;
  const int64_t out_bytes = stats * p.head_size * scalar_bytes(p.scalar_kind);
  at::Tensor workspace =
      at::empty({out_offset + out_bytes}, at::TensorOptions().device(device).dtype(at::kByte));
  auto* const base = static_cast<unsigned char*>(workspace.data_ptr());
  p.exp_sums = reinterpret_cast<float*>(base);
  p.max_logits = p.exp_sums + stats;
  p.tmp_out = base + out_offset;
  return workspace;
}

// v1, decode (is_v2 false, p.partition_size 0; decode: v1's kernel over token-major caches,
// p.kv_form): one pass when the rows fill the GPU, else the split that plan_split chooses from
// the shapes (and PAGED_ATTN_CUDA_SPLIT's aim), its scratch from split_workspace (P =
// plan.num_partitions).
// v2 (p.partition_size 512, the caller's scratch): phase 1 and the reduce.
// NOTE: the params were made (validated) before the device guard: the guard itself raises a
// RuntimeError on some bad inputs (mixed devices), where the contract wants make_*_params'
// ValueError.
void attention(const char* op, const PagedAttentionParams& params, bool is_v2,
               c10::Device device) {
  check_cuda_attention(op, params);
  const c10::cuda::CUDAGuard device_guard(device);
  const int code_arch = require_kernels_for(device.index());
  if (params.num_seqs == 0 || params.num_heads == 0) return;
  std::string pdl_error;  // PAGED_ATTN_CUDA_PDL: checked before anything is launched
  const bool programmatic = cuda::programmatic_reduce_launch(code_arch, &pdl_error);
  TORCH_CHECK(pdl_error.empty(), "paged_attn: ", pdl_error);
  PagedAttentionParams p = params;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor workspace;  // a split's scratch, alive until both launches
  if (!is_v2) {
    std::string split_error;
    const cuda::SplitAim aim = cuda::split_aim(&split_error);  // PAGED_ATTN_CUDA_SPLIT
    TORCH_CHECK(split_error.empty(), "paged_attn: ", split_error);
    const SplitPlan plan = plan_split(
        {p.num_seqs, p.num_kv_heads, static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size,
         sm_count_of(device.index()), cuda::kThreads, aim.blocks_per_sm,
         aim.min_partition_tiles});
    if (plan.split()) {
      TORCH_CHECK(plan.num_partitions <= kMaxGridYZ && plan.partition_size > 0, "paged_attn.",
                  op, ": split plan of ", plan.num_partitions, " partitions of ",
                  plan.partition_size, " tokens is outside the CUDA grid");
      workspace = split_workspace(p, plan.num_partitions, device);
      p.max_num_partitions = plan.num_partitions;
      p.partition_size = plan.partition_size;
    }
  }
  const cuda::AttentionKernel ran = launch_attention(p, stream, device.index(), code_arch);
  // A failed launch names the kernel: the pipelined ones also fail when the driver refuses their
  // dynamic shared memory (attention_launch.cuh), which the baseline does not use.
  const cudaError_t launch_error = cudaGetLastError();
  TORCH_CHECK(launch_error == cudaSuccess, "paged_attn.", op, ": launching the '",
              cuda::attention_kernel_name(ran), "' CUDA attention kernel failed: ",
              cudaGetErrorName(launch_error), ": ", cudaGetErrorString(launch_error),
              ran == cuda::AttentionKernel::kBaseline
                  ? ""
                  : " (PAGED_ATTN_CUDA_KERNEL=baseline selects the kernel without dynamic shared "
                    "memory)");
  if (p.partition_size > 0) {
    const cudaError_t reduce_error = launch_reduce(p, stream, programmatic);
    TORCH_CHECK(reduce_error == cudaSuccess, "paged_attn.", op,
                ": launching the CUDA reduce kernel",
                programmatic ? " (programmatic dependent launch, PAGED_ATTN_CUDA_PDL)" : "",
                " failed: ", cudaGetErrorName(reduce_error), ": ",
                cudaGetErrorString(reduce_error));
  }
}

// reshape_and_cache and reshape_and_cache_flash (the layouts are in p).
void cache(const char* op, const ReshapeAndCacheParams& p, c10::Device device) {
  const c10::cuda::CUDAGuard device_guard(device);
  require_kernels_for(device.index());
  if (p.num_tokens == 0 || p.num_kv_heads == 0 || p.head_size == 0) return;
  TORCH_CHECK_VALUE(p.num_tokens <= 0x7fffffff, "paged_attn.", op, ": num_tokens (",
                    p.num_tokens, ") exceeds the CUDA grid limit");
  cuda::launch_reshape_and_cache(p, c10::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace paged_attn

PAGED_ATTN_REGISTER_KERNELS(CUDA, paged_attn::attention, paged_attn::cache)
