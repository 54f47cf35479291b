// pipeline_config.cuh — every size of the pipelined kernel (attention_kernel_pipelined.cuh) for
// one instantiation, at compile time: tokens per tile, padded shared-memory rows, stages of the
// ring, the shared-memory layout of a block, and the resident blocks promised to ptxas. The
// launcher (attention_launch.cuh) reads kSmemBytes from here.
#pragma once

#include "../core/host_device.h"  // PA_HOST_DEVICE
#include "../core/params.h"       // kPartitionSize
#include "gqa_mma.cuh"        // kMmaHeads

namespace paged_attn {
namespace cuda {

// Row stride in bytes for rows of `bytes` read by groups of `lanes` consecutive lanes (one row,
// consecutive 16-byte units each), 8 lanes per shared-memory wavefront: the smallest multiple of
// `lanes` units >= the row whose count divided by `lanes` is odd, so the 8 lanes of a wavefront
// (8 / lanes rows) cover 8 different 16-byte bank groups. lanes >= 8: one row per wavefront.
constexpr int conflict_free_row_bytes(int bytes, int lanes) {
  const int units = (bytes + 15) / 16;
  if (lanes >= 8) return units * 16;
  const int per_lane = (units + lanes - 1) / lanes;
  return (per_lane % 2 == 0 ? per_lane + 1 : per_lane) * lanes * 16;
}
constexpr int floor_pow2(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
// Row stride in bytes for rows of `bytes`: an odd number of 16-byte units, so that 8 rows start in
// 8 different 16-byte bank groups (the tensor-core B fragments read 8 rows x 16 bytes at once).
constexpr int odd_units_row_bytes(int bytes) { return (((bytes + 15) / 16) | 1) * 16; }
// The largest power of two <= most that divides v (v >= 1).
constexpr int largest_pow2_divisor(int v, int most) {
  int p = 1;
  while (p * 2 <= most && v % (p * 2) == 0) p *= 2;
  return p;
}
constexpr int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
constexpr int max_int(int a, int b) { return a > b ? a : b; }

constexpr int kKTileBudget = 2048;      // bytes of K per tile at the largest head size
constexpr int kRingBudget = 16 * 1024;  // bytes of ring per warp (3 blocks of head 128 per H200 SM)
// Tokens whose row of vLLM's V (one dim of one block, tokens contiguous) fills a 32-byte sector:
// a tile of fewer reads half sectors, and the tile holding the other half (another warp's) asks
// L2 for the same sector again (what made vLLM's layout L2-bound: docs/PERFORMANCE.md,
// "NVIDIA H200"). Tiles grow to this where the K tile stays within twice kKTileBudget (16-bit
// head <= 128: 16 tokens).
// fp8 stops at 16: its 16-byte rows of a 16-token block pair up in one copy instruction.
constexpr int sector_tokens(int elem) { return 32 / elem < 16 ? 32 / elem : 16; }

// Every size of the pipelined kernel for one instantiation (bytes unless named otherwise).
template <typename CacheT, int kDimsPerLane, int kHeadTile, int kWarpSize, int kNumWarps,
          bool kMma = false>
struct PipelineConfig {
  static constexpr int kElem = static_cast<int>(sizeof(CacheT));
  static constexpr int kMaxDims = kDimsPerLane * kWarpSize;
  static constexpr int kChunkElems = 16 / kElem;  // elements per 16-byte chunk
  static constexpr int kTileTokens = clamp_int(
      max_int(floor_pow2(kKTileBudget / (kMaxDims * kElem)),
              sector_tokens(kElem) * kMaxDims * kElem <= 2 * kKTileBudget ? sector_tokens(kElem)
                                                                          : 0),
      kChunkElems, kWarpSize);
  static constexpr int kLanesPerToken = kWarpSize / kTileTokens;
  static constexpr int kKRowBytes =  // K: one token, read by its kLanesPerToken lanes (or MMA)
      kMma ? odd_units_row_bytes(kMaxDims * kElem)
           : conflict_free_row_bytes(kMaxDims * kElem, kLanesPerToken);
  // vLLM V: one row per dim, read by one lane (16 bytes, or 8 for fp8) or by ldmatrix (8 rows
  // x 16 bytes), unpadded: unit u (16 bytes) of row d is stored at unit u ^ v_unit_swizzle(d),
  // so that unit u of 8 consecutive rows lies in 8 different 16-byte bank groups (v_offset).
  static constexpr int kVRowBytes = kTileTokens * kElem;
  static constexpr int kVRowUnits = kVRowBytes / 16;  // 1, 2, 4 or 8
  static constexpr int kVRowsPerBankCycle = 8 / kVRowUnits;  // rows that span the 8 bank groups
  PA_HOST_DEVICE static constexpr int v_unit_swizzle(int dim) {
    return (dim / kVRowsPerBankCycle) % kVRowUnits;
  }
  // Byte offset in the stage's V of byte `byte` (< kVRowBytes) of dim `dim`'s row.
  PA_HOST_DEVICE static constexpr int v_offset(int dim, int byte) {
    return dim * kVRowBytes + ((((byte >> 4) ^ v_unit_swizzle(dim)) << 4) | (byte & 15));
  }
  static constexpr int kVTokenRowBytes =  // token-major V (tensor cores: the A fragment reads
      kMma ? odd_units_row_bytes(kMaxDims * kElem) : kMaxDims * kElem;  // 4 rows at once)
  static constexpr int kKTileBytes = kTileTokens * kKRowBytes;
  static constexpr int kVTileBytes =
      max_int(kMaxDims * kVRowBytes, kTileTokens * kVTokenRowBytes);
  static constexpr int kStageBytes = kKTileBytes + kVTileBytes;
  static constexpr int kStages = clamp_int(kRingBudget / kStageBytes, 2, 4);
  // shared memory, in this order (each part a multiple of 16 bytes)
  // (tensor cores keep the query and the probabilities in registers: no q, no probs)
  static constexpr int kQBytes = kMma ? 0 : kHeadTile * kMaxDims * 4;        // float q[g][d]
  static constexpr int kProbBytes =
      kMma ? 0 : kNumWarps * kHeadTile * kTileTokens * 4;                     // float [w][g][t]
  static constexpr int kStatsBytes = ((kNumWarps * kHeadTile * 8) + 15) / 16 * 16;
  static constexpr int kSparseBytes = ((kHeadTile * 8) + 15) / 16 * 16;      // int64 [g]
  static constexpr int kMaskBytes = ((kNumWarps * kStages * kTileTokens * 4) + 15) / 16 * 16;
  static constexpr int kRingBytes = kNumWarps * kStages * kStageBytes;
  static constexpr int kOutBytes = kNumWarps * kHeadTile * kMaxDims * 4;     // aliases the rings
  static constexpr int kQOffset = 0;
  static constexpr int kProbOffset = kQOffset + kQBytes;
  static constexpr int kStatsOffset = kProbOffset + kProbBytes;
  static constexpr int kSparseOffset = kStatsOffset + kStatsBytes;
  static constexpr int kMaskOffset = kSparseOffset + kSparseBytes;
  static constexpr int kRingOffset = kMaskOffset + kMaskBytes;
  static constexpr int kSmemBytes = kRingOffset + max_int(kRingBytes, kOutBytes);

  static_assert(kWarpSize % kTileTokens == 0, "a tile's tokens divide the warp");
  static_assert(kTileTokens * kElem >= 16, "a tile holds one 16-byte chunk of vLLM V");
  static_assert(kKRowBytes % 16 == 0 && kVRowBytes % 16 == 0 && kStageBytes % 16 == 0,
                "16-byte aligned rows");
  static_assert(kVRowUnits >= 1 && kVRowUnits <= 8 && (kVRowUnits & (kVRowUnits - 1)) == 0,
                "vLLM V rows of 1, 2, 4 or 8 units: the swizzle spans the 8 bank groups");
  static_assert(kPartitionSize % kWarpSize == 0, "partitions are whole tiles");
  static_assert(!kMma || (kTileTokens % 8 == 0 && kMaxDims % 16 == 0 && kHeadTile <= kMmaHeads),
                "tensor-core tiles: blocks of 8 tokens, slices of 16 dims, at most 8 heads");
  static_assert(kSmemBytes <= 99 * 1024,
                "fits the smallest opt-in shared memory of sm_80 and newer (sm_86: 99 KiB)");
};

// Resident blocks per SM promised to ptxas (a register cap of 65536 / (128 * n)): 3 (168
// registers) as the baseline's small tiles, except tiles of 8 heads (at 168 the 8-head, 2-dims
// tile spilled on sm_80), else 1 (255). The ring, not the warp count, carries the bytes in flight.
// Tensor cores: the accumulator is head_size / 4 floats per lane whatever the heads: 3 up to
// head 128, else 1.
template <int kDimsPerLane, int kHeadTile, bool kMma>
constexpr int pipelined_min_blocks() {
  if (kMma) return kDimsPerLane <= 4 ? 3 : 1;
  return (kDimsPerLane <= 4 && kDimsPerLane * kHeadTile <= 16 && kHeadTile <= 4) ? 3 : 1;
}

}  // namespace cuda
}  // namespace paged_attn
