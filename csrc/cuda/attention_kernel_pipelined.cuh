// attention_kernel_pipelined.cuh — the pipelined paged attention kernel: the same contract,
// params, grid and outputs as attention_kernel.cuh (v1, v2 phase 1, decode over vLLM and
// token-major caches; every dtype / cache kind; GQA head tiles; ALiBi; blocksparse; the
// robustness rules of the NOTE at the top of attention_kernel.cuh), built to keep more bytes in
// flight: K and V reach the registers through a multi-stage shared-memory ring filled with
// cp.async, so a warp has several tiles of K and V in flight while it computes on an earlier one.
// Selected at run time against the baseline kernel (docs/CUDA.md "Kernel choice").
//
// Design.
// - Work split: as the baseline. One thread block per (sequence, KV head, partition), 4 warps,
//   all the query heads of the KV head in passes of kHeadTile heads. The range is cut into tiles
//   of kTileTokens tokens; tile i goes to warp i % kNumWarps, so the warps together stream
//   4 * kTileTokens consecutive tokens.
// - Tile size: a tile's K is at most kKTileBudget (2 KiB) at the instantiation's largest head
//   size, so that a stage stays small and several fit: kTileTokens = the largest power of two
//   <= 2048 / (kMaxDims * element size), at least one 16-byte chunk of V (16 / element size
//   tokens) and at most 32; raised to the tokens whose vLLM V row fills a 32-byte sector
//   (sector_tokens: 8 fp32, 16 bf16 / fp16 / fp8) where that keeps the K tile <= 4 KiB, so
//   that no copy asks L2 for half a sector. fp32 / bf16 / fp8 at head 128: 8 / 16 / 16 tokens.
// - Ring: each warp owns kStages slots (no block-wide barrier in the loop: a warp's tiles are its
//   own), each slot holding one tile's K and V (a stage). kStages = kRingBudget (16 KiB) / stage
//   size, clamped to [2, 4]: at head 128, 2 (fp32, bf16 / fp16) or 3 (fp8), so that a block of
//   the GQA-4 tile takes ~69-72 KiB and three fit an H200 SM (as its registers allow). The warp
//   issues tile m + kStages - 1 while it computes tile m: kStages - 1 stages in flight per warp.
// - Copies: cp.async.cg 16 bytes (sm_80+; a synchronous 16-byte copy on older archs), src-size 0
//   (zero-fill, nothing read) for tokens past the range, bad block ids and blocks no head of the
//   pass attends; a chunk of vLLM V partly past the range reads only the tokens in the range.
//   Tiles start at multiples of kTileTokens from the partition start (partition sizes are
//   multiples of 32 tokens, static_assert below), so a vLLM V chunk never straddles two blocks.
//   Lanes < kTileTokens first resolve their token's block (the one block-table read per token;
//   token -> (table entry, slot) by a launch-wide FastDivmod, no runtime division), its
//   blocksparse head mask and its K / V offsets. For K and token-major V the tile's tokens go
//   in groups of kCopyTokens = min(kTileTokens, 8): in group c lane l copies chunks
//   l / kCopyTokens + j * (32 / kCopyTokens) of token 8c + l % kCopyTokens, so one copy
//   instruction covers >= 64 bytes of each of 8 token-major rows (whole 128-byte runs of vLLM's
//   K chunks) and a lane fetches a token's info by shuffle once per group; vLLM V goes as runs
//   of kX consecutive tokens of one dim (contiguous within a block: with 16-bit 16-token tiles
//   one instruction reads 16 dims' whole 32-byte rows, 512 contiguous bytes). The copy loops
//   have compile-time trip counts (the instantiation's largest row, chunks past head_size
//   skipped) and a running source pointer;
//   the ring's shared-memory address is converted once. vLLM V whose block size is not a
//   multiple of the chunk (16 / element size tokens), and token-major V whose token stride is not
//   16-byte aligned, are copied element by element (plain loads, no cp.async: correct, slower).
// - Shared-memory layout of a stage: K as [kTileTokens][kKRowBytes] (one row per token: vLLM's
//   x-chunks are put back in dim order), V as vLLM's [kMaxDims][kVRowBytes] (one row per dim,
//   tokens contiguous) for vLLM caches or [kTileTokens][kMaxDims] for token-major ones. K rows
//   are padded (conflict_free_row_bytes), vLLM V rows are not but their 16-byte units are
//   swizzled (PipelineConfig::v_offset), so that the 16-byte reads of the 8 lanes of one
//   shared-memory wavefront (8 / kLanesPerToken K rows, consecutive chunks of each; 8 V rows)
//   hit 8 different 16-byte bank groups: QK's K reads and P.V's vLLM V reads are conflict-free
//   (fp8 V: 8-byte reads, 2-way); token-major V is read in vectors of the lane's consecutive
//   dims where its span allows 4-byte or wider ones (head sizes with an even number of dims per
//   lane, kTmVectors), else one element per lane, consecutive lanes consecutive dims.
// - QK: kLanesPerToken = 32 / kTileTokens lanes per token, lane (token, sub) dotting chunks
//   sub, sub + kLanesPerToken, ... of its token's K row against the shared-memory queries, then an
//   xor-shuffle sum over the token's lanes. Softmax as the baseline (warp-uniform running max per
//   head, per-lane exp sums, kept by the token's first lane only); P.V as the baseline (lane owns
//   dims lane + 32 j, kVVec tokens per step; token-major V with kTmVectors: dims
//   kDimsPerLane * lane + j, read as vectors) but from the stage: no masking is needed there,
//   every V value that is not to be read is a zero in shared memory.
// - Synchronisation: per warp, wait_group(kStages - 1) then __syncwarp before a stage is read
//   (the copies of every lane have landed and are visible to the warp); __syncwarp after the
//   stage's P.V, before the next iteration issues a copy into the slot read one iteration
//   earlier. After the last tile: wait_group(0), then __syncthreads before the warps' outputs are
//   written into shared memory that aliases the rings.
// - Merge: as the baseline: butterfly StatsMergeOp over the lanes (warp_reduce.cuh), then the
//   warps' compound states in warp order 0..3 (compound_state.h), normalised, times v_scale.
// - Tensor cores (kMma: 16-bit queries, GQA tiles of 4 or 8 heads; dispatch.cuh
//   uses_tensor_cores): QK, the softmax and P.V of the tile's heads run as GqaMmaWarp
//   (gqa_mma.cuh) on the stage instead of the per-head FMAs above; the query stays 16-bit in
//   registers (scale applied to the fp32 logits), the K and V fragments of 16-bit caches come
//   by ldmatrix.x4 (fp8 caches: decoded element pairs), K and token-major V rows are padded to
//   an odd number of 16-byte units (the 8 rows of each 8 x 8 matrix then start in 8 different
//   bank groups), and the warp's (max, sum) and O^T go to the same merge.
// Shared memory is dynamic (launch: cudaFuncSetAttribute above 48 KiB); PipelineConfig
// (pipeline_config.cuh) holds every size, shared_memory.cuh the cp.async / ldmatrix PTX,
// mma_ops.cuh the tensor-core lane operations.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../core/compound_state.h"
#include "../core/fast_divmod.h"
#include "../core/params.h"
#include "attention_kernel.cuh"  // block_token_range, attending_heads, write_head_result
#include "cache_access.cuh"
#include "gqa_mma.cuh"
#include "kernel_families.h"
#include "grid_dependency.cuh"
#include "mma_ops.cuh"
#include "pipeline_config.cuh"
#include "shared_memory.cuh"
#include "warp_reduce.cuh"

namespace paged_attn {
namespace cuda {

// The kernel's dynamic shared memory, 16-byte aligned (tests/cuda_sim, the host simulation of the
// kernels, defines its own).
#ifndef PAGED_ATTN_DYNAMIC_SHARED_MEMORY
#define PAGED_ATTN_DYNAMIC_SHARED_MEMORY(name) extern __shared__ __align__(16) unsigned char name[]
#endif

__device__ __forceinline__ int64_t shfl_int64(int64_t v, int src_lane) {
  const int lo = __shfl_sync(0xffffffffu, static_cast<int>(v & 0xffffffff), src_lane);
  const int hi = __shfl_sync(0xffffffffu, static_cast<int>(v >> 32), src_lane);
  return (static_cast<int64_t>(hi) << 32) | static_cast<uint32_t>(lo);
}

// Grid, block, p.partition_size and template parameters: as paged_attention_kernel
// (attention_kernel.cuh). Dynamic shared memory: PipelineConfig<...>::kSmemBytes.
// kMma: the tile's heads on tensor cores (see the top; 16-bit Scalar, kHeadTile <= kMmaHeads).
template <typename Scalar, CacheKind kCache, int kDimsPerLane, int kHeadTile, int kWarpSize,
          int kNumWarps, bool kMma>
__device__ __forceinline__ void pipelined_attention(const PagedAttentionParams& p) {
  using CacheT = typename CacheElement<Scalar, kCache>::type;
  using Cfg = PipelineConfig<CacheT, kDimsPerLane, kHeadTile, kWarpSize, kNumWarps, kMma>;
  static_assert(!kMma || kWarpSize == 32, "mma.sync is a 32-lane operation");
  constexpr int kThreads = kNumWarps * kWarpSize;
  constexpr int kMaxDims = Cfg::kMaxDims;
  constexpr int kTile = Cfg::kTileTokens;
  constexpr int kLanesPerToken = Cfg::kLanesPerToken;
  constexpr int kStages = Cfg::kStages;
  constexpr int kElem = Cfg::kElem;
  constexpr bool kFp8 = kCache != CacheKind::kAuto;
  constexpr bool e5m2 = kCache == CacheKind::kFp8E5M2;
  constexpr int kX = Cfg::kChunkElems;                                // K elements per 16 B
  constexpr int kVVec = kElem == 4 ? 4 : 8;                           // V tokens per read
  constexpr int kVBytes = kVVec * kElem;                              // 16 or 8 bytes
  static_assert(kX % 4 == 0 && kVVec % 4 == 0 && kTile % kVVec == 0, "vector widths");
  // the copies (issue_tile): K / token-major V rows in chunks of 16 bytes, kCopyTokens tokens
  // per instruction (kVecStep chunks of each), kCopyGroups instructions for the tile's tokens;
  // vLLM V in kGroups chunks per dim row, kDimStep dims per instruction
  constexpr int kRowChunks = kMaxDims / kX;
  constexpr int kCopyTokens = kTile < 8 ? kTile : 8;
  constexpr int kCopyGroups = kTile / kCopyTokens;
  constexpr int kVecStep = kWarpSize / kCopyTokens;
  constexpr int kVecIters = (kRowChunks + kVecStep - 1) / kVecStep;
  constexpr int kGroups = kTile / kX;
  constexpr int kDimStep = kWarpSize / kGroups;
  constexpr int kDimIters = (kMaxDims + kDimStep - 1) / kDimStep;
  // P.V on token-major V: the lane's kDimsPerLane dims are consecutive and read as vectors of
  // kTmVecBytes (the widest power of two <= 16 dividing the lane's span, 4 bytes at least) where
  // that is wider than an element; else (and on vLLM V) the lane owns dims lane + kWarpSize j
  constexpr int kTmVecBytes = largest_pow2_divisor(kDimsPerLane * kElem, 16);
  constexpr bool kTmVectors = kTmVecBytes >= 4 && kTmVecBytes > kElem;
  constexpr int kTmVecElems = kTmVecBytes / kElem;

  allow_dependent_launch();  // PDL: the split's reduce may be launched (grid_dependency.cuh)
  PAGED_ATTN_DYNAMIC_SHARED_MEMORY(smem_raw);
  float(*smem_q)[kMaxDims] = reinterpret_cast<float(*)[kMaxDims]>(smem_raw + Cfg::kQOffset);
  float(*smem_probs)[kHeadTile][kTile] =
      reinterpret_cast<float(*)[kHeadTile][kTile]>(smem_raw + Cfg::kProbOffset);
  SoftmaxStats(*smem_stats)[kHeadTile] =
      reinterpret_cast<SoftmaxStats(*)[kHeadTile]>(smem_raw + Cfg::kStatsOffset);
  int64_t* smem_sparse_offset = reinterpret_cast<int64_t*>(smem_raw + Cfg::kSparseOffset);
  uint32_t(*smem_masks)[kStages][kTile] =
      reinterpret_cast<uint32_t(*)[kStages][kTile]>(smem_raw + Cfg::kMaskOffset);
  float(*smem_out)[kHeadTile][kMaxDims] =  // after the token loop only (aliases the rings)
      reinterpret_cast<float(*)[kHeadTile][kMaxDims]>(smem_raw + Cfg::kRingOffset);

  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int part = blockIdx.z;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int head_size = p.head_size;
  const int block_size = p.block_size;
  const int group = p.num_heads / p.num_kv_heads;
  const int seq_len = p.seq_lens[seq];
  unsigned char* const ring = smem_raw + Cfg::kRingOffset +
                              static_cast<int64_t>(warp) * kStages * Cfg::kStageBytes;
  const SharedAddress ring_shared = SharedAddress::of(ring);  // the copies' destination (ring)

  // ---- row validity: as the baseline (NOTE at the top of attention_kernel.cuh) ----
  int tok_begin = 0, tok_end = 0;
  if (!block_token_range<Scalar, kThreads>(p, seq, kv_head, part, seq_len, tok_begin, tok_end))
    return;  // uniform across the block: no barrier has been reached

  const int32_t* table_row = p.block_tables + static_cast<int64_t>(seq) * p.max_blocks_per_seq;
  const CacheT* k_head = static_cast<const CacheT*>(p.key_cache) +
                         static_cast<int64_t>(kv_head) * p.k_layout.head_stride;
  const CacheT* v_head = static_cast<const CacheT*>(p.value_cache) +
                         static_cast<int64_t>(kv_head) * p.v_layout.head_stride;
  const Scalar* q_row =
      static_cast<const Scalar*>(p.query) + static_cast<int64_t>(seq) * p.q_seq_stride;
  float k_scale = 1.0f, v_scale = 1.0f;
  if (kFp8) {
    k_scale = p.k_scale_ptr != nullptr ? *p.k_scale_ptr : p.k_scale;
    v_scale = p.v_scale_ptr != nullptr ? *p.v_scale_ptr : p.v_scale;
  }
  const bool token_major = p.kv_form == KvForm::kTokenMajor;
  const int64_t k_vec_stride = token_major ? kX : p.k_layout.chunk_stride;
  const int64_t v_dim_stride = token_major ? 1 : p.v_layout.chunk_stride;
  // V copied in 16-byte chunks (else element by element; see the top)
  const bool v_chunked = token_major ? (p.v_layout.token_stride * kElem) % 16 == 0
                                     : block_size % kX == 0;
  const int num_k_vecs = head_size / kX;  // 16-byte chunks per token row (K, token-major V)
  // issue_tile's per-lane copy trip counts: chunk j of a K / token-major V row is copied when
  // j < k_chunk_iters (chunk vec0 + j * kVecStep < num_k_vecs), dim row j of vLLM V when
  // j < v_dim_iters (dim v_d0 + j * kDimStep < head_size). NOTE: one register each; a bound
  // test per j kept one register per j live across the token loop (ptxas spilled at head 256).
  const int vec0 = lane / kCopyTokens;
  const int k_chunk_iters =
      num_k_vecs > vec0 ? (num_k_vecs - vec0 + kVecStep - 1) / kVecStep : 0;
  const int v_d0 = lane / kGroups;
  const int v_dim_iters = head_size > v_d0 ? (head_size - v_d0 + kDimStep - 1) / kDimStep : 0;
  const CudaShuffleXor<kWarpSize> shuffle;
  const FastDivmod block_divider(block_size);  // token -> (block-table entry, slot in the block)
  bool bad_block = false;
  // the output dims of acc[g][j] (CUDA-core math): pv_dim0 + j * pv_dim_step
  const bool pv_vectors = kTmVectors && token_major;
  const int pv_dim0 = pv_vectors ? lane * kDimsPerLane : lane;
  const int pv_dim_step = pv_vectors ? 1 : kWarpSize;

  // tiles of this warp: tok_begin + (warp + kNumWarps * m) * kTile, m < warp_tiles
  const int num_tiles = (tok_end - tok_begin + kTile - 1) / kTile;
  const int warp_tiles = num_tiles > warp ? (num_tiles - warp + kNumWarps - 1) / kNumWarps : 0;

  for (int head_first = 0; head_first < group; head_first += kHeadTile) {
    const int num_tile_heads = min(kHeadTile, group - head_first);
    const int head0 = kv_head * group + head_first;

    // ---- query rows -> shared memory, as the baseline (tensor cores: registers, below) ----
    for (int i = threadIdx.x; i < (kMma ? 0 : kHeadTile * kMaxDims); i += kThreads) {
      const int g = i / kMaxDims;
      const int d = i % kMaxDims;
      float q = 0.0f;
      if (g < num_tile_heads && d < head_size)
        q = to_float(q_row[static_cast<int64_t>(head0 + g) * p.q_head_stride + d]) * p.scale;
      smem_q[g][d] = q;
    }
    if (blocksparse_active(p.blocksparse) && threadIdx.x < num_tile_heads)
      smem_sparse_offset[threadIdx.x] =
          blocksparse_offset(p.blocksparse, p.num_heads, p.num_kv_heads, head0 + threadIdx.x);
    float slope[kHeadTile];
#pragma unroll
    for (int g = 0; g < kHeadTile; ++g)
      slope[g] = (p.alibi_slopes != nullptr && g < num_tile_heads) ? p.alibi_slopes[head0 + g]
                                                                   : 0.0f;
    __syncthreads();

    // Issues the copies of this warp's tile m into its slot (every lane calls it: shuffles).
    auto issue_tile = [&](int m) {
      const int slot = m % kStages;
      const int tile0 = tok_begin + (warp + kNumWarps * m) * kTile;
      unsigned char* const k_dst = ring + slot * Cfg::kStageBytes;
      unsigned char* const v_dst = k_dst + Cfg::kKTileBytes;
      const SharedAddress k_copy_dst = ring_shared + slot * Cfg::kStageBytes;
      const SharedAddress v_copy_dst = k_copy_dst + Cfg::kKTileBytes;
      // lanes < kTile: token tile0 + lane's block, head mask and K / V offsets
      uint32_t mask = 0;  // 0: the token is not read (past the range, bad id, not attended)
      int64_t k_off = 0, v_off = 0;
      const int t = tile0 + lane;
      if (lane < kTile && t < tok_end) {
        int table_index, in_block;
        block_divider.divmod(t, table_index, in_block);
        const int64_t block_id = table_row[table_index];
        if (block_id < 0 || block_id >= p.num_blocks) {
          bad_block = true;  // never dereferenced
        } else {
          mask = attending_heads<kHeadTile>(p, smem_sparse_offset, num_tile_heads, seq_len,
                                            table_index);
          k_off = block_id * p.k_layout.block_stride +
                  static_cast<int64_t>(in_block) * p.k_layout.token_stride;
          v_off = block_id * p.v_layout.block_stride +
                  static_cast<int64_t>(in_block) * p.v_layout.token_stride;
        }
      }
      if (lane < kTile) smem_masks[warp][slot][lane] = mask;

      // K, and token-major V: in group c (of kCopyGroups) lane copies chunks vec = lane /
      // kCopyTokens + j * kVecStep of token c * kCopyTokens + lane % kCopyTokens, so one copy
      // instruction of the warp covers kVecStep consecutive chunks of each of kCopyTokens
      // tokens: at least 64 bytes of each token-major row (NOTE: 16 tokens x 32 bytes per
      // instruction doubles the L2 requests per byte; docs/PERFORMANCE.md, "NVIDIA H200"), and
      // whole 128-byte runs of vLLM's K chunks. A lane fetches a
      // token's info by shuffle once per group and its source advances by a fixed step. The
      // loops run over the instantiation's largest row (compile-time trip counts) and skip
      // chunks past head_size. A token that is not read copies 0 bytes from the cache's first
      // element.
      // the tile's rows of one cache: token t's row at head + off (off: lane t's), chunk i at
      // i * chunk_stride elements; shared-memory row of token t at rows + t * row_bytes
      auto copy_token_rows = [&](const CacheT* head, int64_t off, int64_t chunk_stride,
                                 SharedAddress rows, int row_bytes) {
#pragma unroll
        for (int c = 0; c < kCopyGroups; ++c) {
          const int tok = c * kCopyTokens + lane % kCopyTokens;
          const bool tok_read = __shfl_sync(0xffffffffu, mask, tok) != 0;
          const int64_t tok_off = shfl_int64(off, tok);
          const int chunk_bytes = tok_read ? 16 : 0;
          const CacheT* src = tok_read ? head + tok_off + vec0 * chunk_stride : head;
          const int64_t src_step = tok_read ? kVecStep * chunk_stride : 0;
          const SharedAddress dst = rows + (tok * row_bytes + vec0 * 16);
#pragma unroll
          for (int j = 0; j < kVecIters; ++j, src += src_step)
            if (j < k_chunk_iters) copy16_async(dst + j * kVecStep * 16, src, chunk_bytes);
        }
      };
      copy_token_rows(k_head, k_off, k_vec_stride, k_copy_dst, Cfg::kKRowBytes);
      // V
      if (v_chunked && !token_major) {
        // vLLM V: [dim][token] rows; lane copies the kX tokens from (lane % kGroups) * kX of dims
        // lane / kGroups + j * kDimStep (the chunk's tokens share one block: block_size % kX
        // == 0), reading only the tokens < tok_end
        const int v_tok = (lane % kGroups) * kX;
        const uint32_t v_mask = __shfl_sync(0xffffffffu, mask, v_tok);
        const int64_t off = shfl_int64(v_off, v_tok);
        // (a token that is read lies before tok_end)
        const int bytes = v_mask != 0 ? min(tok_end - (tile0 + v_tok), kX) * kElem : 0;
        const CacheT* src = bytes > 0 ? v_head + off + v_d0 * v_dim_stride : v_head;
        const int64_t src_step = bytes > 0 ? kDimStep * v_dim_stride : 0;
#pragma unroll
        for (int j = 0; j < kDimIters; ++j, src += src_step)
          if (j < v_dim_iters)
            copy16_async(v_copy_dst + Cfg::v_offset(v_d0 + j * kDimStep, v_tok * kElem), src,
                         bytes);
      } else if (v_chunked) {  // token-major V: [token][dim] rows, as K
        copy_token_rows(v_head, v_off, kX, v_copy_dst, Cfg::kVTokenRowBytes);
      } else {  // element by element, into the form's layout (0 where not read)
        const int v_elems = kTile * head_size;
#pragma unroll 1
        for (int c0 = 0; c0 < v_elems; c0 += kWarpSize) {
          const int c = c0 + lane;
          const int tok = token_major ? (c / head_size) % kTile : c % kTile;
          const int d = token_major ? c % head_size : c / kTile;
          const uint32_t tok_mask = __shfl_sync(0xffffffffu, mask, tok);
          const int64_t off = shfl_int64(v_off, tok);
          if (c < v_elems) {
            CacheT value;
            if (tok_mask != 0) {
              value = v_head[off + d * v_dim_stride];
            } else {
              value = CacheT{};
              if constexpr (!kFp8) value = from_float<CacheT>(0.0f);
            }
            unsigned char* dst = token_major ? v_dst + tok * Cfg::kVTokenRowBytes + d * kElem
                                             : v_dst + Cfg::v_offset(d, tok * kElem);
            *reinterpret_cast<CacheT*>(dst) = value;
          }
        }
      }
    };

    // ---- per-warp online softmax state, as the baseline ----
    float run_max[kHeadTile];
    float lane_sum[kHeadTile];
    float acc[kHeadTile][kDimsPerLane];
#pragma unroll
    for (int g = 0; g < kHeadTile; ++g) {
      run_max[g] = -INFINITY;
      lane_sum[g] = 0.0f;
#pragma unroll
      for (int j = 0; j < kDimsPerLane; ++j) acc[g][j] = 0.0f;
    }
    const int qk_tok = lane / kLanesPerToken;  // QK: this lane's token in the tile
    const int qk_sub = lane % kLanesPerToken;  // and its share of the token's chunks

    // ---- tensor cores: the query in registers, this lane's head (GqaMmaWarp::g) ----
    using MmaOps = CudaMmaOps<std::conditional_t<kMma, Scalar, __half>>;
    struct NoMma {};
    const MmaOps mma_ops;
    std::conditional_t<kMma, GqaMmaWarp<kMaxDims, kTile, MmaOps>, NoMma> mma;
    float mma_slope = 0.0f;                 // ALiBi slope of head mma.g
    const float qk_scale = p.scale * k_scale;
    if constexpr (kMma) {
      mma.init(lane);
      mma.load_query(mma_ops, [&](int head, int d) {
        return head < num_tile_heads && d < head_size
                   ? to_float(q_row[static_cast<int64_t>(head0 + head) * p.q_head_stride + d])
                   : 0.0f;
      });
      if (p.alibi_slopes != nullptr && mma.g < num_tile_heads)
        mma_slope = p.alibi_slopes[head0 + mma.g];
      // K rows past head_size: zeros, as GqaMmaWarp::tile asks (a 16-dim slice may end past
      // head_size). No copy writes them, but the merge of a previous pass did (smem_out
      // aliases the rings): each warp clears its ring's, whole 16-byte chunks (head_size x the
      // element size is a multiple of 16).
      const int pad_chunks = (kMaxDims - head_size) * kElem / 16;  // per K row
#pragma unroll 1
      for (int i = lane; i < kStages * kTile * pad_chunks; i += kWarpSize) {
        const int row = i / pad_chunks;  // stage row / kTile, token row % kTile
        *reinterpret_cast<uint4*>(ring + (row / kTile) * Cfg::kStageBytes +
                                  (row % kTile) * Cfg::kKRowBytes + head_size * kElem +
                                  (i % pad_chunks) * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
      __syncwarp();
    }

    // ---- the pipeline: kStages - 1 tiles ahead ----
#pragma unroll 1
    for (int m = 0; m < kStages - 1; ++m) {
      if (m < warp_tiles) issue_tile(m);
      copy_async_commit();  // one group per tile, empty or not: the wait counts stay exact
    }
#pragma unroll 1
    for (int m = 0; m < warp_tiles; ++m) {
      if (m + kStages - 1 < warp_tiles) issue_tile(m + kStages - 1);
      copy_async_commit();
      copy_async_wait<kStages - 1>();  // this thread's copies of tile m have landed
      __syncwarp();                    // and every lane's are visible to the warp
      const int slot = m % kStages;
      const int tile0 = tok_begin + (warp + kNumWarps * m) * kTile;
      const unsigned char* const k_src = ring + slot * Cfg::kStageBytes;
      const unsigned char* const v_src = k_src + Cfg::kKTileBytes;

      if constexpr (kMma) {
        const uint32_t* const tile_masks = smem_masks[warp][slot];
        auto logit = [&](int head, int tok, float dot) {  // head is this lane's mma.g
          return head < num_tile_heads && ((tile_masks[tok] >> head) & 1u)
                     ? dot * qk_scale + mma_slope * static_cast<float>(tile0 + tok - seq_len + 1)
                     : -INFINITY;
        };
        if constexpr (std::is_same<CacheT, Scalar>::value) {
          // 16-bit cache: the fragments by ldmatrix, one x4 per two 16-dim slices (GqaMmaWarp's
          // k_frags / v_frags: matrix j of the x4 is register j); lane gives row lane % 8 of
          // matrix lane / 8
          const SharedAddress k_stage = ring_shared + slot * Cfg::kStageBytes;
          const SharedAddress v_stage = k_stage + Cfg::kKTileBytes;
          const int row = lane % 8, matrix = lane / 8;
          auto k_frags = [&](int b, int s, uint32_t kb[4]) {  // K rows: token 8b + row, dims
            ldmatrix_x4<false>(kb, k_stage + ((8 * b + row) * Cfg::kKRowBytes +  // 16s + 8 matrix..
                                              (16 * s + 8 * matrix) * kElem));
          };
          // NOTE: one tile for both V forms (a predicated ldmatrix per slice): a tile per form
          // made ptxas recompute the copies' loop invariants in every tile
          auto v_frags = [&](int b, int s, uint32_t va[4]) {
            if (token_major)  // [token][dim] rows, transposed: token 8b + row, dims 16s + 8 matrix..
              ldmatrix_x4<true>(va, v_stage + ((8 * b + row) * Cfg::kVTokenRowBytes +
                                               (16 * s + 8 * matrix) * kElem));
            else  // vLLM [dim][token] rows: dim 16s + lane, tokens 8b..
              ldmatrix_x4<false>(va, v_stage + Cfg::v_offset(16 * s + lane, 8 * b * kElem));
          };
          mma.tile(mma_ops, head_size, k_frags, v_frags, logit);
          __syncwarp();  // NOTE: the slot is rewritten only after every lane read it
          continue;
        }
        // fp8 cache: each lane decodes its own element pairs
        const CacheT* const k_rows = reinterpret_cast<const CacheT*>(k_src);
        const CacheT* const v_rows = reinterpret_cast<const CacheT*>(v_src);
        auto k_pair = [&](int tok, int d) {
          return mma_adjacent_pair<Scalar>(k_rows + tok * (Cfg::kKRowBytes / kElem) + d, e5m2,
                                           mma_ops);
        };
        // one tile per V form, so that no pair of the tile tests the form
        auto run_tile = [&](auto v_pair) {  // v_pair(d, tok): V[tok][d], V[tok + 1][d]
          const FragmentsFromPairs<decltype(k_pair), decltype(v_pair)> frags{mma.g, mma.t,
                                                                              k_pair, v_pair};
          // head 256: one QK chain (four registers fewer per block; at two, ptxas spilled on
          // sm_100 / sm_120), its MMA latency behind the pair decode
          mma.template tile<kMaxDims >= 256 ? 1 : 2>(
              mma_ops, head_size, [&](int b, int s, uint32_t kb[4]) { frags.k_frags(b, s, kb); },
              [&](int b, int s, uint32_t va[4]) { frags.v_frags(b, s, va); }, logit);
        };
        if (token_major) {  // [token][dim] rows
          run_tile([&](int d, int tok) {
            const CacheT* v_tok = v_rows + tok * (Cfg::kVTokenRowBytes / kElem) + d;
            return mma_pair<Scalar>(v_tok, v_tok + Cfg::kVTokenRowBytes / kElem, e5m2, mma_ops);
          });
        } else {  // vLLM [dim][token] rows: the pair is adjacent
          run_tile([&](int d, int tok) {
            return mma_adjacent_pair<Scalar>(reinterpret_cast<const CacheT*>(
                                                 v_src + Cfg::v_offset(d, tok * kElem)), e5m2,
                                             mma_ops);
          });
        }
        __syncwarp();  // NOTE: the slot is rewritten only after every lane read it
        continue;
      }

      // ---- QK: kLanesPerToken lanes per token ----
      const uint32_t heads_mask = smem_masks[warp][slot][qk_tok];
      float dot[kHeadTile];
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) dot[g] = 0.0f;
      if (heads_mask != 0) {
        const CacheT* k_row = reinterpret_cast<const CacheT*>(k_src + qk_tok * Cfg::kKRowBytes);
#pragma unroll 2
        for (int i = qk_sub; i < num_k_vecs; i += kLanesPerToken) {
          float k[kX];
          load_to_float<CacheT, 16>(k_row + i * kX, e5m2, k);
#pragma unroll
          for (int g = 0; g < kHeadTile; ++g) {
            const float4* q4 = reinterpret_cast<const float4*>(&smem_q[g][i * kX]);
#pragma unroll
            for (int c = 0; c < kX / 4; ++c) {
              const float4 qv = q4[c];
              dot[g] = fma4(qv, &k[4 * c], dot[g]);
            }
          }
        }
      }
      float logit[kHeadTile];
      const float alibi_pos = static_cast<float>(tile0 + qk_tok - seq_len + 1);
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) {
#pragma unroll
        for (int mask = kLanesPerToken / 2; mask > 0; mask >>= 1)
          dot[g] += __shfl_xor_sync(0xffffffffu, dot[g], mask, kWarpSize);
        logit[g] = (heads_mask >> g) & 1u ? dot[g] * k_scale + slope[g] * alibi_pos : -INFINITY;
      }

      // ---- online softmax update (a token's lanes hold the same logit) ----
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) {
        float tile_max = logit[g];
#pragma unroll
        for (int mask = kWarpSize / 2; mask >= kLanesPerToken; mask >>= 1)
          tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, mask, kWarpSize));
        MergeFactors f;
        const SoftmaxStats merged =
            merge_stats(SoftmaxStats{run_max[g], 0.0f}, SoftmaxStats{tile_max, 0.0f}, f);
        const float prob = merged.max == -INFINITY ? 0.0f : fast_exp(logit[g] - merged.max);
        lane_sum[g] = lane_sum[g] * f.scale_a + (qk_sub == 0 ? prob : 0.0f);
#pragma unroll
        for (int j = 0; j < kDimsPerLane; ++j) acc[g][j] *= f.scale_a;
        run_max[g] = merged.max;
        if (qk_sub == 0) smem_probs[warp][g][qk_tok] = prob;
      }
      __syncwarp();

      // ---- P.V from the stage: lane owns dims pv_dim0 + pv_dim_step * j ----
#pragma unroll 1
      for (int s0 = 0; s0 < kTile; s0 += kVVec) {
        if (tile0 + s0 >= tok_end) break;  // warp-uniform
        float v[kDimsPerLane][kVVec];
        if (pv_vectors) {  // token-major: the lane's consecutive dims of each token's row
          if constexpr (kTmVectors) {  // (pv_vectors is false otherwise)
            const CacheT* const dims =
                reinterpret_cast<const CacheT*>(v_src + s0 * Cfg::kVTokenRowBytes) + pv_dim0;
#pragma unroll
            for (int e = 0; e < kVVec; ++e) {
#pragma unroll
              for (int i = 0; i < kDimsPerLane; i += kTmVecElems) {
                // NOTE: a vector lies wholly inside or past head_size (16-byte rows: head_size is
                // a multiple of kTmVecElems); past it the stage holds no copy, so zeros
                float part[kTmVecElems];
                if (pv_dim0 + i < head_size) {
                  load_to_float<CacheT, kTmVecBytes>(
                      dims + e * (Cfg::kVTokenRowBytes / kElem) + i, e5m2, part);
                } else {
#pragma unroll
                  for (int k = 0; k < kTmVecElems; ++k) part[k] = 0.0f;
                }
#pragma unroll
                for (int k = 0; k < kTmVecElems; ++k) v[i + k][e] = part[k];
              }
            }
          }
        } else {
#pragma unroll
          for (int j = 0; j < kDimsPerLane; ++j) {
            const int d = lane + j * kWarpSize;
            if (d >= head_size) {
#pragma unroll
              for (int e = 0; e < kVVec; ++e) v[j][e] = 0.0f;
            } else if (!token_major) {
              load_to_float<CacheT, kVBytes>(
                  reinterpret_cast<const CacheT*>(v_src + Cfg::v_offset(d, s0 * kElem)), e5m2,
                  v[j]);
            } else {
#pragma unroll
              for (int e = 0; e < kVVec; ++e)
                v[j][e] = load_one(reinterpret_cast<const CacheT*>(
                                       v_src + (s0 + e) * Cfg::kVTokenRowBytes) + d,
                                   e5m2);
            }
          }
        }
#pragma unroll
        for (int g = 0; g < kHeadTile; ++g) {
          const float4* p4 = reinterpret_cast<const float4*>(&smem_probs[warp][g][s0]);
#pragma unroll
          for (int c = 0; c < kVVec / 4; ++c) {
            const float4 pr = p4[c];
#pragma unroll
            for (int j = 0; j < kDimsPerLane; ++j)
              acc[g][j] = fma4(pr, &v[j][4 * c], acc[g][j]);
          }
        }
      }
      __syncwarp();  // NOTE: the slot and the probs are rewritten only after every lane read them
    }
    copy_async_wait<0>();

    // ---- merge: lanes (butterfly), then warps in order, as the baseline ----
    if constexpr (kMma) {
      const SoftmaxStats head_stats = mma.head_stats(mma_ops);  // head mma.g, on its 4 lanes
      __syncthreads();  // NOTE: every warp is done with its ring, which smem_out aliases
      if (mma.t == 0 && mma.g < kHeadTile) smem_stats[warp][mma.g] = head_stats;
#pragma unroll
      for (int s = 0; s < kMaxDims / 16; ++s) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int head = mma.out_head(i);
          if (head < kHeadTile) smem_out[warp][head][mma.out_dim(s, i)] = mma.acc[s][i];
        }
      }
    } else {
      SoftmaxStats warp_stats[kHeadTile];
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g)
        warp_stats[g] = butterfly_allreduce<kWarpSize>(SoftmaxStats{run_max[g], lane_sum[g]},
                                                       StatsMergeOp{}, shuffle);
      __syncthreads();  // NOTE: every warp is done with its ring, which smem_out aliases
#pragma unroll
      for (int g = 0; g < kHeadTile; ++g) {
        if (lane == 0) smem_stats[warp][g] = warp_stats[g];
#pragma unroll
        for (int j = 0; j < kDimsPerLane; ++j)
          smem_out[warp][g][pv_dim0 + j * pv_dim_step] = acc[g][j];
      }
    }
    const bool any_bad = __syncthreads_or(bad_block);

    for (int i = threadIdx.x; i < num_tile_heads * head_size; i += kThreads) {
      const int g = i / head_size;
      const int d = i % head_size;
      CompoundState<1> total;
      total.init();
#pragma unroll
      for (int w = 0; w < kNumWarps; ++w) {
        CompoundState<1> warp_state;
        warp_state.stats = smem_stats[w][g];
        warp_state.out[0] = smem_out[w][g][d];
        total.merge(warp_state);
      }
      write_head_result<Scalar>(p, seq, head0 + g, part, d, total, any_bad, v_scale);
    }
    __syncthreads();  // NOTE: the next pass rewrites q, the rings (smem_out) and the stats
  }
}

// The pipelined kernel (kMma: its tensor-core form), where this arch's device code holds it
// (kernel_families.h: sm_80 and newer); elsewhere a trap that the kernel choice never launches.
template <typename Scalar, CacheKind kCache, int kDimsPerLane, int kHeadTile, int kWarpSize,
          int kNumWarps, bool kMma>
__global__ void __launch_bounds__(kNumWarps* kWarpSize,
                                  pipelined_min_blocks<kDimsPerLane, kHeadTile, kMma>())
    paged_attention_pipelined_kernel(const PagedAttentionParams p) {
  if constexpr (PAGED_ATTN_DEVICE_CODE_HAS_PIPELINED) {
    pipelined_attention<Scalar, kCache, kDimsPerLane, kHeadTile, kWarpSize, kNumWarps, kMma>(p);
  } else {
    __trap();
  }
}

}  // namespace cuda
}  // namespace paged_attn
