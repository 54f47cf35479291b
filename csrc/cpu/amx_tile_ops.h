// amx_tile_ops.h — what every AMX tile loop of the "amx" variant shares: the tile configuration
// (ldtilecfg), the tile instructions by tile number, how many heads a head tile takes, and the
// layout of a work item's tile scratch. Included by the amx_*.h headers only (in isa_amx.cpp's
// AMX target region, after avx512_layer.h).
#pragma once

namespace paged_attn {
namespace cpu {
namespace PA_ISA {

float* tile_scratch(size_t floats);  // isa_amx.cpp, compiled for the baseline ISA

// ldtilecfg's 64-byte operand (palette 1): rows and bytes per row of each tile.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
  void set(int t, int r, int bytes) {
    rows[t] = static_cast<uint8_t>(r);
    colsb[t] = static_cast<uint16_t>(bytes);
  }
  // NOTE: an asm operand of all 64 bytes: GCC 12's _tile_loadconfig names only 8 of them as read,
  // so the stores of rows / colsb were dropped as dead and the next tile instruction faulted.
  void load() const { asm volatile("ldtilecfg %0" : : "m"(*this)); }
};

// The tile intrinsics paste the tile number into the instruction: literals only, hence switches.
inline void zero_tile(int t) {
  switch (t) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    case 3: _tile_zero(3); break;
    case 4: _tile_zero(4); break;
    default: _tile_zero(5); break;
  }
}
inline void store_tile(int t, float* dst) {  // rows of 64 bytes
  switch (t) {
    case 0: _tile_stored(0, dst, 64); break;
    case 1: _tile_stored(1, dst, 64); break;
    case 2: _tile_stored(2, dst, 64); break;
    case 3: _tile_stored(3, dst, 64); break;
    case 4: _tile_stored(4, dst, 64); break;
    default: _tile_stored(5, dst, 64); break;
  }
}
inline void dp_a4_b5(int c) {  // C tile c += tmm4 x tmm5
  switch (c) {
    case 0: _tile_dpbf16ps(0, 4, 5); break;
    case 1: _tile_dpbf16ps(1, 4, 5); break;
    case 2: _tile_dpbf16ps(2, 4, 5); break;
    default: _tile_dpbf16ps(3, 4, 5); break;
  }
}
inline void dp_a6_b5(int c) {  // C tile c += tmm6 x tmm5
  switch (c) {
    case 0: _tile_dpbf16ps(0, 6, 5); break;
    case 1: _tile_dpbf16ps(1, 6, 5); break;
    case 2: _tile_dpbf16ps(2, 6, 5); break;
    default: _tile_dpbf16ps(3, 6, 5); break;
  }
}
inline void dp_a6_b7(int c) {  // C tile c += tmm6 x tmm7
  switch (c) {
    case 0: _tile_dpbf16ps(0, 6, 7); break;
    case 1: _tile_dpbf16ps(1, 6, 7); break;
    case 2: _tile_dpbf16ps(2, 6, 7); break;
    case 3: _tile_dpbf16ps(3, 6, 7); break;
    case 4: _tile_dpbf16ps(4, 6, 7); break;
    default: _tile_dpbf16ps(5, 6, 7); break;
  }
}

// Most heads in one head tile: QK token-major (C / B columns: 16 fp32), QK vLLM (A / C rows: 4
// per head), PV token-major (A / C rows: 2 per head), PV vLLM (C / B columns).
constexpr int kQkTokenHeads = 16, kQkVllmHeads = 4, kPvTokenHeads = 8, kPvVllmHeads = 16;

// Heads per tile: G heads in the fewest tiles of at most `most`, equal but for the last one. A
// last, smaller tile runs with the same configuration: its extra rows / columns read other heads'
// (or zero) operands and are never stored.
inline int tile_size(int G, int most) {
  const int tiles = (G + most - 1) / most;
  return (G + tiles - 1) / tiles;
}

inline int round32(int n) { return (n + 31) & ~31; }

inline __mmask32 first_lanes32(int n) {
  return n >= 32 ? 0xFFFFFFFFu : n <= 0 ? 0u : (1u << n) - 1u;
}
inline __mmask32 lanes32(int lo, int hi) { return first_lanes32(hi) & ~first_lanes32(lo); }

// K rows of 8 dims per chunk of vLLM's layout's QK (one or two A tiles of at most 16 pairs).
inline int vllm_k_rows_per_chunk(int D) { return D / 8 <= 16 ? D / 8 : D / 16; }

// The item's tile scratch (tile_scratch), as 16-float-aligned parts:
//   p      one head tile's probabilities packed for PV
//   c      four 16 x 16 fp32 C tiles stored
//   kpad   [16][32] bf16: a last K chunk of head_size % 32 dims, zero padded
//   vpad   [16][32] bf16: the same for V (token-major)
//   stage  2 x the V of a chunk partly outside the partition, zeroed outside
//   q      the query packed for QK (pack_query_token_major / pack_query_vllm), per KV head of
//          the item (last: the other parts do not depend on their count)
struct TileScratch {
  uint32_t* p;
  float* c;
  uint16_t* kpad;
  uint16_t* vpad;
  uint16_t* stage[2];
  uint32_t* q0;

  static int64_t part16(int64_t floats) { return (floats + 15) & ~int64_t{15}; }
  static int64_t q_floats(int G, int D) { return part16(int64_t{round32(D)} / 2 * (G + 16) + 16); }
  static int64_t p_floats(const TaskShape& s) { return part16(16 * int64_t{s.L} + 512); }
  static int64_t stage_floats(int D) { return 16 * int64_t{round32(D)}; }
  static int64_t floats(int G, int nh, const TaskShape& s) {
    return p_floats(s) + 1024 + 256 + 256 + 2 * stage_floats(s.D) + nh * q_floats(G, s.D);
  }
  TileScratch(float* base, int G, const TaskShape& s) : G_(G), D_(s.D) {
    float* at = base;
    p = reinterpret_cast<uint32_t*>(at), at += p_floats(s);
    c = at, at += 1024;
    kpad = reinterpret_cast<uint16_t*>(at), at += 256;
    vpad = reinterpret_cast<uint16_t*>(at), at += 256;
    stage[0] = reinterpret_cast<uint16_t*>(at), at += stage_floats(s.D);
    stage[1] = reinterpret_cast<uint16_t*>(at), at += stage_floats(s.D);
    q0 = reinterpret_cast<uint32_t*>(at);
  }
  uint32_t* q(int j) const { return q0 + j * q_floats(G_, D_); }  // KV head j's packed query

 private:
  int G_, D_;
};

// Lane i of a stored C tile's column g (rows of 16 floats): i * 16 + g.
inline __m512i column_index(int g) {
  return _mm512_add_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(16)),
      _mm512_set1_epi32(g));
}

}  // namespace PA_ISA
}  // namespace cpu
}  // namespace paged_attn
