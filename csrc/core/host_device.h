// host_device.h — the qualifiers of the framework-free helpers that both the CUDA kernels and the
// host code (CPU kernel, host tests, the host simulation of the GPU) compile.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define PA_HOST_DEVICE __host__ __device__ __forceinline__
#define PA_UNROLL _Pragma("unroll")
#else
#define PA_HOST_DEVICE inline
#define PA_UNROLL _Pragma("GCC unroll 8")
#endif
