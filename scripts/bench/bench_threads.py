"""How many threads should one CPU attention call wake? Times calls of every size on one thread
and on all of torch's threads, as a decode step makes them, under each OpenMP idle-thread policy.

    .venv/bin/python scripts/bench/bench_threads.py [--ctx 16,64,256,1024,4096] [--batch 1] [--rounds 15]
        [--policies default,passive]

The CPU kernel wakes one thread per min_kv_bytes_per_thread of K / V (csrc/cpu/threads_per_call.h:
256 KiB when idle OpenMP threads spin between parallel regions, 4 MiB when they sleep). This
script measures where a second thread starts to pay, so that rule can be checked on any machine:
per policy (each in its own process: the OpenMP runtime reads its variables once) and per
context length, v1 calls on Llama-3-8B's attention shape (32 query heads, 8 KV heads, head 128,
bf16, block 16), each "layer" with its own K / V (together at least 96 MiB, at most 32 layers, so
K / V come from memory as in a model), a small fp32 matmul between two calls (the model's other
ops, which keep the OpenMP threads as busy as a forward pass does). Columns: median time per call
(us) with PAGED_ATTN_CPU_KV_BYTES_PER_THREAD forcing one thread and all threads, then the rule's
own (unforced) time and the threads it picks. The machine is shared: compare columns of one row.
"""

import argparse
import math
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this checkout

POLICY_ENV = {"default": None, "passive": "PASSIVE", "active": "ACTIVE"}
FORCE = "PAGED_ATTN_CPU_KV_BYTES_PER_THREAD"
HEADS, KV_HEADS, HEAD, BLOCK = 32, 8, 128, 16


def _time_one_size(ctx, batch, rounds):
    import torch

    from paged_attention_ext.tools import testing

    per_call = 2 * batch * ctx * KV_HEADS * HEAD * 2  # K and V bytes (bf16)
    layers = min(32, max(2, (96 << 20) // per_call))
    inputs = [testing.make_attention_inputs(batch, HEADS, KV_HEADS, HEAD, BLOCK, [ctx] * batch,
                                            dtype=torch.bfloat16, seed=i, extra_blocks=0,
                                            poison=False) for i in range(layers)]
    outs = [testing.alloc_v1_outputs(x) for x in inputs]
    weight, act = torch.randn(2048, 2048), torch.randn(1, 2048)
    op = torch.ops.paged_attn.v1

    def per_call_us():
        total = 0.0
        for x, out in zip(inputs, outs):
            torch.mm(act, weight)
            start = time.perf_counter()
            testing.call_v1(op, x, out)
            total += time.perf_counter() - start
        return total / layers * 1e6

    results = {}
    for name, force in (("one", str(1 << 50)), ("all", "1"), ("rule", None)):
        if force is None:
            os.environ.pop(FORCE, None)
        else:
            os.environ[FORCE] = force
        per_call_us()  # warm-up
        results[name] = statistics.median(per_call_us() for _ in range(rounds))
    os.environ.pop(FORCE, None)
    return per_call, results


def _rule_threads(ctx, batch, min_bytes, threads):
    """The threads at::parallel_for starts for the launcher's grain (task_grain in
    csrc/cpu/paged_attention_cpu.cpp, restated): work items of at least min_bytes of K / V."""
    from paged_attention_ext.core import PARTITION_SIZE

    tasks = batch * math.ceil(ctx / PARTITION_SIZE) * KV_HEADS
    kv_bytes = 2 * batch * ctx * KV_HEADS * HEAD * 2
    grain = max(1, math.ceil(tasks * min_bytes / kv_bytes))
    return min(threads, math.ceil(tasks / grain))


def run_policy(args):
    import torch

    import paged_attention_ext as pa

    info = pa.cpu_threading()
    threads = torch.get_num_threads()
    print(f"policy {args.policy}: idle threads {info['idle_threads']} ({info['setting']}), "
          f"one thread per {info['min_kv_bytes_per_thread'] >> 10} KiB, torch threads {threads}, "
          f"kernel {pa.cpu_kernel()}")
    print(f"{'ctx':>6} {'K/V KiB':>8} {'1 thread':>9} {'all':>9} {'all/1':>6} {'rule':>9} "
          f"{'threads':>7}")
    for ctx in args.ctx:
        kv_bytes, t = _time_one_size(ctx, args.batch, args.rounds)
        print(f"{ctx:>6} {kv_bytes >> 10:>8} {t['one']:>9.1f} {t['all']:>9.1f} "
              f"{t['all'] / t['one']:>6.2f} {t['rule']:>9.1f} "
              f"{_rule_threads(ctx, args.batch, info['min_kv_bytes_per_thread'], threads):>7}",
              flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ctx", type=lambda s: [int(v) for v in s.split(",")],
                    default=[16, 64, 256, 1024, 4096])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--policies", default="default,passive",
                    help=f"comma-separated, of {', '.join(POLICY_ENV)}")
    ap.add_argument("--policy", help=argparse.SUPPRESS)  # the child process's own policy
    args = ap.parse_args()
    if args.policy:
        return run_policy(args)
    for policy in args.policies.split(","):
        env = dict(os.environ)
        for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", FORCE):
            env.pop(name, None)
        if POLICY_ENV[policy] is not None:
            env["OMP_WAIT_POLICY"] = POLICY_ENV[policy]
        child = ["--ctx", ",".join(map(str, args.ctx)), "--batch", str(args.batch),
                 "--rounds", str(args.rounds), "--policy", policy]
        subprocess.run([sys.executable, __file__, *child], env=env, check=True)


if __name__ == "__main__":
    sys.exit(main())
