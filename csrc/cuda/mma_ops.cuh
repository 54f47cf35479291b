// mma_ops.cuh — the lane operations of GqaMmaWarp (gqa_mma.cuh lists them) on the GPU:
// mma.sync m16n8k16 / m16n8k8 with fp32 accumulate for fp16 / bf16, packing two floats into a
// 16-bit pair, the warp shuffles; and two cache elements as one MMA register (mma_pair). The host
// simulation (PAGED_ATTN_CUDA_HOST_SIM) runs cuda_sim::mma from the PTX ISA's fragment layouts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cache_access.cuh"  // fp8x2_to_half2_bits
#include "fast_math.cuh"

namespace paged_attn {
namespace cuda {

template <typename Scalar>
struct CudaMmaOps {
  static_assert(std::is_same<Scalar, __half>::value || std::is_same<Scalar, __nv_bfloat16>::value,
                "tensor cores take 16-bit queries");
  static constexpr bool kBf16 = std::is_same<Scalar, __nv_bfloat16>::value;

  __device__ __forceinline__ uint32_t pack(float lo, float hi) const {
    uint32_t bits;
    if constexpr (kBf16) {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
      memcpy(&bits, &v, 4);
    } else {
      const __half2 v = __floats2half2_rn(lo, hi);
      memcpy(&bits, &v, 4);
    }
    return bits;
  }
  __device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4],
                                           const uint32_t b[2]) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kBf16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)  // tests/cuda_sim: the documented fragment layouts
    cuda_sim::mma<16>(kBf16, c, a, b);
#else
    __trap();  // never launched below sm_80 (kernel_choice.h)
#endif
  }
  __device__ __forceinline__ void mma1688(float c[4], const uint32_t a[2], uint32_t b) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (kBf16) {
      asm("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5}, "
          "{%6}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(b));
    } else {
      asm("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5}, "
          "{%6}, {%0, %1, %2, %3};\n"
          : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
          : "r"(a[0]), "r"(a[1]), "r"(b));
    }
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)
    cuda_sim::mma<8>(kBf16, c, a, &b);
#else
    __trap();
#endif
  }
  __device__ __forceinline__ float shfl_xor(float v, int lane_mask) const {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);
  }
  __device__ __forceinline__ float shfl(float v, int src_lane) const {
    return __shfl_sync(0xffffffffu, v, src_lane);
  }
  __device__ __forceinline__ float exp(float x) const { return fast_exp(x); }
};

// Two fp8 cache elements, the first in the low byte of `bytes`, as one MMA register of Scalar
// pairs: one pair conversion to fp16 (exact), then to bf16 for bf16 queries (exact as well:
// every e4m3 / e5m2 value is a bf16 value).
template <typename Scalar>
__device__ __forceinline__ uint32_t mma_fp8_pair(uint32_t bytes, bool e5m2,
                                                 const CudaMmaOps<Scalar>& ops) {
  const uint32_t halves = fp8x2_to_half2_bits(bytes, e5m2);
  if constexpr (CudaMmaOps<Scalar>::kBf16) {
    __half2 h;
    memcpy(&h, &halves, 4);
    const float2 f = __half22float2(h);
    return ops.pack(f.x, f.y);
  } else {
    return halves;
  }
}

// Two cache elements as one MMA register of Scalar pairs (the first in the low half): 16-bit
// caches hold Scalar already; fp8 bytes are decoded (mma_fp8_pair).
template <typename Scalar, typename CacheT>
__device__ __forceinline__ uint32_t mma_pair(const CacheT* first, const CacheT* second,
                                             bool e5m2, const CudaMmaOps<Scalar>& ops) {
  if constexpr (std::is_same<CacheT, Scalar>::value) {
    uint16_t lo, hi;
    memcpy(&lo, first, 2);
    memcpy(&hi, second, 2);
    return lo | (static_cast<uint32_t>(hi) << 16);
  } else {
    return mma_fp8_pair(*first | (static_cast<uint32_t>(*second) << 8), e5m2, ops);
  }
}
// The same for two adjacent elements, read as one shared-memory word (`first` aligned to the
// pair's size: 4 bytes for 16-bit caches, 2 for fp8).
template <typename Scalar, typename CacheT>
__device__ __forceinline__ uint32_t mma_adjacent_pair(const CacheT* first, bool e5m2,
                                                      const CudaMmaOps<Scalar>& ops) {
  if constexpr (std::is_same<CacheT, Scalar>::value) {
    return *reinterpret_cast<const uint32_t*>(first);
  } else {
    return mma_fp8_pair(*reinterpret_cast<const uint16_t*>(first), e5m2, ops);
  }
}

}  // namespace cuda
}  // namespace paged_attn
