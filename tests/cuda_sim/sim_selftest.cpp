// sim_selftest.cpp — checks the host simulation itself (cuda_sim.h) on tiny kernels whose
// bugs the simulation claims to show, so that tests/test_cuda_host_sim.py knows a pass of the
// real kernels means something:
//   race        thread t reads what thread t - 1 wrote to shared memory with no barrier between:
//               right in thread order, wrong under CUDA_SIM_SCHEDULE=shuffle:<seed>; a data
//               race for ThreadSanitizer in either order
//   barrier     the same with __syncthreads between: right in any order, no race
//   warp_fence  the same within each warp with __syncwarp between: right, no race
//   shuffle     the same within each warp with a shuffle between: right in any order (the
//               shuffle parks every lane), a race (a shuffle is no memory fence)
//   cross_warp  a warp reads what another warp wrote after only a __syncwarp: a race
//   async       a 16-byte cp.async (the kernels' copy16_async) read before and after its
//               wait_group: poisoned (0xff) before, the source after; src-size 5 zero-fills
//   async_exit  a thread exits with a copy committed but never waited for: a simulation error
//   smem_past   a write one byte past the block's dynamic shared memory: a simulation error
//   smem_fresh  a __shared__ array written by block 0 and read by block 1 without writing it:
//               block 1 reads NaN, as a block's shared memory starts undefined on a GPU
//
// Usage: sim_selftest race|barrier|warp_fence|shuffle|cross_warp|async|async_exit|smem_past|
//                     smem_fresh
// Prints one line per check ("race: <count> wrong", "async: ok", "smem_fresh: block 1 read
// NaN") and exits 0 (built with -fsanitize=thread: ThreadSanitizer's exit code, 66, after a
// report); exits 1 when the async model misbehaves, 3 on a simulation error (the
// expected outcome of async_exit and smem_past).
#include "cuda_sim.h"  // first: the CUDA keywords the kernels use

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda/shared_memory.cuh"

using namespace paged_attn::cuda;

namespace {

// Thread t of 64 writes t to smem[t], then after `sync` reads smem[source(t)] (source(t) < 0:
// no read) and counts a wrong value (per thread, so that the count itself cannot race). Four
// blocks' worth, so a shuffled schedule shows.
int neighbour_read(const char* name, void (*sync)(), int (*source)(int)) {
  static int smem[64];
  static int wrong[64];
  std::memset(wrong, 0, sizeof wrong);
  for (int round = 0; round < 4; ++round) {
    std::memset(smem, 0xff, sizeof smem);
    cuda_sim::launch(dim3(1, 1, 1), 64, 0, [&] {
      const int t = threadIdx.x;
      smem[t] = t;
      sync();
      const int from = source(t);
      if (from >= 0 && smem[from] != from) ++wrong[t];
    });
  }
  int total = 0;
  for (const int w : wrong) total += w;
  std::printf("%s: %d wrong\n", name, total);
  return 0;
}

void nothing() {}
void block_barrier() { __syncthreads(); }
void warp_barrier() { __syncwarp(); }
void shuffle() { (void)__shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1); }
int previous_thread(int t) { return t - 1; }
int same_warp_neighbour(int t) { return t ^ 1; }
int other_warp(int t) { return (t + 32) % 64; }

int async_copy() {
  alignas(16) static unsigned char source[16], stage[32];
  static bool ok = true;
  for (int i = 0; i < 16; ++i) source[i] = static_cast<unsigned char>(i + 1);
  std::memset(stage, 0, sizeof stage);
  cuda_sim::launch(dim3(1, 1, 1), 32, 0, [] {
    if (threadIdx.x != 0) return;
    copy16_async(SharedAddress::of(stage), source, 16);
    copy16_async(SharedAddress::of(stage + 16), source, 5);
    copy_async_commit();
    for (int i = 0; i < 32; ++i) ok &= stage[i] == 0xff;  // in flight: poisoned
    copy_async_wait<0>();
    for (int i = 0; i < 16; ++i) ok &= stage[i] == source[i];
    for (int i = 0; i < 16; ++i) ok &= stage[16 + i] == (i < 5 ? source[i] : 0);
  });
  std::printf("async: %s\n", ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}

int async_exit() {
  alignas(16) static unsigned char source[16], stage[16];
  cuda_sim::launch(dim3(1, 1, 1), 32, 0, [] {
    if (threadIdx.x == 0) {
      copy16_async(SharedAddress::of(stage), source, 16);
      copy_async_commit();  // and no wait
    }
  });
  std::printf("async_exit: the simulation did not object\n");
  return 0;
}

int smem_past() {
  cuda_sim::launch(dim3(1, 1, 1), 32, 64, [] {
    PAGED_ATTN_DYNAMIC_SHARED_MEMORY(smem);
    smem[threadIdx.x * 2] = 0;  // thread 31 writes byte 62, in range
    if (threadIdx.x == 0) smem[64] = 0;
  });
  std::printf("smem_past: the simulation did not object\n");
  return 0;
}

int smem_fresh() {
  static float seen = 0;
  cuda_sim::launch(dim3(2, 1, 1), 32, 0, [] {
    __shared__ float value[4];
    if (threadIdx.x == 0 && blockIdx.x == 0) value[1] = 1.0f;
    if (threadIdx.x == 0 && blockIdx.x == 1) seen = value[1];
  });
  if (std::isnan(seen))
    std::printf("smem_fresh: block 1 read NaN\n");
  else
    std::printf("smem_fresh: block 1 read %g\n", double(seen));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "race") return neighbour_read("race", nothing, previous_thread);
  if (what == "barrier") return neighbour_read("barrier", block_barrier, previous_thread);
  if (what == "warp_fence") return neighbour_read("warp_fence", warp_barrier, same_warp_neighbour);
  if (what == "shuffle") return neighbour_read("shuffle", shuffle, same_warp_neighbour);
  if (what == "cross_warp") return neighbour_read("cross_warp", warp_barrier, other_warp);
  if (what == "async") return async_copy();
  if (what == "async_exit") return async_exit();
  if (what == "smem_past") return smem_past();
  if (what == "smem_fresh") return smem_fresh();
  std::fprintf(stderr,
               "usage: sim_selftest race|barrier|warp_fence|shuffle|cross_warp|async|async_exit|"
               "smem_past|smem_fresh\n");
  return 2;
}
