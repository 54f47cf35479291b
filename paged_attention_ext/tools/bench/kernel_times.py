"""Which GPU kernels one call runs and for how long (`bench --kernel-times`, CUDA only).

The bench's `ms` is the GPU time between two events around the call (cuda_timing.py). This
splits it: torch.profiler's CUDA activity records every kernel (and memset / memcpy) with its
start and end on the GPU. Each profiled call runs as in the timing loop, after the L2 flush and
a GPU-side head start; the flush's and the spin's own kernels (their names taken from a profile
of the two alone) mark where one call ends and the next begins (a call's own kernel of one of
those names would be cut there too: only our ops and SDPA are profiled). Per call:
  kernel_ms  the sum of the call's kernel durations
  span_ms    from its first kernel's start to its last kernel's end: kernel_ms plus the GPU's
             idle gaps between them (a second launch, e.g. the split's reduce)
and per kernel name (shortened: no return type, template arguments or parameters) its median
duration. span_ms against the bench's ms says whether the events time only the kernels.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

CALLS = 3  # profiled calls per contender


class DeviceEvent(NamedTuple):
    name: str
    start_us: float
    end_us: float


@dataclass
class KernelTimes:
    kernel_ms: float                # median over the calls of the summed kernel durations
    span_ms: float                  # median over the calls of first start .. last end
    kernels_per_call: int           # in the median call (by kernel_ms)
    by_kernel: dict = field(default_factory=dict)  # short name -> median ms in a call

    def as_dict(self) -> dict:
        return {"kernel_ms": self.kernel_ms, "span_ms": self.span_ms,
                "kernels_per_call": self.kernels_per_call, "by_kernel": self.by_kernel}

    def summary(self) -> str:
        """e.g. 'paged_attention_pipelined_kernel 0.380 + paged_attention_v2_reduce_kernel
        0.004 ms'."""
        parts = [f"{name} {ms:.3f}" for name, ms in self.by_kernel.items()]
        return " + ".join(parts) + " ms" if parts else "no kernels"


def short_name(name: str) -> str:
    """A kernel's name without return type, namespaces, template arguments or parameters:
    'void paged_attn::cuda::foo_kernel<float, 4>(Params)' -> 'foo_kernel'."""
    depth, kept = 0, []
    for ch in name:  # drop everything inside <...> and (...)
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    base = words[-1] if words else name
    return re.sub(r"^.*::", "", base) or name


def split_calls(events: Iterable[DeviceEvent], markers: set) -> list:
    """The device events in start order, cut into calls: each run of events whose short names
    are not in `markers` (the flush's and spin's kernels) is one call."""
    calls, current = [], []
    for event in sorted(events, key=lambda e: e.start_us):
        if short_name(event.name) in markers:
            if current:
                calls.append(current)
            current = []
        else:
            current.append(event)
    if current:
        calls.append(current)
    return calls


def summarise(calls: list) -> KernelTimes:
    """KernelTimes of the calls (lists of DeviceEvent); a call with no kernel counts 0."""
    if not calls:
        return KernelTimes(0.0, 0.0, 0)
    sums = [sum(e.end_us - e.start_us for e in call) / 1e3 for call in calls]
    spans = [(max(e.end_us for e in call) - min(e.start_us for e in call)) / 1e3
             for call in calls]
    median_call = calls[sorted(range(len(calls)), key=lambda i: sums[i])[len(calls) // 2]]
    names = list(dict.fromkeys(short_name(e.name) for call in calls for e in call))
    by_kernel = {}
    for name in names:
        per_call = [sum(e.end_us - e.start_us for e in call if short_name(e.name) == name) / 1e3
                    for call in calls]
        by_kernel[name] = statistics.median(per_call)
    return KernelTimes(statistics.median(sums), statistics.median(spans), len(median_call),
                       by_kernel)


def _device_events(prof) -> list:
    """The CUDA-side events (kernels, memsets, memcpys) of a finished torch.profiler run."""
    from torch.autograd import DeviceType

    return [DeviceEvent(e.name, e.time_range.start, e.time_range.end)
            for e in prof.events() if e.device_type == DeviceType.CUDA]


def profile_kernels(fn: Callable[[], object], flusher: Callable[[], object], spin,
                    calls: int = CALLS) -> KernelTimes:
    """Profiles `calls` calls of fn, each after flusher() and spin() (the timing loop's L2
    flush and head start), on the current CUDA device."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]  # the usual pair: CUDA alone
    with profile(activities=activities) as marker_prof:            # is less travelled
        flusher()
        spin()
        torch.cuda.synchronize()
    markers = {short_name(e.name) for e in _device_events(marker_prof)}
    with profile(activities=activities) as prof:
        for _ in range(calls):
            flusher()
            spin()
            fn()
        torch.cuda.synchronize()
    return summarise(split_calls(_device_events(prof), markers))
