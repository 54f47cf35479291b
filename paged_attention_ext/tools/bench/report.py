"""Benchmark results as a rich table (terminal), a Markdown table (docs) and JSON (machines)."""

from __future__ import annotations

import json
from typing import Optional

from .memory import MEMORY_METHOD
from .runner import BenchResult
from .timing import FULL, QUICK

COLUMNS = ("shape", "contender", "ms (median)", "spread", "GB/s", "% read BW", "ours x",
           "x oracle", "max err", "ok", "peak MiB", "note")
HOST_COLUMN = "host ms"  # CUDA only: the host's time in the call, after "spread"
KERNEL_COLUMN = "kernel ms"  # CUDA with --kernel-times: the call's kernels' own time, after it


def columns(device: str, kernel_times: bool = False) -> tuple:
    if device != "cuda":
        return COLUMNS
    at = COLUMNS.index("spread") + 1
    extra = (HOST_COLUMN, KERNEL_COLUMN) if kernel_times else (HOST_COLUMN,)
    return COLUMNS[:at] + extra + COLUMNS[at:]


def _table_kind(data: dict) -> tuple:
    """(device, kernel_times) of a result: which columns its tables have."""
    config = data["config"]
    return config["device"], bool(config.get("kernel_times"))


def to_dict(result: BenchResult, machine: dict) -> dict:
    c = result.config
    plan = FULL if c.full else QUICK
    return {
        "machine": machine,
        "config": {"device": c.device, "dtype": str(c.dtype).replace("torch.", ""),
                   "kv_cache_dtype": c.kv_cache_dtype, "kv_layout": c.kv_layout,
                   "blocksparse": (dict(zip(("tp_rank", "local_blocks", "vert_stride",
                                             "block_size", "head_sliding_step"),
                                            c.blocksparse)) if c.blocksparse else None),
                   "mode": "full" if c.full else "quick",
                   "contenders": list(c.contenders), "seed": c.seed,
                   "kernel_times": c.kernel_times,
                   "timing": {"warmup": plan.warmup, "max_reps": plan.max_reps,
                              "min_reps": plan.min_reps, "budget_s": plan.budget_s,
                              "statistic": "median", "caches": "flushed before every call",
                              "clock": ("GPU time between CUDA events, the host's part kept "
                                        "out" if c.device == "cuda" else "wall time")}},
        "bandwidth": result.bandwidth.as_dict(),
        "memory_method": MEMORY_METHOD.get(c.device, "not measured"),
        "bytes_counted": "K and V of every token once (fp8: 1 byte) + query + out",
        "results": result.rows,
    }


def write_json(path: str, data: dict):
    with open(path, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")


def _fmt(value: Optional[float], spec: str, empty: str = "-") -> str:
    return empty if value is None else format(value, spec)


def _small(value: Optional[float]) -> str:
    """Three significant figures at most, without hiding small values as 0."""
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else (f"{value:.1f}" if value >= 1 else f"{value:.2f}")


def _cells(row: dict, device: str, kernel_times: bool = False) -> list:
    timing = row.get("timing")
    spread = None
    if timing and timing["median_ms"] > 0:
        spread = 100.0 * (timing["q3_ms"] - timing["q1_ms"]) / timing["median_ms"]
    peak = row.get("peak_mem_bytes")
    contender = row["contender"] + (" *" if row["contender"] == f"ours-{row['vllm_pick']}" else "")
    ok = {True: "yes", False: "FAIL", None: "-"}[row.get("correct")]
    host = [_fmt((timing or {}).get("host_median_ms"), ".3f")] if device == "cuda" else []
    note = row.get("note", "")
    if device == "cuda" and kernel_times:
        host.append(_fmt((row.get("kernel_times") or {}).get("kernel_ms"), ".3f"))
        extra = row.get("kernel_summary") or (
            f"kernel times: {row['kernel_times_error']}" if row.get("kernel_times_error") else "")
        note = "; ".join(filter(None, (note, extra)))
    return [row["label"], contender, _fmt(row["median_ms"], ".3f"),
            _fmt(spread, ".0f") + ("%" if spread is not None else ""), *host,
            _small(row["gbps"]), _small(row["pct_of_read_bw"]), _fmt(row.get("speedup"), ".2f"),
            _small(row.get("vs_oracle")), _fmt(row.get("max_abs_err"), ".1e"), ok,
            _fmt(None if peak is None else peak / 2**20, ".1f"), note]


def header_lines(data: dict) -> list:
    m, c, bw = data["machine"], data["config"], data["bandwidth"]
    where = m.get("gpu") or f"{m['host_cpu']}, {m['cpu_cores']} cores"
    timed = ("ms = GPU time of the call between two CUDA events, its host part kept out "
             "(a GPU-side wait covers it); host ms = the host's time in the call"
             + ("; kernel ms = the call's kernels' own time (torch.profiler), each kernel's "
                "median in the note" if c.get("kernel_times") else "")
             if c["device"] == "cuda" else "ms = wall time of the call")
    return [
        f"{m['date']}  {where}  torch {m['torch']}  threads {m['torch_threads']}  "
        f"torch SIMD {m['cpu_capability']}  our CPU kernel {m.get('cpu_kernel', '?')}  "
        f"OMP_WAIT_POLICY={m['omp_wait_policy']}  CPU kernel threads "
        f"{m.get('cpu_threads_rule', '?')}",
        f"device {c['device']}  dtype {c['dtype']}  kv_cache_dtype {c['kv_cache_dtype']}  "
        f"kv_layout {c.get('kv_layout', 'vllm')}  "
        + (f"blocksparse {c['blocksparse']}  " if c.get("blocksparse") else "") +
        f"mode {c['mode']}  torch.ops.paged_attn runs: {m['op_backend']}"
        + (f"  ({m['cuda_settings']})" if m.get("cuda_settings") else ""),
        f"measured bandwidth: read {bw['read_gbps']:.1f} GB/s (sum), copy {bw['copy_gbps']:.1f} "
        f"GB/s (read+write), buffer {bw['buffer_bytes'] / 2**20:.0f} MiB; best of before/after: "
        + ", ".join(f"{s['read_gbps']:.1f}/{s['copy_gbps']:.1f}" for s in bw.get("samples", [])),
        "ours x = contender time / time of our op vLLM would pick (marked *); "
        "x oracle = oracle time / contender time; "
        "spread = interquartile range / median; peak = " + data["memory_method"],
        timed,
    ]


def print_table(data: dict, console=None):
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    for line in header_lines(data):
        console.print(line, highlight=False, markup=False)
    table = Table(show_lines=False)
    kind = _table_kind(data)
    for name in columns(*kind):
        table.add_column(name, justify="left" if name in ("shape", "contender", "note", "ok")
                         else "right", overflow="fold")
    last_label = None
    for row in data["results"]:
        if last_label is not None and row["label"] != last_label:
            table.add_section()
        last_label = row["label"]
        cells = _cells(row, *kind)
        style = "bold red" if row.get("correct") is False else ("bold" if row["ours"] else None)
        table.add_row(*cells, style=style)
    console.print(table)


def to_markdown(data: dict) -> str:
    lines = [f"- {line}" for line in header_lines(data)] + [""]
    kind = _table_kind(data)
    names = columns(*kind)
    lines.append("| " + " | ".join(names) + " |")
    lines.append("|" + "---|" * len(names))
    for row in data["results"]:
        lines.append("| " + " | ".join(c.replace("|", "/") for c in _cells(row, *kind)) + " |")
    return "\n".join(lines) + "\n"
