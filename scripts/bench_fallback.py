"""Time the PyTorch fallback against the oracle and gather + scaled_dot_product_attention (CPU).

Each (shape, contender) runs in its own subprocess, so its peak memory is its own: the process
builds the inputs, resets its peak-RSS mark (/proc/self/clear_refs), runs, and reports the median
time and the peak RSS above what it held before the first call. Contenders are interleaved in
rounds; the machine is shared, so read the RATIOS (computed per round, median over rounds).

  .venv/bin/python scripts/bench_fallback.py                 # all shapes, 2 rounds
  .venv/bin/python scripts/bench_fallback.py --shapes llama-fp32 --rounds 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/PERFORMANCE.md, "Noise")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (batch, heads, kv_heads, head_size, block_size, ctx, dtype)
SHAPES = {
    "llama-fp32": (8, 32, 8, 128, 16, 4096, "float32"),
    "llama-bf16": (8, 32, 8, 128, 16, 4096, "bfloat16"),
    "llama-16k-fp32": (8, 32, 8, 128, 16, 16384, "float32"),
    "llama-16k-bf16": (8, 32, 8, 128, 16, 16384, "bfloat16"),
    "qwen-100k-fp32": (1, 24, 4, 256, 16, 100_000, "float32"),
    "qwen-100k-bf16": (1, 24, 4, 256, 16, 100_000, "bfloat16"),
    "short-64x256-fp32": (64, 32, 8, 128, 16, 256, "float32"),
}
# ops-v2: torch.ops.paged_attn.v2, the compiled C++ kernel when the extension is built: the
# yardstick for what one pass over the cache costs on this machine.
CONTENDERS = ["fallback-v2", "fallback-v1", "gather+sdpa", "oracle-v2", "ops-v2"]
REPS = {"oracle-v2": 3}  # timed calls per subprocess (default below)
DEFAULT_REPS = 7


# ---- child: one (shape, contender) ----

def _peak_rss_reset():
    """Reset the peak-RSS mark; returns the current RSS in bytes (None if not possible)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_bytes("VmRSS")
    except OSError:
        return None


def _status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def _gather_sdpa(inp):
    """What a PyTorch user without a paged kernel writes: gather every sequence's K/V dense
    ([B, kv_heads, ctx, d]) through the block tables, then SDPA (all rows are ctx long)."""
    import torch.nn.functional as F

    b, d, ctx = inp.num_seqs, inp.head_size, inp.max_seq_len
    tables = inp.block_tables[:, :-(-ctx // inp.block_size)].long()  # used blocks only
    k = inp.key_cache[tables]  # [B, nb, kvh, d/x, bs, x]
    k = k.permute(0, 2, 1, 4, 3, 5).reshape(b, inp.num_kv_heads, -1, d)[:, :, :ctx]
    v = inp.value_cache[tables]  # [B, nb, kvh, d, bs]
    v = v.permute(0, 2, 1, 4, 3).reshape(b, inp.num_kv_heads, -1, d)[:, :, :ctx]
    out = F.scaled_dot_product_attention(inp.query.unsqueeze(2), k, v, scale=inp.scale,
                                         enable_gqa=True)
    return out.squeeze(2)


def child(shape_name, contender):
    import torch

    from paged_attention_ext import fallback, reference
    from paged_attention_ext.tools import testing

    batch, heads, kv_heads, head, block, ctx, dtype = SHAPES[shape_name]
    inp = testing.make_attention_inputs(batch, heads, kv_heads, head, block, [ctx] * batch,
                                        dtype=getattr(torch, dtype), poison=False,
                                        extra_blocks=0)
    outs = testing.alloc_v2_outputs(inp)
    run = {
        "fallback-v2": lambda: testing.call_v2(fallback.paged_attention_v2, inp, outs),
        "fallback-v1": lambda: testing.call_v1(fallback.paged_attention_v1, inp, outs.out),
        "oracle-v2": lambda: testing.call_v2(reference.paged_attention_v2, inp, outs),
        "ops-v2": lambda: testing.call_v2(torch.ops.paged_attn.v2, inp, outs),
        "gather+sdpa": lambda: _gather_sdpa(inp),
    }[contender]
    base = _peak_rss_reset()
    times = []
    for _ in range(1 + REPS.get(contender, DEFAULT_REPS)):  # the first call is a warm-up
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    peak = _status_bytes("VmHWM") if base is not None else None
    print(json.dumps({"ms": statistics.median(times[1:]) * 1e3,
                      "peak_extra_mib": None if peak is None else (peak - base) / 2**20,
                      "threads": torch.get_num_threads()}))


# ---- parent ----

def _spawn(shape_name, contender, omp_wait_policy):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", shape_name, contender]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_WAIT_POLICY=omp_wait_policy)
    if omp_wait_policy == "default":  # libgomp's own default: spin a while, then sleep
        del env["OMP_WAIT_POLICY"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if res.returncode != 0:
        raise RuntimeError(f"{shape_name}/{contender} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--contenders", nargs="*", default=CONTENDERS, choices=CONTENDERS)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--oracle-rounds", type=int, default=1,
                    help="rounds that include the (slow) oracle")
    ap.add_argument("--omp-wait-policy", default=os.environ["OMP_WAIT_POLICY"],
                    choices=["PASSIVE", "ACTIVE", "default"],
                    help="OMP_WAIT_POLICY of the timed processes (default: PASSIVE, as the main "
                         "command's benchmark; 'default' leaves it unset)")
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return

    print(f"OMP_WAIT_POLICY={args.omp_wait_policy}  load average {os.getloadavg()}")
    results = {}
    for shape in args.shapes:
        rounds = []
        for r in range(args.rounds):
            row = {}
            for c in args.contenders:
                if c == "oracle-v2" and r >= args.oracle_rounds:
                    continue
                row[c] = _spawn(shape, c, args.omp_wait_policy)
                print(f"  {shape} round {r} {c}: {row[c]['ms']:.1f} ms, "
                      f"peak +{row[c]['peak_extra_mib']:.0f} MiB", flush=True)
            rounds.append(row)
        results[shape] = rounds

    print("\n| shape | contender | ms (median of rounds) | x fallback-v2 time (same round) "
          "| peak extra MiB |")
    print("|---|---|---|---|---|")
    for shape, rounds in results.items():
        for c in args.contenders:
            rs = [row for row in rounds if c in row]
            ms = statistics.median(row[c]["ms"] for row in rs)
            ratio = ""
            if "fallback-v2" in args.contenders:
                r = statistics.median(row[c]["ms"] / row["fallback-v2"]["ms"] for row in rs)
                ratio = f"{r:.2f}"
            mem = max(row[c]["peak_extra_mib"] or 0 for row in rs)
            print(f"| {shape} | {c} | {ms:.1f} | {ratio} | {mem:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
