"""Time the PyTorch fallback against the oracle and gather + scaled_dot_product_attention (CPU),
each (shape, contender) in a process of its own, so its peak memory is its own.

The data, the contenders and the timing are the package's benchmark harness
(paged_attention_ext/tools/bench: make_workload, CONTENDERS, time_call, peak_extra_bytes); this
script adds the process per contender and the rounds. A process builds the workload, then
reports the median time of its timed calls after a warm-up and the peak resident memory above
what it held before the first call. Contenders are interleaved in rounds; the machine is shared,
so read the RATIOS (computed per round, median over rounds).

  .venv/bin/python scripts/bench/bench_fallback.py                 # all shapes, 2 rounds
  .venv/bin/python scripts/bench/bench_fallback.py --shapes llama-fp32 --rounds 3
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads (docs/PERFORMANCE.md, "Noise")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from paged_attention_ext.tools.bench.contenders import CONTENDERS as HARNESS  # noqa: E402
from paged_attention_ext.tools.bench.memory import peak_extra_bytes  # noqa: E402
from paged_attention_ext.tools.bench.presets import Shape  # noqa: E402
from paged_attention_ext.tools.bench.timing import TimingPlan, no_flush, time_call  # noqa: E402
from paged_attention_ext.tools.bench.workload import make_workload  # noqa: E402

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
# The harness's contenders (tools/bench/contenders.py). ours-v2: torch.ops.paged_attn.v2, the
# compiled C++ kernel when the extension is built: the yardstick for what one pass over the
# cache costs on this machine. Ratios are over the first, the fallback's v2.
CONTENDERS = ["fallback", "fallback-v1", "gather-sdpa", "oracle", "ours-v2"]
REPS = {"oracle": 3}  # timed calls per process (default below)
DEFAULT_REPS = 7


# ---- child: one (shape, contender) ----

def child(shape_name, contender):
    batch, heads, kv_heads, head, block, ctx, dtype = SHAPES[shape_name]
    work = make_workload(Shape(shape_name, batch, heads, kv_heads, head, ctx, block),
                         getattr(torch, dtype), "auto", "cpu", spare_blocks=0)
    run = HARNESS[contender].prepare(work)
    reps = REPS.get(contender, DEFAULT_REPS)
    plan = TimingPlan(warmup=1, max_reps=reps, min_reps=reps, budget_s=0.0)
    timing = {}

    def timed_calls():  # K/V dwarf the caches: no flush needed between calls
        timing["result"] = time_call(run, "cpu", plan, no_flush)

    peak = peak_extra_bytes(timed_calls, "cpu")  # over the warm-up and every timed call
    print(json.dumps({"ms": timing["result"].median_ms,
                      "peak_extra_mib": None if peak is None else peak / 2**20,
                      "threads": torch.get_num_threads()}))


# ---- parent ----

def _spawn(shape_name, contender, omp_wait_policy):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", shape_name, contender]
    env = dict(os.environ, OMP_WAIT_POLICY=omp_wait_policy)
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
                if c == "oracle" and r >= args.oracle_rounds:
                    continue
                row[c] = _spawn(shape, c, args.omp_wait_policy)
                print(f"  {shape} round {r} {c}: {row[c]['ms']:.1f} ms, "
                      f"peak +{row[c]['peak_extra_mib']:.0f} MiB", flush=True)
            rounds.append(row)
        results[shape] = rounds

    print("\n| shape | contender | ms (median of rounds) | x fallback time (same round) "
          "| peak extra MiB |")
    print("|---|---|---|---|---|")
    for shape, rounds in results.items():
        for c in args.contenders:
            rs = [row for row in rounds if c in row]
            ms = statistics.median(row[c]["ms"] for row in rs)
            ratio = ""
            if "fallback" in args.contenders:
                r = statistics.median(row[c]["ms"] / row["fallback"]["ms"] for row in rs)
                ratio = f"{r:.2f}"
            mem = max(row[c]["peak_extra_mib"] or 0 for row in rs)
            print(f"| {shape} | {c} | {ms:.1f} | {ratio} | {mem:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
