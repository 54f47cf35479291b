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

// How v1 / decode split rows (core/split_plan.h SplitShape: the thread blocks per SM the split
// aims at, and the shortest partition in tiles of 128 tokens), set by the environment variable
// PAGED_ATTN_CUDA_SPLIT, read once per process with PAGED_ATTN_CUDA_KERNEL: unset, "" or "auto":
// kSplitBlocksPerSm and kMinPartitionTiles; "off": never split (one pass per row); "B" or "B:T":
// aim at B blocks per SM (1..kMaxSplitBlocksPerSm), partitions of at least T tiles
// (1..kMaxSplitMinTiles; default kMinPartitionTiles). A knob for measuring the split on a GPU
// (scripts/gpu/device_check.sh's split sweep); the results are the same whatever it is. Anything
// else: returns the default and sets *error (the caller raises it).
constexpr int kMaxSplitBlocksPerSm = 256;
constexpr int kMaxSplitMinTiles = 64;
struct SplitAim {
  int blocks_per_sm;        // 0: never split
  int min_partition_tiles;  // >= 1
};
SplitAim split_aim(std::string* error);

// The split setting in words, for build_info() ("auto: 8 blocks per SM, partitions of >= 2
// tiles", "off (PAGED_ATTN_CUDA_SPLIT=off)", "16 blocks per SM, partitions of >= 1 tile
// (PAGED_ATTN_CUDA_SPLIT=16:1)", or "error: ...").
std::string split_setting();

// Whether the reduce kernel of a split (v2, and v1 / decode when they split) is launched with
// programmatic dependent launch (grid_dependency.cuh), set by the environment variable
// PAGED_ATTN_CUDA_PDL, read once per process with the two above: unset, "", "0" or "off": no (the
// default until a GPU has measured it); "1" or "on": yes where the code that runs was compiled
// for sm_90 or newer (code_arch >= kMinPdlArch: below it the kernels have no griddepcontrol
// instruction, so never there); anything else: false, and *error set (the caller raises it).
constexpr int kMinPdlArch = 90;
bool programmatic_reduce_launch(int code_arch, std::string* error);

// The PDL setting in words, for build_info() ("off", "on where the code that runs is compiled
// for sm_90+ (PAGED_ATTN_CUDA_PDL=1)", or "error: ...").
std::string pdl_setting();

// Reads PAGED_ATTN_CUDA_KERNEL, PAGED_ATTN_CUDA_SPLIT and PAGED_ATTN_CUDA_PDL again (tests switch
// settings within one process). Not to be called while another thread launches.
void reload_attention_kernel_setting();

// Launches issued per kernel since the process started (host side, one per attention launch; the
// replays of a captured CUDA graph are not counted; an "mma" call on a shape tensor cores do not
// take counts as pipelined). Tests use it to prove which kernel ran.
void count_attention_launch(AttentionKernel kernel);
uint64_t attention_launches(AttentionKernel kernel);

}  // namespace cuda
}  // namespace paged_attn
