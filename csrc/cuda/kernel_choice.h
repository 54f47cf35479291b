// kernel_choice.h — which CUDA attention kernel a call runs: the baseline (attention_kernel.cuh),
// the pipelined one (attention_kernel_pipelined.cuh) with CUDA-core math, or "mma": the
// pipelined kernel with the GQA group on tensor cores (gqa_mma.cuh) for the shapes
// dispatch.cuh's uses_tensor_cores() takes (16-bit query, GQA >= 3) and the plain pipelined
// kernel for the others. Plain C++: no torch, no CUDA; ops_cuda.cpp asks before each launch,
// module.cpp reports it in build_info().
//
// The setting is the environment variable PAGED_ATTN_CUDA_KERNEL, read once per process (at the
// first call): unset or "" or "auto": the rule below; "baseline", "pipelined" or "mma": that
// kernel on every GPU (pipelined and mma: sm_80 and newer only, they are built around cp.async
// and mma.sync); anything else: every CUDA attention call raises an error naming the value.
// The rule ("auto"): mma where the code that runs on the GPU was compiled for sm_80 or newer,
// baseline otherwise (an sm_75 GPU, or a newer one running a build's compute_75 PTX: compiled
// below sm_80, the pipelined kernel has no cp.async and its tensor-core path traps). Every
// choice takes every shape the CUDA ops accept, so the rule looks at the code's arch only.
#pragma once

#include <cstdint>
#include <string>

namespace paged_attn {
namespace cuda {

enum class AttentionKernel : int { kBaseline = 0, kPipelined = 1, kMma = 2 };
constexpr int kNumAttentionKernels = 3;

const char* attention_kernel_name(AttentionKernel kernel);  // "baseline", "pipelined", "mma"

// The kernel for a call on `device` (a CUDA device index, for messages), whose code was compiled
// for code_arch (major * 10 + minor: probe_kernel_image in launch.h); on a bad setting, or
// "pipelined" / "mma" with code compiled below sm_80, returns the baseline and sets *error (the
// caller raises it).
AttentionKernel choose_attention_kernel(int device, int code_arch, std::string* error);

// The setting and its rule in words, for build_info() ("auto: mma where the code that runs is
// compiled for sm_80+, else baseline", "pipelined (PAGED_ATTN_CUDA_KERNEL=pipelined)", or the
// error of a bad value).
std::string attention_kernel_setting();

// Reads PAGED_ATTN_CUDA_KERNEL again (tests switch kernels within one process). Not to be called
// while another thread launches.
void reload_attention_kernel_setting();

// Launches issued per kernel since the process started (host side, one per attention launch; the
// replays of a captured CUDA graph are not counted; an "mma" call on a shape tensor cores do not
// take counts as pipelined). Tests use it to prove which kernel ran.
void count_attention_launch(AttentionKernel kernel);
uint64_t attention_launches(AttentionKernel kernel);

}  // namespace cuda
}  // namespace paged_attn
