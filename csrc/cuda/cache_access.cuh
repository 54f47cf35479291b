// cache_access.cuh — element conversions and vector loads for the CUDA kernels.
//
// Scalar types: float, __half, __nv_bfloat16 (query / out / tmp_out and "auto" caches).
// fp8 caches are uint8_t bytes; the functions take the format (e4m3fn or e5m2) as a bool that
// the kernels pass as a compile-time constant.
// fp8 decode is exact (every fp8 value is a half): e5m2 is the top byte of a half; e4m3fn goes
// through cuda_fp8.h's fp8 -> half conversion (a hardware cvt on sm_89+), bit-identical to
// torch's float8_e4m3fn -> float (and to csrc/core/fp8.h's decode). Encode (reshape_and_cache)
// is csrc/core/fp8.h: round-to-nearest-even saturated to the finite range, as
// reference.encode_cache (clamp, then convert).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../core/fp8.h"
#include "../core/params.h"

namespace paged_attn {
namespace cuda {

// Cache element type: the query's scalar type for "auto", bytes for fp8.
template <typename Scalar, CacheKind kCache>
struct CacheElement {
  using type = typename std::conditional<kCache == CacheKind::kAuto, Scalar, uint8_t>::type;
};

// The query's scalar type of a ScalarKind.
template <ScalarKind kScalar>
struct ScalarOf;
template <>
struct ScalarOf<ScalarKind::kFloat32> { using type = float; };
template <>
struct ScalarOf<ScalarKind::kFloat16> { using type = __half; };
template <>
struct ScalarOf<ScalarKind::kBFloat16> { using type = __nv_bfloat16; };

// ---- scalar <-> float ----
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// ---- fp8 ----
__device__ __forceinline__ float fp8_to_float(uint32_t byte, bool e5m2) {
  if (e5m2) return __half2float(__ushort_as_half(static_cast<unsigned short>(byte << 8)));
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(byte), __NV_E4M3);
  return __half2float(__half(h));
}

// Encode with csrc/core/fp8.h (the project's one definition, shared with the CPU kernels and
// checked bit for bit against torch): saturating round-to-nearest-even, NaN kept.
__device__ __forceinline__ uint8_t float_to_fp8(float v, bool e5m2) {
  return e5m2 ? fp8::float_to_e5m2(v) : fp8::float_to_e4m3(v);
}

// Two fp8 bytes, the first in the low byte of `bytes`, as the bits of two halves (the first in
// the low half; exact: every e4m3 / e5m2 value is an fp16 value). e5m2 is fp16's top byte.
__device__ __forceinline__ uint32_t fp8x2_to_half2_bits(uint32_t bytes, bool e5m2) {
  if (e5m2) return ((bytes & 0xffu) << 8) | ((bytes & 0xff00u) << 16);
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(bytes & 0xffffu), __NV_E4M3);
  return h.x | (static_cast<uint32_t>(h.y) << 16);
}

// Four fp8 bytes of one 32-bit word -> out[0..3] (little-endian: byte 0 first).
__device__ __forceinline__ void fp8x4_to_float(uint32_t w, bool e5m2, float* out) {
  const uint32_t lo_bits = fp8x2_to_half2_bits(w, e5m2);
  const uint32_t hi_bits = fp8x2_to_half2_bits(w >> 16, e5m2);
  __half2 lo, hi;
  memcpy(&lo, &lo_bits, 4);
  memcpy(&hi, &hi_bits, 4);
  const float2 a = __half22float2(lo);
  const float2 b = __half22float2(hi);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// ---- one 32-bit word of elements -> floats ----
__device__ __forceinline__ void half_word_to_float(uint32_t w, float* out) {
  out[0] = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  out[1] = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}
__device__ __forceinline__ void bf16_word_to_float(uint32_t w, float* out) {
  out[0] = __uint_as_float(w << 16);  // bf16 is the top half of a float: exact
  out[1] = __uint_as_float(w & 0xffff0000u);
}

// Elements of cache type CacheT per 32-bit word.
template <typename CacheT>
constexpr int kPerWord = 4 / static_cast<int>(sizeof(CacheT));

template <typename CacheT>
__device__ __forceinline__ void word_to_floats(uint32_t w, bool e5m2, float* out) {
  if constexpr (sizeof(CacheT) == 4) {
    out[0] = __uint_as_float(w);
  } else if constexpr (sizeof(CacheT) == 1) {
    fp8x4_to_float(w, e5m2, out);
  } else if constexpr (std::is_same<CacheT, __half>::value) {
    half_word_to_float(w, out);
  } else {
    bf16_word_to_float(w, out);
  }
}

// Loads kBytes (4, 8 or 16) of CacheT elements from `ptr` (kBytes-aligned) and converts them:
// out[0 .. kBytes / sizeof(CacheT)). fp8 values are the decoded bytes (scale applied by caller).
template <typename CacheT, int kBytes>
__device__ __forceinline__ void load_to_float(const CacheT* ptr, bool e5m2, float* out) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "vector loads are 4, 8 or 16 bytes");
  constexpr int kPer = kPerWord<CacheT>;
  if constexpr (kBytes == 4) {
    word_to_floats<CacheT>(*reinterpret_cast<const uint32_t*>(ptr), e5m2, out);
  } else if constexpr (kBytes == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(ptr);
    word_to_floats<CacheT>(r.x, e5m2, out + 0 * kPer);
    word_to_floats<CacheT>(r.y, e5m2, out + 1 * kPer);
    word_to_floats<CacheT>(r.z, e5m2, out + 2 * kPer);
    word_to_floats<CacheT>(r.w, e5m2, out + 3 * kPer);
  } else {
    const uint2 r = *reinterpret_cast<const uint2*>(ptr);
    word_to_floats<CacheT>(r.x, e5m2, out + 0 * kPer);
    word_to_floats<CacheT>(r.y, e5m2, out + 1 * kPer);
  }
}

// One cache element -> float (fp8: decoded byte, scale applied by the caller).
template <typename CacheT>
__device__ __forceinline__ float load_one(const CacheT* ptr, bool e5m2) {
  if constexpr (sizeof(CacheT) == 1) {
    return fp8_to_float(*ptr, e5m2);
  } else {
    return to_float(*ptr);
  }
}

// float -> one cache element; fp8: fp8(v / scale) saturated, else a plain rounding.
template <typename CacheT>
__device__ __forceinline__ CacheT store_cast(float v, float scale, bool e5m2) {
  if constexpr (sizeof(CacheT) == 1) {
    return float_to_fp8(v / scale, e5m2);
  } else {
    return from_float<CacheT>(v);
  }
}

}  // namespace cuda
}  // namespace paged_attn
