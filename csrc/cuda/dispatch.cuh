// dispatch.cuh — THE lists of what the CUDA build compiles, in one place (host code, no torch).
//
// Compile time grows with every instantiation, so the kernels are templated on what must live
// in registers and take everything else at run time:
//   - head size: runtime, one of PAGED_ATTN_CUDA_HEAD_SIZES below; the kernel is instantiated
//     per distinct kDimsPerLane = ceil(head_size / 32) (output registers per lane).
//   - GQA ratio (query heads per KV head): runtime; the kernel handles kHeadTile heads per pass,
//     kHeadTile in {1, 2, 4, 8}; ratios above 8 take ceil(ratio / 8) passes in the same block.
//   - block size: runtime (any value; multiples of 8, or of 4 for fp32, take vector V loads).
//   - dtype: the (query dtype, cache kind) pairs of PAGED_ATTN_CUDA_PAIRS below.
// The build generates one .cu file per (pair, kDimsPerLane) holding that group's kernels, and
// one per pair holding its launchers (csrc/cuda/generate_instantiations.py), so that a parallel
// build compiles them at the same time.
// Per arch: attention_kernels_per_dims(dtype) per (pair, distinct kDimsPerLane) (baseline,
// pipelined, tensor-core) + one reduce kernel per query dtype + two reshape_and_cache kernels per
// query dtype
// (build/cuda_resource_report.txt lists them; scripts/ci/cuda_resource_report.sh checks the count
// against these lists).
#pragma once

#include <type_traits>

#include "../core/params.h"

// The (query dtype, cache kind) pairs the CUDA kernels are compiled for:
// X(ScalarKind enumerator, CacheKind enumerator), one line each. The build writes the
// translation units of each pair from this list (generate_instantiations.py parses the lines
// between this #define and the blank line after it; keep the one-pair-per-line form); C++
// enumerates it with PAGED_ATTN_CUDA_PAIRS(YOUR_MACRO). The first pair of each query dtype also holds that
// dtype's v2 reduce kernel.
#define PAGED_ATTN_CUDA_PAIRS(X) \
  X(kFloat32, kAuto)             \
  X(kFloat32, kFp8E4M3)          \
  X(kFloat32, kFp8E5M2)          \
  X(kFloat16, kAuto)             \
  X(kFloat16, kFp8E4M3)          \
  X(kFloat16, kFp8E5M2)          \
  X(kBFloat16, kAuto)            \
  X(kBFloat16, kFp8E4M3)         \
  X(kBFloat16, kFp8E5M2)

// The head sizes the attention kernels accept: X(head_size), one per line. The array, the text
// of the error message, build_info's list and the dispatcher below all come from it, and
// generate_instantiations.py writes one file of kernels per distinct kDimsPerLane of the list
// (same one-per-line form).
#define PAGED_ATTN_CUDA_HEAD_SIZES(X) \
  X(32)                               \
  X(64)                               \
  X(80)                               \
  X(96)                               \
  X(112)                              \
  X(120)                              \
  X(128)                              \
  X(192)                              \
  X(256)

namespace paged_attn {
namespace cuda {

constexpr int kWarpSize = 32;  // NVIDIA
constexpr int kNumWarps = 4;   // 128 threads per block
constexpr int kThreads = kWarpSize * kNumWarps;

// PAGED_ATTN_CUDA_HEAD_SIZES as an array and as the text the "Unsupported head size" error
// prints.
constexpr int kHeadSizes[] = {
#define PA_HEAD_SIZE_ENTRY(head_size) head_size,
    PAGED_ATTN_CUDA_HEAD_SIZES(PA_HEAD_SIZE_ENTRY)
#undef PA_HEAD_SIZE_ENTRY
};
#define PA_HEAD_SIZE_TEXT(head_size) ", " #head_size
constexpr const char* kHeadSizesText =
    PAGED_ATTN_CUDA_HEAD_SIZES(PA_HEAD_SIZE_TEXT) + 2;  // "32, 64, ..." (the first ", " dropped)
#undef PA_HEAD_SIZE_TEXT

constexpr int max_head_size() {
  int largest = 0;
  for (int d : kHeadSizes) largest = d > largest ? d : largest;
  return largest;
}
constexpr int kMaxHeadSize = max_head_size();

constexpr bool is_supported_head_size(int head_size) {
  for (int d : kHeadSizes)
    if (d == head_size) return true;
  return false;
}

// Output registers per lane for a head size: the kernel's kDimsPerLane template argument.
constexpr int dims_per_lane(int head_size) { return (head_size + kWarpSize - 1) / kWarpSize; }

// PAGED_ATTN_CUDA_PAIRS as an array, for code that loops over the pairs (build_info.cu, which
// references each pair's launcher from the generated files).
struct AttentionPair {
  ScalarKind scalar;
  CacheKind cache;
};
constexpr AttentionPair kAttentionPairs[] = {
#define PA_ATTENTION_PAIR(scalar, cache) {ScalarKind::scalar, CacheKind::cache},
    PAGED_ATTN_CUDA_PAIRS(PA_ATTENTION_PAIR)
#undef PA_ATTENTION_PAIR
};

template <int N>
using IntC = std::integral_constant<int, N>;

// head size -> f(IntC<dims_per_lane(head_size)>); returns false for an unlisted head size.
template <typename F>
constexpr bool dispatch_head_size(int head_size, F&& f) {
  switch (head_size) {
#define PA_HEAD_SIZE_CASE(d) \
  case d: f(IntC<dims_per_lane(d)>{}); return true;
    PAGED_ATTN_CUDA_HEAD_SIZES(PA_HEAD_SIZE_CASE)
#undef PA_HEAD_SIZE_CASE
    default: return false;
  }
}

// GQA ratio -> f(IntC<kHeadTile>): the smallest tile in {1, 2, 4, 8} holding the ratio, else 8.
template <typename F>
constexpr void dispatch_head_tile(int group, F&& f) {
  if (group <= 1) {
    f(IntC<1>{});
  } else if (group <= 2) {
    f(IntC<2>{});
  } else if (group <= 4) {
    f(IntC<4>{});
  } else {
    f(IntC<8>{});
  }
}

// Whether a (query dtype, head tile) instantiation of the pipelined kernel runs the tile's heads
// on tensor cores (gqa_mma.cuh): 16-bit queries (mma.sync takes 16-bit operands; fp32 would lose
// precision as tf32) and tiles of 4 or 8 heads (GQA >= 3: below that the MMA's 8 head columns
// are mostly empty and the FMAs are few). The "mma" kernel choice (kernel_choice.h) launches
// these and the plain pipelined kernel for every other shape.
constexpr bool uses_tensor_cores(ScalarKind scalar, int head_tile) {
  return scalar != ScalarKind::kFloat32 && head_tile >= 4;
}

// The attention kernels one (dtype, cache, kDimsPerLane) group instantiates
// (attention_dims.cuh): the baseline (attention_kernel.cuh) and the pipelined kernel
// (attention_kernel_pipelined.cuh) for every kHeadTile dispatch_head_tile reaches (found by
// running it over every GQA ratio up to 64; ratios above 8 all take the tile of 8), plus the
// tensor-core pipelined kernel for the head tiles uses_tensor_cores() takes.
constexpr int attention_kernels_per_dims(ScalarKind scalar) {
  constexpr int kMaxValue = 64;  // > any kHeadTile
  bool tiles_seen[kMaxValue] = {};
  for (int group = 1; group <= 64; ++group)
    dispatch_head_tile(group, [&](auto tile) { tiles_seen[decltype(tile)::value] = true; });
  int tiles = 0, mma_tiles = 0;
  for (int i = 0; i < kMaxValue; ++i) {
    tiles += tiles_seen[i];
    mma_tiles += tiles_seen[i] && uses_tensor_cores(scalar, i);
  }
  return 2 * tiles + mma_tiles;
}

// The number of distinct kDimsPerLane the listed head sizes take: the groups per pair.
constexpr int distinct_dims_per_lane() {
  constexpr int kMaxValue = 64;  // > any kDimsPerLane
  bool dims_seen[kMaxValue] = {};
  for (int head_size : kHeadSizes)
    dispatch_head_size(head_size, [&](auto dims) { dims_seen[decltype(dims)::value] = true; });
  int dims = 0;
  for (bool seen : dims_seen) dims += seen;
  return dims;
}

}  // namespace cuda
}  // namespace paged_attn
