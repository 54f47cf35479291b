"""The device's memory bandwidth, measured in the same run as the kernels it is compared with.

Two figures, median of a few runs each, measured before and after the kernels (best_of):
  read  -- buffer.sum(): reads the buffer once (bytes = buffer size). The ceiling for decode
           attention, which reads K and V and writes almost nothing.
  copy  -- dst.copy_(src): bytes = 2 x buffer size (read + write).
On CPU the buffer is 16x the last-level cache (at least 256 MiB) so the caches cannot help; on
CUDA 1 GiB (far beyond L2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .timing import TimingPlan, cpu_llc_bytes, no_flush, time_call


@dataclass
class Bandwidth:
    read_gbps: float
    copy_gbps: float
    buffer_bytes: int
    samples: tuple = ()  # (read, copy) GB/s of each measurement combined into this one

    def as_dict(self) -> dict:
        return {"read_gbps": self.read_gbps, "copy_gbps": self.copy_gbps,
                "buffer_bytes": self.buffer_bytes,
                "samples": [{"read_gbps": r, "copy_gbps": c} for r, c in self.samples]}


def best_of(*measurements: Bandwidth) -> Bandwidth:
    """The run measures before and after the kernels; neighbours' load moves bandwidth within
    minutes, so the higher figure (what the machine could deliver) is the ceiling, and both
    samples are kept to show the drift."""
    return Bandwidth(max(m.read_gbps for m in measurements),
                     max(m.copy_gbps for m in measurements), measurements[0].buffer_bytes,
                     tuple((m.read_gbps, m.copy_gbps) for m in measurements))


def buffer_bytes_for(device: str, full: bool) -> int:
    if device == "cuda":
        return 1 << 30
    return max(16 * cpu_llc_bytes(), (1 << 30) if full else (256 << 20))


def measure_bandwidth(device: str, full: bool = False, buffer_bytes: int = 0) -> Bandwidth:
    size = buffer_bytes or buffer_bytes_for(device, full)
    src = torch.ones(size // 4, dtype=torch.float32, device=device)  # touched: no page faults
    dst = torch.empty_like(src).fill_(0.0)
    plan = TimingPlan(warmup=1, max_reps=9 if full else 5, min_reps=3,
                      budget_s=5.0 if full else 1.5)
    # the buffers dwarf every cache: flushing between calls would only add time
    read = time_call(lambda: src.sum(), device, plan, no_flush)
    copy = time_call(lambda: dst.copy_(src), device, plan, no_flush)
    nbytes = src.numel() * 4
    return Bandwidth(nbytes / read.median_ms / 1e6, 2 * nbytes / copy.median_ms / 1e6, nbytes)
