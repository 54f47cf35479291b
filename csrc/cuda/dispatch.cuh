// dispatch.cuh — THE lists of what the CUDA build compiles, in one place (host code, no torch).
//
// Compile time grows with every instantiation (~1 s per kernel per arch), so the kernels are
// templated on what must live in registers and take everything else at run time:
//   - head size: runtime; the kernel is instantiated per kDimsPerLane = ceil(head_size / 32)
//     (output registers per lane). Listed head sizes map to 6 instantiations.
//   - GQA ratio (query heads per KV head): runtime; the kernel handles kHeadTile heads per pass,
//     kHeadTile in {1, 2, 4, 8}; ratios above 8 take ceil(ratio / 8) passes in the same block.
//   - block size: runtime (any value; multiples of 8, or of 4 for fp32, take vector V loads).
//   - dtype: query fp32 / fp16 / bf16, each with an "auto", an fp8 e4m3fn or an fp8 e5m2 cache:
//     9 combinations, one .cu file each (attention_<dtype>_<cache>.cu).
// Total per arch: 9 x 6 x 4 = 216 attention kernels + 3 reduce + 6 reshape_and_cache kernels
// (docs/cuda_resource_report.txt lists them; scripts/cuda_resource_report.sh checks the count
// against attention_kernels_per_pair() below and the files' explicit instantiations).
#pragma once

#include <type_traits>

#include "../core/params.h"

namespace paged_attn {
namespace cuda {

constexpr int kWarpSize = 32;  // NVIDIA
constexpr int kNumWarps = 4;   // 128 threads per block
constexpr int kThreads = kWarpSize * kNumWarps;
constexpr int kMaxHeadSize = 256;

// Supported head sizes (others: "Unsupported head size" from the launcher).
constexpr int kHeadSizes[] = {32, 64, 80, 96, 112, 120, 128, 192, 256};
constexpr const char* kHeadSizesText = "32, 64, 80, 96, 112, 120, 128, 192, 256";

constexpr bool is_supported_head_size(int head_size) {
  for (int d : kHeadSizes)
    if (d == head_size) return true;
  return false;
}

// The (query dtype, cache kind) pairs the attention kernels are instantiated for, one
// attention_<dtype>_<cache>.cu each. build_info.cu references each pair's launcher, so a pair
// listed here that no file instantiates makes the library fail to load.
struct AttentionPair {
  ScalarKind scalar;
  CacheKind cache;
};
constexpr AttentionPair kAttentionPairs[] = {
    {ScalarKind::kFloat32, CacheKind::kAuto},   {ScalarKind::kFloat32, CacheKind::kFp8E4M3},
    {ScalarKind::kFloat32, CacheKind::kFp8E5M2}, {ScalarKind::kFloat16, CacheKind::kAuto},
    {ScalarKind::kFloat16, CacheKind::kFp8E4M3}, {ScalarKind::kFloat16, CacheKind::kFp8E5M2},
    {ScalarKind::kBFloat16, CacheKind::kAuto},  {ScalarKind::kBFloat16, CacheKind::kFp8E4M3},
    {ScalarKind::kBFloat16, CacheKind::kFp8E5M2},
};

template <int N>
using IntC = std::integral_constant<int, N>;

// head size -> f(IntC<kDimsPerLane>); returns false for an unlisted head size.
template <typename F>
constexpr bool dispatch_head_size(int head_size, F&& f) {
  switch (head_size) {
    case 32: f(IntC<1>{}); return true;
    case 64: f(IntC<2>{}); return true;
    case 80:
    case 96: f(IntC<3>{}); return true;
    case 112:
    case 120:
    case 128: f(IntC<4>{}); return true;
    case 192: f(IntC<6>{}); return true;
    case 256: f(IntC<8>{}); return true;
    default: return false;
  }
}
static_assert(kMaxHeadSize <= 8 * kWarpSize, "largest kDimsPerLane must cover kMaxHeadSize");

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

// The attention kernels one (dtype, cache) pair instantiates: the distinct (kDimsPerLane,
// kHeadTile) pairs the two dispatchers above reach, found by running them over every listed head
// size and every GQA ratio up to 64 (ratios above 8 all take the tile of 8).
constexpr int attention_kernels_per_pair() {
  constexpr int kMaxValue = 64;  // > any kDimsPerLane or kHeadTile
  bool dims_seen[kMaxValue] = {};
  bool tiles_seen[kMaxValue] = {};
  for (int head_size : kHeadSizes)
    dispatch_head_size(head_size, [&](auto dims) { dims_seen[decltype(dims)::value] = true; });
  for (int group = 1; group <= 64; ++group)
    dispatch_head_tile(group, [&](auto tile) { tiles_seen[decltype(tile)::value] = true; });
  int dims = 0, tiles = 0;
  for (int i = 0; i < kMaxValue; ++i) {
    dims += dims_seen[i];
    tiles += tiles_seen[i];
  }
  return dims * tiles;
}

}  // namespace cuda
}  // namespace paged_attn
