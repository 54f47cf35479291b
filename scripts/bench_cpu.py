"""Focused benchmark of the CPU kernel (torch.ops.paged_attn.v1/v2) against gather+SDPA and the oracle.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench_cpu.py [--shapes llama4k,...] [--reps N]
    .venv/bin/python scripts/bench_cpu.py --variants avx2-fma,avx512,avx512-bf16
    .venv/bin/python scripts/bench_cpu.py --variants avx512-bf16 --layouts vllm,nhd,hnd
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python scripts/bench_cpu.py --cold-layouts vllm,nhd,hnd

--variants: the kernel's compute per variant instead: one thread, K/V resident in L3 (<= 16 MiB,
CACHE_SHAPES), variants interleaved in one process, median CPU time (process_time, less
sensitive to other jobs than wall time) per token per KV head. Compares ISA layers and code
changes on a shared machine. --layouts: the same values in several cache layouts (v1 on vLLM's,
decode on NHD and on HND), with each layout's time over the first's.

Per shape: median ms over reps after a warm-up, with the last-level cache flushed (a 256 MiB
buffer read) before every timed call so K/V come from memory; GB/s = bytes that must move (K and V
of every token once, plus q and out) / time; % of the read bandwidth measured in the same run
(sum over a 2 GiB tensor); x lin = time / time of a linear read (sum) of a tensor of the same
K/V bytes, timed the same way right after (the fairest ratio on a shared machine). Peers: gather+SDPA (index the blocks into contiguous K/V, then
F.scaled_dot_product_attention per sequence) and the oracle (paged_attention_ext.reference),
timed once each since they are slow. The machine is shared: compare within one run.
"""

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/PERFORMANCE.md, "Noise")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import paged_attention_ext  # noqa: E402,F401
from paged_attention_ext import reference  # noqa: E402
from paged_attention_ext.tools import testing  # noqa: E402

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
    "short-f32": (64, 32, 8, 128, 16, 64, "float32", "auto"),
}

_FLUSH = None


def flush_cache():
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.ones(64 * 1024 * 1024)  # 256 MiB
    _FLUSH.sum()


def measure_bandwidth():
    t = torch.ones(512 * 1024 * 1024)  # 2 GiB
    t.sum()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        t.sum()
        times.append(time.perf_counter() - t0)
    return t.numel() * 4 / min(times) / 1e9


def timed(fn, reps, flush=True):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        if flush:
            flush_cache()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def gather_sdpa(inp):
    """Peer: gather each sequence's blocks into contiguous K/V, then SDPA (GQA)."""
    kc, vc = inp.key_cache, inp.value_cache
    nb, kvh, dx, bs, x = kc.shape
    out = []
    for s, n in enumerate(inp.seq_lens_list):
        ids = inp.block_tables[s, :math.ceil(n / bs)].long()
        k = kc[ids].permute(1, 0, 3, 2, 4).reshape(kvh, -1, dx * x)[:, :n]
        v = vc[ids].permute(1, 0, 3, 2).reshape(kvh, -1, dx * x)[:, :n]
        q = inp.query[s].unsqueeze(1)  # [heads, 1, d]
        out.append(F.scaled_dot_product_attention(q[None], k[None], v[None], scale=inp.scale,
                                                  enable_gqa=True)[0, :, 0])
    return torch.stack(out)


def token_major_caches(inp, layout):
    """inp's caches (vLLM's layout) copied into a token-major cache [num_blocks, block_size,
    num_kv_heads, head_size] of the same values: "nhd" as it is, "hnd" stored [num_blocks,
    num_kv_heads, block_size, head_size] and returned as its transpose(1, 2) view."""
    kc, vc = inp.key_cache, inp.value_cache
    nb, kvh, dx, bs, x = kc.shape
    k = kc.permute(0, 3, 1, 2, 4).reshape(nb, bs, kvh, dx * x)
    v = vc.permute(0, 3, 1, 2)
    if layout == "hnd":
        return k.transpose(1, 2).contiguous().transpose(1, 2), v.transpose(1, 2).contiguous().transpose(1, 2)
    return k.contiguous(), v.contiguous()


def layout_call(inp, layout):
    """The attention call on inp's values in one cache layout: "vllm" (v1 on vLLM's layout),
    "v2" (v2 on it), "nhd" / "hnd" (decode on a token-major copy of the same bytes)."""
    if layout == "v2":
        outs = testing.alloc_v2_outputs(inp)
        return lambda: testing.call_v2(torch.ops.paged_attn.v2, inp, outs)
    out = testing.alloc_v1_outputs(inp)
    if layout == "vllm":
        return lambda: testing.call_v1(torch.ops.paged_attn.v1, inp, out)
    k, v = token_major_caches(inp, layout)
    return lambda: torch.ops.paged_attn.decode(out, inp.query, k, v, inp.block_tables,
                                               inp.seq_lens, inp.scale, inp.alibi_slopes,
                                               inp.kv_cache_dtype, inp.k_scale, inp.v_scale)


def compare_variants(variants, layouts=("v2",), shapes=None, rounds=9, calls=5):
    """Per CACHE_SHAPES row: median CPU ns per token per KV head of each variant and layout
    (same values, same bytes), interleaved round by round."""
    torch.set_num_threads(1)
    print(f"1 thread, K/V in cache, CPU time; {rounds} rounds x {calls} calls, variants and "
          f"layouts interleaved")
    cols = [(v, lay) for v in variants for lay in layouts]
    heads = [v if len(layouts) == 1 else f"{v}:{lay}" for v, lay in cols]
    print(f"{'shape':11} " + " ".join(f"{h:>16}" for h in heads) + "   (ns / token / KV head)")
    for name, (ns, nh, nkv, d, bs, ctx, dt, kv) in CACHE_SHAPES.items():
        if shapes and name not in shapes:
            continue
        inp = testing.make_attention_inputs(ns, nh, nkv, d, bs, [ctx] * ns,
                                            dtype=getattr(torch, dt), kv_cache_dtype=kv)
        calls_of = {lay: layout_call(inp, lay) for lay in layouts}
        times = {c: [] for c in cols}
        for _ in range(rounds):
            for v, lay in cols:
                os.environ["PAGED_ATTN_CPU_KERNEL"] = v
                fn = calls_of[lay]
                fn()
                t0 = time.process_time()
                for _ in range(calls):
                    fn()
                times[(v, lay)].append((time.process_time() - t0) / calls)
        per_token = 1e9 / (ns * ctx * nkv)
        med = {c: statistics.median(times[c]) * per_token for c in cols}
        line = f"{name:11} " + " ".join(f"{med[c]:16.1f}" for c in cols)
        if len(layouts) > 1:  # each layout's time / the first layout's, per variant
            line += "   " + " ".join(f"{v}:{lay}/{layouts[0]} {med[(v, lay)] / med[(v, layouts[0])]:.3f}"
                                     for v, lay in cols if lay != layouts[0])
        print(line, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", help="comma-separated CPU kernel variants: compare their "
                    "compute in cache (see the docstring) instead of the default benchmark")
    ap.add_argument("--layouts", default="v2", help="with --variants: comma-separated cache "
                    "layouts timed on the same values: v2 / vllm (v1 / v2 on vLLM's layout), nhd, "
                    "hnd (decode on a token-major copy)")
    ap.add_argument("--cache-shapes", help="with --variants: CACHE_SHAPES rows to run (default all)")
    ap.add_argument("--cold-layouts", help="default benchmark, but each shape timed (K/V cold) "
                    "in these cache layouts on the same values (as --layouts), with the time over "
                    "the first layout's")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--peers", action="store_true", help="also time gather+SDPA and the oracle")
    ap.add_argument("--op", default="v2", choices=["v1", "v2"])
    args = ap.parse_args()
    if args.variants:
        return compare_variants(args.variants.split(","), args.layouts.split(","),
                                args.cache_shapes.split(",") if args.cache_shapes else None)
    bw = measure_bandwidth()
    print(f"threads={torch.get_num_threads()} OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} "
          f"read bandwidth {bw:.1f} GB/s")
    if not args.cold_layouts:
        print(f"{'shape':10} {'dtype':9} {'ms':>8} {'GB/s':>6} {'%bw':>5} {'x lin':>5} "
              f"{'sdpa ms':>8} {'x sdpa':>6} {'oracle ms':>9} {'x oracle':>8}")
    for name in args.shapes.split(","):
        ns, nh, nkv, d, bs, ctx = SHAPES[name]
        for dt in args.dtypes.split(","):
            dtype = getattr(torch, dt)
            lens = [ctx] * ns
            inp = testing.make_attention_inputs(ns, nh, nkv, d, bs, lens, dtype=dtype,
                                                poison=False, extra_blocks=0)
            esize = inp.key_cache.element_size()
            nbytes = 2 * sum(lens) * nkv * d * esize + 2 * ns * nh * d * inp.query.element_size()
            if args.cold_layouts:  # the same values per layout, timed cold, interleaved
                fns = {lay: layout_call(inp, lay) for lay in args.cold_layouts.split(",")}
                times = {lay: [] for lay in fns}
                for _ in range(args.reps):
                    for lay, fn in fns.items():
                        times[lay].append(timed(fn, 1))
                med = {lay: statistics.median(t) for lay, t in times.items()}
                first = next(iter(med))
                print(f"{name:10} {dt:9} " + " ".join(
                    f"{lay} {ms:7.2f} ms ({ms / med[first]:.3f})" for lay, ms in med.items()),
                    flush=True)
                del inp, fns
                continue
            if args.op == "v2":
                outs = testing.alloc_v2_outputs(inp)
                fn = lambda: testing.call_v2(torch.ops.paged_attn.v2, inp, outs)  # noqa: E731
            else:
                out = testing.alloc_v1_outputs(inp)
                fn = lambda: testing.call_v1(torch.ops.paged_attn.v1, inp, out)  # noqa: E731
            ms = timed(fn, args.reps)
            linear = torch.ones((nbytes - 2 * ns * nh * d * inp.query.element_size()) // 4)
            lin_ms = timed(linear.sum, args.reps)
            del linear
            gbs = nbytes / ms / 1e6
            line = f"{name:10} {dt:9} {ms:8.2f} {gbs:6.1f} {100 * gbs / bw:5.0f} {ms / lin_ms:5.2f}"
            if args.peers:
                sdpa = timed(lambda: gather_sdpa(inp), 2)
                orc_out = testing.alloc_v2_outputs(inp)
                orc = timed(lambda: testing.call_v2(reference.paged_attention_v2, inp, orc_out), 1)
                line += f" {sdpa:8.1f} {sdpa / ms:6.1f} {orc:9.1f} {orc / ms:8.1f}"
            print(line, flush=True)
            del inp


if __name__ == "__main__":
    main()
