// mma_layout.h — what mma.sync m16n8k16 / m16n8k8 (16-bit A and B, fp32 C / D) compute, from the
// fragments every lane of a warp holds, by the PTX ISA's fragment layouts ("Matrix Fragments for
// mma.m16n8k16 / mma.m16n8k8 with floating point type"): the one place the host simulations
// (tests/test_gqa_mma_host.py, tests/cuda_sim) state them. For lane l, g = l / 4, t = l % 4; a
// 32-bit register holds two 16-bit elements, the first in its low half.
//   m16n8k16 A (16 x 16), 4 registers, element i = 0..7: row g (i < 2 or 4 <= i < 6) else g + 8,
//                         col 2t + (i & 1) (+ 8 for i >= 4)
//   m16n8k16 B (16 x 8),  2 registers, element i = 0..3: row 2t + (i & 1) (+ 8 for i >= 2), col g
//   m16n8k8  A (16 x 8),  2 registers, element i = 0..3: row g (+ 8 for i >= 2), col 2t + (i & 1)
//   m16n8k8  B (8 x 8),   1 register,  element i = 0..1: row 2t + i, col g
//   C / D (16 x 8), 4 floats, element i: row g (+ 8 for i >= 2), col 2t + (i & 1)
#pragma once

#include <cstdint>
#include <cstring>

namespace mma_layout {

// ldmatrix .m8n8 .b16 ("Warp-level matrix load instruction: ldmatrix"): of the 8 x 8 matrix of
// 16-bit elements whose row r starts at rows[r], lane l holds row l / 4, elements 2 (l % 4) and
// 2 (l % 4) + 1, the first in the low half; .trans: the same of the transposed matrix, i.e.
// elements [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4].
inline uint32_t ldmatrix_register(const void* const* rows, int lane, bool trans) {
  auto at = [&](int r, int c) {
    uint16_t v;
    std::memcpy(&v, static_cast<const unsigned char*>(rows[r]) + 2 * c, 2);
    return static_cast<uint32_t>(v);
  };
  const int g = lane / 4, t = lane % 4;
  const uint32_t lo = trans ? at(2 * t, g) : at(g, 2 * t);
  const uint32_t hi = trans ? at(2 * t + 1, g) : at(g, 2 * t + 1);
  return lo | (hi << 16);
}

// Decode: the float of a 16-bit element (bf16 or fp16 bits).
using Decode = float (*)(uint16_t);

inline float decode_bf16(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float decode_f16(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

inline float element(const uint32_t* regs, int i, Decode decode) {
  const uint32_t r = regs[i / 2];
  return decode(static_cast<uint16_t>(i % 2 == 0 ? r & 0xffffu : r >> 16));
}

// c[lane] += A . B for lane `lane`, from every lane's fragments: a[l] (kA registers each), b[l]
// (kB registers). kK = 16: m16n8k16 (kA 4, kB 2); kK = 8: m16n8k8 (kA 2, kB 1).
template <int kK>
void mma(const uint32_t (*a)[kK / 4], const uint32_t (*b)[kK / 8], int lane, float c[4],
         Decode decode) {
  float A[16][kK], B[kK][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < kK / 2; ++i) {  // A: kK / 2 elements per lane
      const int row = kK == 16 ? ((i < 2 || (i >= 4 && i < 6)) ? g : g + 8) : (i < 2 ? g : g + 8);
      const int col = 2 * t + (i & 1) + (kK == 16 && i >= 4 ? 8 : 0);
      A[row][col] = element(a[l], i, decode);
    }
    for (int i = 0; i < kK / 4; ++i) {  // B: kK / 4 elements per lane
      const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0);
      B[row][g] = element(b[l], i, decode);
    }
  }
  for (int i = 0; i < 4; ++i) {
    const int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
    double sum = c[i];
    for (int k = 0; k < kK; ++k) sum += static_cast<double>(A[row][k]) * B[k][col];
    c[i] = static_cast<float>(sum);
  }
}

}  // namespace mma_layout
