"""Timing one callable: warm-up, then N timed calls with the caches made cold before each one,
summarised by the median (and the spread, to judge the noise).

CPU: the last-level cache is flushed before every call by reading a buffer twice its size (so K
and V come from DRAM, as in a real decode step where the rest of the model ran in between), and
each call is timed with perf_counter (or another clock: process_time gives CPU time, steadier on
a shared machine for single-threaded compute in cache, with no_flush). CUDA: L2 flushed the same
way, each call's GPU work timed with a pair of CUDA events, the host's part of the call kept out
of the interval (cuda_timing.py), and the host's time for the call kept beside it. NOTE: the
flush READS: writing would leave the cache full of dirty lines whose write-back would then be
charged to the timed call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .cuda_timing import GpuCallTimer, TorchCudaGpu


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    reps: int
    host_median_ms: Optional[float] = None  # CUDA: the host's time in the call (median)
    gpu_caught_up: int = 0  # CUDA: timed calls whose interval holds host time (cuda_timing.py)
    head_start_ms: Optional[float] = None  # CUDA: the GPU's head start the timing settled on

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.05 means the middle half lies within +-2.5%."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "max_ms": self.max_ms,
                "q1_ms": self.q1_ms, "q3_ms": self.q3_ms, "reps": self.reps,
                "host_median_ms": self.host_median_ms, "gpu_caught_up": self.gpu_caught_up,
                "head_start_ms": self.head_start_ms}


def cpu_llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs), 32 MiB if unknown."""
    best = 0
    for index in range(8):
        path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
        try:
            text = open(path).read().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1], 1)
        best = max(best, int(text.rstrip("KMG")) * mult)
    return best or (32 << 20)


class CacheFlusher:
    """Reads a buffer of twice the last-level cache; after that the cache holds none of the
    benchmark's data (and nothing dirty)."""

    def __init__(self, device: str):
        if device == "cuda":
            size = 2 * torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
        else:
            size = 2 * cpu_llc_bytes()
        self.buffer = torch.ones(max(size, 1 << 20) // 4, dtype=torch.float32, device=device)

    def __call__(self):
        self.buffer.sum()


def no_flush():
    """A flusher that leaves the caches as they are: for data that dwarfs every cache, or that
    is meant to stay in cache."""


@dataclass(frozen=True)
class TimingPlan:
    warmup: int         # untimed calls first
    max_reps: int       # timed calls at most
    min_reps: int       # timed calls at least, whatever the budget
    budget_s: float     # stop adding timed calls after this much wall time


# The runner's correctness call precedes the timing and already warms up (first-touch page faults,
# allocator, lazy init), so --quick adds no further untimed calls.
QUICK = TimingPlan(warmup=0, max_reps=7, min_reps=3, budget_s=1.5)
FULL = TimingPlan(warmup=3, max_reps=30, min_reps=5, budget_s=10.0)


def _summarise(times_ms: list) -> Timing:
    ordered = sorted(times_ms)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return Timing(statistics.median(ordered), ordered[0], ordered[-1], q1, q3, len(ordered))


def time_call(fn: Callable[[], object], device: str, plan: TimingPlan,
              flusher: Optional[CacheFlusher] = None,
              clock: Callable[[], float] = time.perf_counter, gpu=None) -> Timing:
    """Median time of fn() with cold caches (flusher no_flush: as the caches are). CPU: wall
    time by `clock` (e.g. time.process_time for CPU time). CUDA: the GPU's time for the call
    (`gpu`: the stream to time on, cuda_timing.TorchCudaGpu unless a test passes another), the
    host's time in it by `clock`."""
    flusher = flusher or CacheFlusher(device)
    for _ in range(plan.warmup):
        fn()
    started = time.perf_counter()

    def more(count: int) -> bool:
        return count < plan.max_reps and (
            count < plan.min_reps or time.perf_counter() - started < plan.budget_s)

    if device == "cuda":
        if gpu is None:
            torch.cuda.synchronize()
        timer = GpuCallTimer(gpu or TorchCudaGpu(), flusher, clock)
        samples = []
        while more(len(samples)):
            samples.append(timer(fn))
        timing = _summarise([s.gpu_ms for s in samples])
        timing.host_median_ms = statistics.median(s.host_ms for s in samples)
        timing.gpu_caught_up = sum(s.caught_up for s in samples)
        timing.head_start_ms = timer.head_start_ms
        return timing
    times_ms = []
    while more(len(times_ms)):
        flusher()
        begin = clock()
        fn()
        times_ms.append((clock() - begin) * 1e3)
    return _summarise(times_ms)
