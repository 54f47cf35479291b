// threads_per_call.h — how many OpenMP threads one CPU call wakes: one per
// min_kv_bytes_per_thread() of the K / V it reads (attention) or writes (reshape_and_cache,
// _flash), at most torch's thread count. What a thread costs depends on what idle OpenMP
// threads do between parallel regions:
//   spin   (libgomp's and LLVM libomp's default, OMP_WAIT_POLICY=active): a microsecond or two,
//          and a second thread paid from about 512 KiB (0.6-0.8x the time; 256 KiB: even);
//   sleep  (OMP_WAIT_POLICY=passive, GOMP_SPINCOUNT=0, KMP_BLOCKTIME=0): a futex wake-up and a
//          scheduler decision, 10-50 us on an idle core and a time slice on a busy one, so a
//          second thread only paid from 4-8 MiB.
// PAGED_ATTN_CPU_KV_BYTES_PER_THREAD=<bytes> sets the minimum instead (read on every call).
// docs/CPU_KERNEL.md, "Threads per call", has the measurements; scripts/bench/bench_threads.py repeats
// them on any machine.
#pragma once

#include <cstdint>
#include <string>

namespace paged_attn {
namespace cpu {

struct IdleThreadPolicy {
  bool sleep;           // idle OpenMP threads sleep (else they spin a while first)
  std::string setting;  // what decided it: "OMP_WAIT_POLICY=passive", ..., or "default"
};

// Read once from the environment, as the OpenMP runtime reads it once when it loads: the first
// of GOMP_SPINCOUNT (libgomp), KMP_BLOCKTIME (libomp) and OMP_WAIT_POLICY that is set and valid.
const IdleThreadPolicy& idle_thread_policy();

// The least K / V bytes the next call gives each of its threads: PAGED_ATTN_CPU_KV_BYTES_PER_THREAD
// when set, else 256 KiB when idle threads spin and 4 MiB when they sleep. 0 with *error set
// when the variable is not a positive integer.
int64_t min_kv_bytes_per_thread(std::string* error);

// PAGED_ATTN_CPU_KV_BYTES_PER_THREAD is set.
bool kv_bytes_per_thread_forced();

// The at::parallel_for grain for `items` that move `bytes` of K / V in all: enough items per
// thread for min_bytes each (all of them in one thread when there are no bytes).
inline int64_t items_per_thread(int64_t items, int64_t bytes, int64_t min_bytes) {
  if (bytes <= 0) return items > 1 ? items : 1;
  const int64_t grain = (items * min_bytes + bytes - 1) / bytes;
  return grain > 1 ? grain : 1;
}

}  // namespace cpu
}  // namespace paged_attn
