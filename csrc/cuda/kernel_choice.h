// kernel_choice.h — which CUDA attention kernel a call runs: the baseline (attention_kernel.cuh),
// the pipelined one (attention_kernel_pipelined.cuh) with CUDA-core math, or "mma": the
// pipelined kernel with the GQA group on tensor cores (gqa_mma.cuh) for the shapes
// dispatch.cuh's uses_tensor_cores() takes (16-bit query, GQA >= 3) and the plain pipelined
// kernel for the others. Plain C++: no torch, no kernel code; ops_cuda.cu asks before each
// launch, module.cpp reports it in build_info().
//
// The setting is the environment variable PAGED_ATTN_CUDA_KERNEL, read once per process (at the
// first call): unset or "" or "auto": the rule below; "baseline", "pipelined" or "mma": that
// kernel on every GPU (pipelined and mma: sm_80 and newer only, they are built around cp.async
// and mma.sync); anything else: every CUDA attention call raises an error naming the value.
// The rule ("auto"): mma on sm_80 and newer, baseline below (sm_75). Every choice takes every
// shape the CUDA ops accept, so the rule looks at the GPU only.
#pragma once

#include <cstdint>
#include <string>

namespace paged_attn {
namespace cuda {

enum class AttentionKernel : int { kBaseline = 0, kPipelined = 1, kMma = 2 };
constexpr int kNumAttentionKernels = 3;

const char* attention_kernel_name(AttentionKernel kernel);  // "baseline", "pipelined", "mma"

// The kernel for a call on `device` (a CUDA device index); on a bad setting, or "pipelined" /
// "mma" on a GPU older than sm_80, returns the baseline and sets *error (the caller raises it).
AttentionKernel choose_attention_kernel(int device, std::string* error);

// The setting and its rule in words, for build_info() ("auto: mma on sm_80+, baseline below
// sm_80", "pipelined (PAGED_ATTN_CUDA_KERNEL=pipelined)", or the error of a bad value).
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
