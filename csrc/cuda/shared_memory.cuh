// shared_memory.cuh — the PTX of the pipelined kernel's shared-memory traffic: cp.async
// (global -> shared, 16 bytes, zero-fill past src-size) with its commit / wait, ldmatrix.x4
// (shared -> the registers of mma.sync fragments), and the shared-window address both take.
// sm_80+ issue the instructions; older archs get a synchronous copy (cp.async) or never reach
// the code (ldmatrix: the tensor-core path needs sm_80, kernel_choice.h); the host simulation
// (tests/cuda_sim, PAGED_ATTN_CUDA_HOST_SIM) has its own cp.async (copies in flight until their
// group is waited for) and ldmatrix.
#pragma once

#include <cstdint>

namespace paged_attn {
namespace cuda {

// A position in shared memory for the copies and ldmatrix: on sm_80+ its 32-bit shared-window
// address, converted from the generic pointer once (an instruction's address is then a register
// plus an immediate), elsewhere the generic pointer.
struct SharedAddress {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t addr;
  __device__ __forceinline__ static SharedAddress of(void* p) {
    return SharedAddress{static_cast<uint32_t>(__cvta_generic_to_shared(p))};
  }
  __device__ __forceinline__ SharedAddress operator+(int bytes) const {
    return SharedAddress{addr + static_cast<uint32_t>(bytes)};
  }
#else
  unsigned char* ptr;
  __device__ __forceinline__ static SharedAddress of(void* p) {
    return SharedAddress{static_cast<unsigned char*>(p)};
  }
  __device__ __forceinline__ SharedAddress operator+(int bytes) const {
    return SharedAddress{ptr + bytes};
  }
#endif
};

// Copies 16 bytes from global `src` to shared `dst` (both 16-byte aligned); only the first
// src_bytes (0..16) are read, the rest of the 16 are zero-filled.
__device__ __forceinline__ void copy16_async(SharedAddress dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst.addr), "l"(src),
               "r"(src_bytes));
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)
  cuda_sim::copy16_async(dst.ptr, src, src_bytes);
#else
  uint4 value = make_uint4(0u, 0u, 0u, 0u);
  if (src_bytes == 16) {
    value = *static_cast<const uint4*>(src);
  } else if (src_bytes > 0) {
    unsigned char* bytes = reinterpret_cast<unsigned char*>(&value);
    for (int i = 0; i < src_bytes; ++i) bytes[i] = static_cast<const unsigned char*>(src)[i];
  }
  *reinterpret_cast<uint4*>(dst.ptr) = value;
#endif
}

// ldmatrix .m8n8 .x4 .b16 (sm_80+ here): four 8 x 8 matrices of 16-bit elements from shared
// memory, lane l giving the address of row l % 8 of matrix l / 8 (16-byte aligned); r[j] of lane
// l gets row l / 4, elements 2 (l % 4) and 2 (l % 4) + 1 of matrix j, the first in the low half
// (kTrans: of the transposed matrix, i.e. elements [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4]).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], SharedAddress row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row.addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row.addr)
                 : "memory");
  }
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)  // tests/cuda_sim: the documented fragment layout
  cuda_sim::ldmatrix_x4(kTrans, r, row.ptr);
#else
  __trap();  // never launched below sm_80 (kernel_choice.h)
#endif
}

__device__ __forceinline__ void copy_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)
  cuda_sim::copy_async_commit();
#endif
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
#elif defined(PAGED_ATTN_CUDA_HOST_SIM)
  cuda_sim::copy_async_wait(kPending);
#endif
}

}  // namespace cuda
}  // namespace paged_attn
