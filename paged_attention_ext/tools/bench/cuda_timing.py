"""Timing one call's GPU work with CUDA events, the host's part of the call kept out of it.

A pair of CUDA events around `fn()` measures from the moment the GPU reaches the first event to
the moment it reaches the second. If the GPU reaches the first one while the host is still in
`fn` (Python, the dispatcher, argument checks: tens of microseconds per op call), the GPU idles
inside the interval and the host's time is counted as the kernel's. A decode step of a serving
loop replays a CUDA graph and has no such gap, and a small call (batch 8 x 1k tokens reads 34 MB:
about 8 us at 4 TB/s) would be timed mostly as host time. So before the first event the GPU is
given a head start to work off: a spin (`torch.cuda._sleep`) long enough for the host to enqueue
the events and the whole call behind it. Whether it was long enough is checked, not assumed: if
the first event has already completed when the host is done enqueuing, the GPU caught up and
the interval holds host time; the call is then timed again with a longer head start (once), and
a call that still lets the GPU catch up (one that waits for the GPU itself, e.g. a `.item()`) is
counted in `Timing.gpu_caught_up`, which the report shows. The host's own time for the call
(`host_ms`, measured while the GPU spins, so never waiting for it unless the call syncs) is kept
too: what a call costs the host in eager mode.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

# Head start before the first event (ms): the host enqueue of one op call from Python is
# ~0.01-0.2 ms; a longer one is found and retried with HEAD_START_GROWTH x the host time.
INITIAL_HEAD_START_MS = 0.25
MAX_HEAD_START_MS = 50.0
HEAD_START_GROWTH = 2.0
_CALIBRATION_CYCLES = 1 << 22  # ~2 ms at 2 GHz
_cycles_per_ms = {}  # CUDA device index -> `_sleep` cycles per millisecond, measured once


class TorchCudaGpu:
    """The current CUDA stream, as the timing loop sees it: a spin of some milliseconds, and
    timing events. Tests give GpuCallTimer a simulated GPU with the same two methods."""

    def __init__(self, torch_module=None):  # a test passes a stand-in for torch
        if torch_module is None:
            import torch as torch_module
        self._torch = torch_module

    def event(self):
        return self._torch.cuda.Event(enable_timing=True)

    def spin(self, ms: float):
        device = self._torch.cuda.current_device()
        if device not in _cycles_per_ms:
            _cycles_per_ms[device] = self._calibrate()
        self._torch.cuda._sleep(max(1, int(ms * _cycles_per_ms[device])))

    def _calibrate(self) -> float:
        """SM clock cycles per millisecond of `_sleep`, the best of three (a gap before the
        spin only makes it look slower)."""
        best = 0.0
        for _ in range(3):
            begin, end = self.event(), self.event()
            begin.record()
            self._torch.cuda._sleep(_CALIBRATION_CYCLES)
            end.record()
            end.synchronize()
            best = max(best, _CALIBRATION_CYCLES / max(begin.elapsed_time(end), 1e-6))
        return best


class GpuSample(NamedTuple):
    """One timed call: GPU time between the events, the host's time in the call, and whether
    the GPU reached the first event before the host had enqueued everything."""

    gpu_ms: float
    host_ms: float
    caught_up: bool


class GpuCallTimer:
    """Times calls one by one, keeping the head start that sufficed for the next call."""

    def __init__(self, gpu, flusher: Callable[[], object],
                 clock: Callable[[], float] = time.perf_counter):
        self.gpu, self.flusher, self.clock = gpu, flusher, clock
        self.head_start_ms = INITIAL_HEAD_START_MS
        self.retry = True  # off once a retry did not help (a call that waits for the GPU)

    def _once(self, fn: Callable[[], object]) -> GpuSample:
        self.flusher()  # cold caches: queued before the spin, done before the first event
        self.gpu.spin(self.head_start_ms)
        begin, end = self.gpu.event(), self.gpu.event()
        begin.record()
        start = self.clock()
        fn()
        host_ms = (self.clock() - start) * 1e3
        end.record()
        caught_up = begin.query()  # done already: the GPU waited for the host in between
        end.synchronize()
        return GpuSample(begin.elapsed_time(end), host_ms, caught_up)

    def __call__(self, fn: Callable[[], object]) -> GpuSample:
        sample = self._once(fn)
        if not sample.caught_up or not self.retry:
            return sample
        self.head_start_ms = min(MAX_HEAD_START_MS,
                                 max(HEAD_START_GROWTH * self.head_start_ms,
                                     HEAD_START_GROWTH * sample.host_ms))
        sample = self._once(fn)
        self.retry = not sample.caught_up
        return sample
