// cuda_sim.h — just enough of CUDA to run the project's kernels (csrc/cuda/*.cuh) on the host, for
// tests/test_cuda_host_sim.py: every thread of a block is a fiber (ucontext) on one OS thread,
// scheduled round-robin; a barrier (__syncthreads, __syncwarp, every shuffle) parks a fiber until
// its whole block / warp has arrived. Blocks run one after the other. Deterministic: the fibers
// run in thread order, or with CUDA_SIM_SCHEDULE=shuffle:<seed> in an order drawn afresh (from
// the seed) at every round, so that code relying on one order between barriers can show.
//
// What it proves: the kernels' indexing, their per-lane / per-warp / per-block logic and the
// order of their barriers (a barrier some threads skip deadlocks here and is reported). What it
// does not: the rest of the hardware: memory is sequentially consistent, mma.sync and ldmatrix
// are mma_layout.h's reading of the PTX ISA, timing is meaningless.
//
// cp.async is modelled in flight (copy16_async / copy_async_commit / copy_async_wait below): a
// copy reads its source when issued but lands in shared memory only when the issuing thread's
// cp.async.wait_group retires its group; from the issue until then its 16 destination bytes hold
// 0xff (NaN in every element type the kernels read). So a read before the wait (a missing or
// short wait), a read of a slot's previous contents after some lane issued a copy into it (a
// missing barrier before the reuse) and a copy never waited for before the thread exits all show.
//
// Built with -fsanitize=thread, the simulation is also a race check: it tells ThreadSanitizer
// what orders what on a GPU (the `race` namespace below): each simulated thread is a
// TSan fiber, switched to with no implied ordering; __syncthreads and __syncwarp order their
// members' memory accesses (a release on arrival, an acquire on leaving); shuffles, mma.sync and
// ldmatrix exchange values but order nothing (no memory fence on the hardware either); a block
// starts after everything the host did before the launch and the host continues after every
// thread of every block. TSan then reports two threads' conflicting accesses to the same byte
// with no barrier between, in whatever order the schedule happened to run them: the race a
// shuffled schedule shows only when it draws the wrong order. Within a block only: the blocks of
// a launch run one after another, each after the host saw the last one finish, so two blocks
// writing one byte are not reported.
//
// Include this before any kernel header, with PAGED_ATTN_CUDA_HOST_SIM defined (the kernels'
// two hooks: dynamic shared memory and mma.sync / ldmatrix).
#pragma once

#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <deque>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <vector_types.h>

#include "mma_layout.h"

#if defined(__SANITIZE_THREAD__)  // GCC's -fsanitize=thread (the simulation is built by GCC)
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);  // TSan's runtime: stop /
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);    // resume recording accesses
#endif

// What ThreadSanitizer is told (see the top); empty functions in a build without it.
namespace cuda_sim::race {
#if defined(__SANITIZE_THREAD__)
inline void* new_fiber() { return __tsan_create_fiber(0); }
// What its reports call a fiber: the simulated thread and its block.
inline void name_fiber(void* fiber, unsigned x, unsigned y, unsigned z, int thread) {
  char name[64];
  std::snprintf(name, sizeof name, "block (%u,%u,%u) thread %d", x, y, z, thread);
  __tsan_set_fiber_name(fiber, name);
}
inline void* host_fiber() { return __tsan_get_current_fiber(); }
// Right before switching stacks to `fiber`; `ordered`: everything so far happens before it.
// Not instrumented: TSan would count its entry on one fiber and its exit on the other.
__attribute__((no_sanitize("thread"))) inline void switch_to(void* fiber, bool ordered) {
  __tsan_switch_to_fiber(fiber, ordered ? 0 : __tsan_switch_to_fiber_no_sync);
}
inline void release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }
inline void acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }
// The simulation's own bookkeeping (barrier counts, values published for a shuffle) is shared
// by the fibers without the ordering TSan would need: not recorded between these two.
inline void unchecked_begin() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
inline void unchecked_end() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
#else
inline void* new_fiber() { return nullptr; }
inline void name_fiber(void*, unsigned, unsigned, unsigned, int) {}
inline void* host_fiber() { return nullptr; }
inline void switch_to(void*, bool) {}
inline void release(const void*) {}
inline void acquire(const void*) {}
inline void unchecked_begin() {}
inline void unchecked_end() {}
#endif
}  // namespace cuda_sim::race

// ---- CUDA keywords and intrinsics as host C++ (after the CUDA headers, which define some) ----
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one at a time: one object per kernel instantiation, all of them in one section,
// which launch() fills with 0xff (NaN) before every block, as a block's shared memory starts
// undefined on the GPU (a read of what the block did not write shows).
#define __shared__ static __attribute__((section("cuda_sim_shared"), used))
extern "C" unsigned char __start_cuda_sim_shared[] __attribute__((weak));  // the linker's
extern "C" unsigned char __stop_cuda_sim_shared[] __attribute__((weak));   // (none: null)

namespace cuda_sim {

// One cp.async of 16 bytes in flight: where it lands and what (read from the source at issue).
struct AsyncCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

// A fiber starts on its own stack through makecontext / swapcontext (once); after that the
// switches are _setjmp / _longjmp, which save no signal mask (swapcontext makes two system calls
// per switch, which dominated the run time).
struct Fiber {
  ucontext_t context;
  jmp_buf resume;
  bool started = false;
  bool done = false;
  uint64_t waiting_for = 0;  // the barrier generation this fiber waits to pass; 0: runnable
  int barrier = -1;          // the barrier it waits at (0..warps-1: its warp, warps: the block)
  std::vector<AsyncCopy> uncommitted;          // issued since the last commit_group
  std::deque<std::vector<AsyncCopy>> groups;  // committed, not yet retired by a wait, oldest first
};

// Guard bytes on both sides of a block's dynamic shared memory (0xff, as the memory itself
// starts): a read there gives NaN, a write there fails the launch. A multiple of 16, so the
// memory stays as aligned as the allocation (cp.async and ldmatrix want 16 bytes).
constexpr size_t kSmemGuard = 256;

struct Block {
  std::vector<Fiber> fibers;
  int threads = 0, warps = 0;
  std::vector<int> arrived;         // per barrier: fibers arrived in this generation
  std::vector<uint64_t> generation; // per barrier: passed generations + 1
  std::vector<uint64_t> slots;      // per thread: the value published for an exchange
  std::vector<unsigned char> dynamic_smem;  // kSmemGuard bytes, the block's, kSmemGuard bytes
  // race:: sync objects (only their addresses matter): per barrier, one per generation parity
  // (a fast thread's arrival at the next generation must not order a slow one's leaving of
  // this one); and the one every thread releases when it exits
  std::vector<char> barrier_sync;
  char exit_sync = 0;
  void* host_race_fiber = nullptr;
  ucontext_t scheduler;
  jmp_buf scheduler_resume;
  int current = 0;
};

inline Block*& block() {
  static Block* b = nullptr;
  return b;
}

}  // namespace cuda_sim

// the CUDA built-in variables, per fiber: set by the scheduler before it resumes a fiber
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace cuda_sim {

constexpr int kWarp = 32;

inline int thread_rank() { return block()->current; }

// Parks the current fiber at barrier `id` until `members` fibers arrived there. A barrier that
// `orders` memory (__syncthreads, __syncwarp) tells the race model so; the simulation's internal
// ones (shuffles, mma.sync, ldmatrix) do not.
inline void barrier(int id, int members, bool orders = true) {
  Block& b = *block();
  race::unchecked_begin();
  Fiber& me = b.fibers[b.current];
  const uint64_t gen = b.generation[id];
  const void* sync = &b.barrier_sync[2 * id + gen % 2];
  const bool last = ++b.arrived[id] == members;
  if (last) {  // the last one releases everyone
    b.arrived[id] = 0;
    ++b.generation[id];
  } else {
    me.waiting_for = gen + 1;
    me.barrier = id;
  }
  race::unchecked_end();
  if (orders) race::release(sync);
  if (!last && _setjmp(me.resume) == 0) {  // back here once released
    race::switch_to(b.host_race_fiber, false);
    _longjmp(b.scheduler_resume, 1);
  }
  if (orders) race::acquire(sync);
}

// The tests' check that the race model sees the kernels' barriers: CUDA_SIM_UNORDERED=syncwarp
// (or syncthreads) makes every __syncwarp (__syncthreads, __syncthreads_or) still park its
// threads as before (the same values) but order nothing, as if it were missing on a GPU.
enum class Barrier { kSyncwarp, kSyncthreads };
inline bool barriers_order(Barrier which) {
  static const int unordered = [] {  // the Barrier named by CUDA_SIM_UNORDERED, or -1
    const char* v = std::getenv("CUDA_SIM_UNORDERED");
    if (v == nullptr || v[0] == '\0') return -1;
    if (std::strcmp(v, "syncwarp") == 0) return static_cast<int>(Barrier::kSyncwarp);
    if (std::strcmp(v, "syncthreads") == 0) return static_cast<int>(Barrier::kSyncthreads);
    std::fprintf(stderr, "cuda_sim: CUDA_SIM_UNORDERED=%s: want syncwarp or syncthreads\n", v);
    std::fflush(nullptr);
    std::_Exit(2);  // first read in a thread: not exit() (see fail())
  }();
  return unordered != static_cast<int>(which);
}

inline void sync_warp(bool orders = true) { barrier(thread_rank() / kWarp, kWarp, orders); }
inline void sync_block() {
  barrier(block()->warps, block()->threads, barriers_order(Barrier::kSyncthreads));
}

template <typename T>
T exchange(T mine, int src_thread) {
  static_assert(sizeof(T) <= 8, "shuffles move up to 8 bytes");
  Block& b = *block();
  uint64_t slot = 0;
  std::memcpy(&slot, &mine, sizeof(T));
  race::unchecked_begin();
  b.slots[thread_rank()] = slot;
  race::unchecked_end();
  sync_warp(false);
  T other;
  race::unchecked_begin();
  std::memcpy(&other, &b.slots[src_thread], sizeof(T));
  race::unchecked_end();
  sync_warp(false);
  return other;
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda_sim: %s (block %u,%u,%u thread %u)\n", what, blockIdx.x, blockIdx.y,
               blockIdx.z, threadIdx.x);
  std::fflush(nullptr);
  std::_Exit(3);  // not exit(): from a fiber, the static destructors would free its own stack
}

// CUDA_SIM_SCHEDULE=shuffle:<seed> (seed != 0): the seed of the fibers' order; 0: thread order.
inline uint32_t schedule_seed() {
  static const uint32_t seed = [] {
    const char* v = std::getenv("CUDA_SIM_SCHEDULE");
    if (v == nullptr || v[0] == '\0') return 0u;
    const unsigned long n =
        std::strncmp(v, "shuffle:", 8) == 0 ? std::strtoul(v + 8, nullptr, 10) : 0;
    if (n == 0 || n > 0xffffffffu) {
      std::fprintf(stderr, "cuda_sim: CUDA_SIM_SCHEDULE=%s: want shuffle:<seed>, seed 1..2^32-1\n",
                   v);
      std::exit(2);
    }
    return static_cast<uint32_t>(n);
  }();
  return seed;
}

inline const std::function<void()>*& kernel_body() {  // the kernel launch() runs
  static const std::function<void()>* kernel = nullptr;
  return kernel;
}

// A simulated thread's whole life: the kernel, then back to the scheduler for good. Its frame is
// never returned from (the way back is a _longjmp), so ThreadSanitizer must not count its entry:
// not instrumented (which also leaves its reads of the scheduler's state unrecorded).
__attribute__((no_sanitize("thread"))) inline void thread_main() {
  (*kernel_body())();
  Block& b = *block();
  Fiber& me = b.fibers[b.current];
  if (!me.uncommitted.empty() || !me.groups.empty())
    fail("thread exited with cp.async copies never waited for");
  me.done = true;
  race::release(&b.exit_sync);  // after this thread's last access
  race::switch_to(b.host_race_fiber, false);
  _longjmp(b.scheduler_resume, 1);
}

// Runs kernel() for every block of `grid` with `threads` threads each (1-D blocks), `smem`
// bytes of dynamic shared memory (NaN-filled bytes: 0xff, so a read of what no thread wrote
// shows; guarded on both sides, kSmemGuard). Exits with a message on a deadlock (fibers waiting
// at barriers none can release).
inline void launch(dim3 grid, int threads, size_t smem, const std::function<void()>& kernel) {
  constexpr size_t kStack = 256 * 1024;
  static std::vector<std::unique_ptr<char[]>> stacks;  // reused by every block: touched once
  static std::vector<void*> race_fibers;               // reused too: each is costly to make
  while (stacks.size() < static_cast<size_t>(threads)) stacks.emplace_back(new char[kStack]);
  while (race_fibers.size() < static_cast<size_t>(threads))
    race_fibers.push_back(race::new_fiber());
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        Block b;
        b.threads = threads;
        b.warps = (threads + kWarp - 1) / kWarp;
        b.fibers.resize(threads);
        b.arrived.assign(b.warps + 1, 0);
        b.generation.assign(b.warps + 1, 1);
        b.slots.assign(threads, 0);
        b.dynamic_smem.assign(smem + 2 * kSmemGuard, 0xff);
        b.barrier_sync.assign(2 * (b.warps + 1), 0);
        b.host_race_fiber = race::host_fiber();
        if (__start_cuda_sim_shared != nullptr)
          std::memset(__start_cuda_sim_shared, 0xff,
                      static_cast<size_t>(__stop_cuda_sim_shared - __start_cuda_sim_shared));
        block() = &b;
        kernel_body() = &kernel;
        for (int t = 0; t < threads; ++t) {
          Fiber& f = b.fibers[t];
          getcontext(&f.context);
          f.context.uc_stack.ss_sp = stacks[t].get();
          f.context.uc_stack.ss_size = kStack;
          f.context.uc_link = &b.scheduler;
          race::name_fiber(race_fibers[t], x, y, z, t);
          makecontext(&f.context, thread_main, 0);
        }
        blockIdx = dim3(x, y, z);
        blockDim = dim3(threads, 1, 1);
        gridDim = grid;
        std::vector<int> order(threads);
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 shuffle(schedule_seed() ^ (x + 7919u * (y + 7919u * z)));
        race::unchecked_begin();  // the scheduler reads the fibers' state, orders nothing
        for (;;) {
          bool all_done = true, progressed = false;
          if (schedule_seed() != 0) std::shuffle(order.begin(), order.end(), shuffle);
          for (const int t : order) {
            Fiber& f = b.fibers[t];
            if (f.done) continue;
            all_done = false;
            if (f.waiting_for != 0 && b.generation[f.barrier] < f.waiting_for) continue;
            f.waiting_for = 0;
            b.current = t;
            threadIdx = dim3(t, 0, 0);
            progressed = true;
            if (_setjmp(b.scheduler_resume) == 0) {
              // a thread starts after what the host did before the launch (the scheduler
              // itself acquires nothing from the threads until they all exited)
              race::switch_to(race_fibers[t], !f.started);
              if (!f.started) {
                f.started = true;
                swapcontext(&b.scheduler, &f.context);
              } else {
                _longjmp(f.resume, 1);
              }
            }
          }
          if (all_done) break;
          if (!progressed) fail("deadlock: every live thread waits at a barrier");
        }
        race::unchecked_end();
        race::acquire(&b.exit_sync);  // the host goes on after every thread of the block
        for (size_t i = 0; i < kSmemGuard; ++i)
          if (b.dynamic_smem[i] != 0xff || b.dynamic_smem[kSmemGuard + smem + i] != 0xff)
            fail("a write outside the block's dynamic shared memory");
        block() = nullptr;
      }
}

inline unsigned char* dynamic_shared_memory() {
  return block()->dynamic_smem.data() + kSmemGuard;
}

// cp.async.cg ... 16, src_bytes: the first src_bytes of `src` read now, the rest zero; the
// destination poisoned until the copy's group is retired (see the top).
inline void copy16_async(unsigned char* dst, const void* src, int src_bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0)
    fail("cp.async of 16 bytes with an address not 16-byte aligned");
  if (src_bytes < 0 || src_bytes > 16) fail("cp.async src-size outside 0..16");
  AsyncCopy copy{dst, {}};
  std::memcpy(copy.bytes, src, static_cast<size_t>(src_bytes));
  block()->fibers[thread_rank()].uncommitted.push_back(copy);
  std::memset(dst, 0xff, 16);
}

// cp.async.commit_group: this thread's copies since the last commit become one group (maybe empty).
inline void copy_async_commit() {
  Fiber& me = block()->fibers[thread_rank()];
  me.groups.push_back(std::move(me.uncommitted));
  me.uncommitted.clear();
}

// The tests' check that this model can fail: CUDA_SIM_WAIT_ONE_SHORT=1 makes every wait that
// leaves groups in flight leave one more, as a pipeline whose wait count is off by one would
// (the final wait_group 0 stays exact, so the failure shows as data read before it landed).
inline int wait_slack(int pending) {
  static const bool one_short = [] {
    const char* v = std::getenv("CUDA_SIM_WAIT_ONE_SHORT");
    return v != nullptr && v[0] == '1';
  }();
  return one_short && pending > 0 ? 1 : 0;
}

// cp.async.wait_group pending: lands this thread's oldest groups until at most `pending` remain
// (copies not yet committed are not waited for, as on the hardware).
inline void copy_async_wait(int pending) {
  Fiber& me = block()->fibers[thread_rank()];
  while (me.groups.size() > static_cast<size_t>(pending + wait_slack(pending))) {
    for (const AsyncCopy& copy : me.groups.front()) std::memcpy(copy.dst, copy.bytes, 16);
    me.groups.pop_front();
  }
}

// mma.sync on the host: every lane publishes its fragments, then computes its own accumulator
// elements from all of them by the documented layouts (mma_layout.h).

template <int kK>
void mma(bool bf16, float c[4], const uint32_t* a, const uint32_t* b) {
  static uint32_t all_a[kWarp * 4][kK / 4], all_b[kWarp * 4][kK / 8];  // per thread of the block
  const int rank = thread_rank(), lane = rank % kWarp, warp0 = rank - lane;
  if (rank >= kWarp * 4) fail("mma.sync in a block of more than 128 threads");
  race::unchecked_begin();  // registers, published through the simulation's memory
  std::memcpy(all_a[rank], a, sizeof(all_a[0]));
  std::memcpy(all_b[rank], b, sizeof(all_b[0]));
  race::unchecked_end();
  sync_warp(false);
  race::unchecked_begin();
  mma_layout::mma<kK>(all_a + warp0, all_b + warp0, lane, c,
                      bf16 ? mma_layout::decode_bf16 : mma_layout::decode_f16);
  race::unchecked_end();
  sync_warp(false);
}

// ldmatrix .x4 on the host: every lane publishes its row address (16-byte aligned), then takes
// its register of each matrix j (rows from lanes 8j..8j+7) by mma_layout::ldmatrix_register.
inline void ldmatrix_x4(bool trans, uint32_t r[4], const void* row) {
  static const void* rows[kWarp * 4];  // per thread of the block
  const int rank = thread_rank(), lane = rank % kWarp, warp0 = rank - lane;
  if (rank >= kWarp * 4) fail("ldmatrix in a block of more than 128 threads");
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0) fail("ldmatrix row address not 16-byte aligned");
  race::unchecked_begin();  // the row addresses are registers: unchecked; the rows are not
  rows[rank] = row;
  race::unchecked_end();
  sync_warp(false);
  const void* warp_rows[kWarp];
  race::unchecked_begin();
  std::memcpy(warp_rows, rows + warp0, sizeof warp_rows);
  race::unchecked_end();
  for (int j = 0; j < 4; ++j) r[j] = mma_layout::ldmatrix_register(warp_rows + 8 * j, lane, trans);
  sync_warp(false);
}

}  // namespace cuda_sim

inline void __syncthreads() { cuda_sim::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  cuda_sim::sync_warp(cuda_sim::barriers_order(cuda_sim::Barrier::kSyncwarp));
}
inline int __syncthreads_or(int predicate) {
  cuda_sim::Block& b = *cuda_sim::block();
  cuda_sim::race::unchecked_begin();
  b.slots[cuda_sim::thread_rank()] = predicate != 0;
  cuda_sim::race::unchecked_end();
  cuda_sim::sync_block();
  int any = 0;
  cuda_sim::race::unchecked_begin();
  for (int t = 0; t < b.threads; ++t) any |= static_cast<int>(b.slots[t]);
  cuda_sim::race::unchecked_end();
  cuda_sim::sync_block();
  return any;
}
template <typename T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  if (mask != 0xffffffffu) cuda_sim::fail("partial shuffle masks are not simulated");
  const int rank = cuda_sim::thread_rank(), lane = rank % 32;
  return cuda_sim::exchange(v, rank - lane + (lane / width) * width + src_lane % width);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  if (mask != 0xffffffffu) cuda_sim::fail("partial shuffle masks are not simulated");
  const int rank = cuda_sim::thread_rank(), lane = rank % 32;
  const int src = lane ^ lane_mask;
  return cuda_sim::exchange(v, rank - lane + ((src / width == lane / width) ? src : lane));
}
[[noreturn]] inline void __trap() { cuda_sim::fail("__trap()"); }
// the device library's overloads the kernels call unqualified
using std::isnan;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}

#define PAGED_ATTN_DYNAMIC_SHARED_MEMORY(name) \
  unsigned char* const name = cuda_sim::dynamic_shared_memory()
