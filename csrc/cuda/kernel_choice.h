// kernel_choice.h — which CUDA attention kernel a call runs: the baseline (attention_kernel.cuh)
// or the pipelined one (attention_kernel_pipelined.cuh). Plain C++: no torch, no kernel code;
// ops_cuda.cu asks before each launch, module.cpp reports it in build_info().
//
// The setting is the environment variable PAGED_ATTN_CUDA_KERNEL, read once per process (at the
// first call): unset or "" or "auto": the rule below; "baseline" or "pipelined": that kernel on
// every GPU (pipelined: sm_80 and newer only, it is built around cp.async); anything else: every
// CUDA attention call raises an error naming the value.
// The rule ("auto"): pipelined on sm_80 and newer, baseline below (sm_75). Both kernels take
// every shape the CUDA ops accept, so the rule looks at the GPU only.
#pragma once

#include <cstdint>
#include <string>

namespace paged_attn {
namespace cuda {

enum class AttentionKernel : int { kBaseline = 0, kPipelined = 1 };
constexpr int kNumAttentionKernels = 2;

const char* attention_kernel_name(AttentionKernel kernel);  // "baseline", "pipelined"

// The kernel for a call on `device` (a CUDA device index); on a bad setting, or "pipelined" on a
// GPU older than sm_80, returns the baseline and sets *error (the caller raises it).
AttentionKernel choose_attention_kernel(int device, std::string* error);

// The setting and its rule in words, for build_info() ("auto: pipelined on sm_80+, baseline
// below sm_80", "pipelined (PAGED_ATTN_CUDA_KERNEL=pipelined)", or the error of a bad value).
std::string attention_kernel_setting();

// Reads PAGED_ATTN_CUDA_KERNEL again (tests switch kernels within one process). Not to be called
// while another thread launches.
void reload_attention_kernel_setting();

// Launches issued per kernel since the process started (host side, one per attention launch; the
// replays of a captured CUDA graph are not counted). Tests use it to prove which kernel ran.
void count_attention_launch(AttentionKernel kernel);
uint64_t attention_launches(AttentionKernel kernel);

}  // namespace cuda
}  // namespace paged_attn
