"""One benchmark run: bandwidth, then for every shape and contender a correctness check against
the oracle followed by the timing, then bandwidth again (the higher figure is the ceiling).
Returns plain dicts (report.py prints them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from ... import reference
from ...api import num_partitions
from ..conformance import compare_out
from ..testing import tolerances
from .bandwidth import Bandwidth, best_of, measure_bandwidth
from .contenders import CONTENDERS, applicable, vllm_pick
from .memory import peak_extra_bytes
from .presets import Shape
from .timing import FULL, QUICK, CacheFlusher, time_call
from .workload import Workload, make_workload


@dataclass
class BenchConfig:
    device: str
    dtype: torch.dtype
    kv_cache_dtype: str
    shapes: list
    contenders: tuple
    full: bool = False
    kv_layout: str = "vllm"  # workload.KV_LAYOUTS
    blocksparse: Optional[tuple] = None  # Workload.blocksparse
    seed: int = 0
    bandwidth_bytes: int = 0  # 0: bandwidth.py's default size
    # A non-ours contender whose single checking call took longer than this is not timed
    # (None: 3 s with --quick, 20 s with --full).
    skip_timing_after_s: Optional[float] = None
    # CUDA: also profile our ops' and SDPA's calls kernel by kernel (kernel_times.py)
    kernel_times: bool = False


@dataclass
class BenchResult:
    config: BenchConfig
    bandwidth: Bandwidth
    rows: list = field(default_factory=list)  # one dict per (shape, contender)


def oracle_out(work: Workload) -> tuple:
    """The oracle's out for this workload, and how long it took."""
    s = work.shape
    out = torch.empty_like(work.query)
    if work.kv_layout != "vllm":
        begin = time.perf_counter()
        reference.decode(out, work.query, work.key_cache, work.value_cache, work.block_tables,
                         work.seq_lens, work.scale, None, work.kv_cache_dtype, work.k_scale,
                         work.v_scale)
        _sync(work.query.device.type)
        return out, time.perf_counter() - begin
    parts = num_partitions(work.max_seq_len)
    exp_sums = torch.empty(s.batch, s.heads, parts, dtype=torch.float32, device=work.query.device)
    tmp_out = torch.empty(s.batch, s.heads, parts, s.head, dtype=work.query.dtype,
                          device=work.query.device)
    begin = time.perf_counter()
    reference.paged_attention_v2(out, exp_sums, torch.empty_like(exp_sums), tmp_out, work.query,
                                 work.key_cache, work.value_cache, s.kv_heads, work.scale,
                                 work.block_tables, work.seq_lens, s.block, work.max_seq_len,
                                 None, work.kv_cache_dtype, work.k_scale, work.v_scale,
                                 *work.blocksparse_args())
    _sync(work.query.device.type)
    return out, time.perf_counter() - begin


def _sync(device: str):
    if device == "cuda":
        torch.cuda.synchronize()


def _check(run, expected: torch.Tensor, work: Workload, device: str) -> dict:
    """One call of the contender: its error against the oracle, its peak extra memory, its time."""
    holder = {}

    def call():
        holder["out"] = run()
        _sync(device)

    begin = time.perf_counter()
    peak = peak_extra_bytes(call, device)
    first_call_s = time.perf_counter() - begin
    outcome = compare_out("out", holder["out"], expected, work.query.dtype, work.kv_cache_dtype)
    atol, rtol = tolerances(work.query.dtype, work.kv_cache_dtype)  # reported with the result
    return {"max_abs_err": outcome.max_abs_err, "atol": atol, "rtol": rtol,
            "correct": outcome.passed, "peak_mem_bytes": peak, "first_call_s": first_call_s}


def run_bench(config: BenchConfig, progress=None) -> BenchResult:
    """progress: an object with .phase(text) and .advance(), or None."""
    progress = progress or _NoProgress()
    progress.phase("memory bandwidth")
    before = measure_bandwidth(config.device, config.full, config.bandwidth_bytes)
    progress.advance()
    rows = []
    plan = FULL if config.full else QUICK
    flusher = CacheFlusher(config.device)
    for shape in config.shapes:
        rows.extend(_bench_shape(shape, config, plan, flusher, progress))
    del flusher
    progress.phase("memory bandwidth (again)")
    bandwidth = best_of(before, measure_bandwidth(config.device, config.full,
                                                  config.bandwidth_bytes))
    progress.advance()
    for row in rows:
        if row["gbps"]:
            row["pct_of_read_bw"] = 100.0 * row["gbps"] / bandwidth.read_gbps
    return BenchResult(config, bandwidth, rows)


def _bench_shape(shape: Shape, config: BenchConfig, plan, flusher, progress) -> list:
    progress.phase(f"{shape.label}: building inputs")
    work = make_workload(shape, config.dtype, config.kv_cache_dtype, config.device, config.seed,
                         kv_layout=config.kv_layout, blocksparse=config.blocksparse)
    progress.phase(f"{shape.label}: oracle")
    expected, oracle_s = oracle_out(work)
    nbytes = work.bytes_moved()
    pick = vllm_pick(work) if work.kv_layout == "vllm" else "decode"  # the op ours x refers to
    rows = []
    for name in config.contenders:
        contender = CONTENDERS[name]
        row = {"shape": shape.as_dict(), "label": shape.label, "contender": name,
               "ours": contender.ours, "bytes": nbytes, "vllm_pick": pick,
               "median_ms": None, "timing": None, "gbps": None, "pct_of_read_bw": None,
               "note": ""}
        why_not = (f"not available on {config.device}"
                   if config.device not in contender.devices else
                   applicable(contender, config.kv_layout, config.blocksparse is not None)
                   or (contender.unavailable(work) if contender.unavailable else ""))
        if why_not:
            row["note"] = why_not
            rows.append(row)
            progress.advance()
            continue
        progress.phase(f"{shape.label}: {name} (check)")
        try:
            run = contender.prepare(work)
            row["note"] = getattr(run, "note", "")  # e.g. the SDPA backend used
            row.update(_check(run, expected, work, config.device))
        except Exception as exc:  # e.g. a head size a kernel is not compiled for
            row.update(correct=False, note=f"error: {type(exc).__name__}: {exc}".splitlines()[0])
            rows.append(row)
            progress.advance()
            continue
        too_slow = max(row["first_call_s"], oracle_s if name == "oracle" else 0.0)
        limit = config.skip_timing_after_s or (20.0 if config.full else 3.0)
        if not contender.ours and too_slow > limit:
            row["note"] = "; ".join(filter(None, (row["note"],
                                                  f"not timed: one call took {too_slow:.1f} s")))
        else:
            progress.phase(f"{shape.label}: {name} (timing)")
            timing = time_call(run, config.device, plan, flusher)
            row.update(median_ms=timing.median_ms, timing=timing.as_dict(),
                       gbps=nbytes / timing.median_ms / 1e6)
            if timing.gpu_caught_up:
                row["note"] = "; ".join(filter(None, (
                    row["note"], f"the GPU waited for the host in {timing.gpu_caught_up} of "
                                 f"{timing.reps} timed calls: host time included")))
            if config.kernel_times and (contender.ours or name == "sdpa-dense"):
                row.update(_kernel_times(run, flusher, timing))
        del run
        rows.append(row)
        progress.advance()
    _add_speedups(rows, pick)
    return rows


def _kernel_times(run, flusher, timing) -> dict:
    """The row's kernel_times (kernel_times.py), or a note saying why there are none."""
    from .cuda_timing import INITIAL_HEAD_START_MS, TorchCudaGpu
    from .kernel_times import profile_kernels

    # the timing's settled head start, or longer: the profiler adds host time to each call
    head_start_ms = max(timing.head_start_ms or INITIAL_HEAD_START_MS,
                        2.0 * (timing.host_median_ms or 0.0))
    gpu = TorchCudaGpu()
    try:
        times = profile_kernels(run, flusher, lambda: gpu.spin(head_start_ms))
    except Exception as exc:  # the profiler unavailable: the row keeps its timing
        return {"kernel_times": None, "kernel_times_error": f"{type(exc).__name__}: {exc}"}
    return {"kernel_times": times.as_dict(), "kernel_summary": times.summary()}


def _add_speedups(rows: list, pick: str):
    """speedup = contender time / our time, 'ours' being the op vLLM's rule would pick (the
    other one if that was not run); vs_oracle = oracle time / contender time (how many times
    faster than the oracle, the seed's algorithm), when the oracle was timed."""
    timed = {r["contender"]: r["median_ms"] for r in rows if r["median_ms"]}
    ours_name = next((n for n in (f"ours-{pick}", "ours-v2", "ours-v1") if n in timed), None)
    for r in rows:
        r["speedup_ref"] = ours_name
        r["speedup"] = (r["median_ms"] / timed[ours_name]
                        if ours_name and r["median_ms"] else None)
        r["vs_oracle"] = (timed["oracle"] / r["median_ms"]
                          if "oracle" in timed and r["median_ms"] else None)


class _NoProgress:
    def phase(self, text: str):
        pass

    def advance(self):
        pass


def total_steps(config: BenchConfig) -> int:
    return 2 + len(config.shapes) * len(config.contenders)


def any_incorrect(result: BenchResult) -> Optional[list]:
    bad = [f"{r['label']} / {r['contender']}" for r in result.rows if r.get("correct") is False]
    return bad or None
