"""Peak memory a contender allocates beyond what was live before it ran.

CUDA: torch.cuda.max_memory_allocated after reset_peak_memory_stats (exact, caching allocator).
CPU (Linux): the process's resident-set high-water mark (VmHWM) after resetting it through
/proc/self/clear_refs, minus the resident set before: the new pages the call made resident. An
approximation: it counts anything the process touched meanwhile, and misses temporaries the C
allocator serves from memory freed earlier (blocks below glibc's mmap threshold). Elsewhere: not
measured (None).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch


def _status_kib(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_cpu_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_extra_bytes(fn: Callable[[], object], device: str) -> Optional[int]:
    """Runs fn() once and returns its peak extra memory in bytes (None if not measurable)."""
    if device == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        return max(0, torch.cuda.max_memory_allocated() - before)
    rss_before = _status_kib("VmRSS")
    if rss_before is None or not _reset_cpu_peak():
        fn()
        return None
    fn()
    peak = _status_kib("VmHWM")
    return None if peak is None else max(0, peak - rss_before) * 1024


MEMORY_METHOD = {
    "cuda": "torch.cuda.max_memory_allocated delta",
    "cpu": "new resident pages during one call (VmHWM after a clear_refs reset - VmRSS before; "
           "approximate, misses reused allocator memory)",
}
