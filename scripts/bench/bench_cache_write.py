"""CPU cache writes: reshape_and_cache (vLLM's layout) and reshape_and_cache_flash (NHD), the
compiled kernel against the PyTorch fallback, and torch's own index_copy_ into an NHD cache as
the yardstick for a plain scattered copy.

    .venv/bin/python scripts/bench/bench_cache_write.py [--reps 9]

Per case (tokens x KV heads x head size, dtype, kv_cache_dtype, slots random in the pool or
consecutive as in a prefill): median ms over --reps calls after one warm-up, same tensors for
every contender. The machine is shared: compare within a row.
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # this checkout
import paged_attention_ext  # noqa: E402  (registers torch.ops.paged_attn)
from paged_attention_ext import fallback  # noqa: E402

CASES = [  # (tokens, kv_heads, head_size, dtype, kv_cache_dtype, consecutive slots)
    (4096, 8, 128, torch.bfloat16, "auto", True),   # a Llama-3-8B prefill
    (4096, 8, 128, torch.bfloat16, "auto", False),
    (4096, 8, 128, torch.bfloat16, "fp8", True),
    (512, 3, 64, torch.float32, "auto", True),      # SmolLM2-135M
    (64, 8, 128, torch.bfloat16, "auto", False),    # a decode step of 64 sequences
]


def _median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def run_case(tokens, heads, head, dtype, kv, consecutive, reps, block=16):
    num_blocks = (tokens + block - 1) // block + 8
    cache_dtype = dtype if kv == "auto" else torch.uint8
    x = 16 // torch.tensor([], dtype=cache_dtype).element_size()
    key, value = torch.randn(tokens, heads, head, dtype=dtype), torch.randn(tokens, heads, head,
                                                                            dtype=dtype)
    slots = (torch.arange(tokens) if consecutive
             else torch.randperm(num_blocks * block)[:tokens]).long()
    k_vllm = torch.zeros(num_blocks, heads, head // x, block, x, dtype=cache_dtype)
    v_vllm = torch.zeros(num_blocks, heads, head, block, dtype=cache_dtype)
    k_nhd = torch.zeros(num_blocks, block, heads, head, dtype=cache_dtype)
    v_nhd = torch.zeros_like(k_nhd)
    args = (kv, 1.0, 1.0)
    row = {
        "vllm ours": _median_ms(lambda: torch.ops.paged_attn.reshape_and_cache.default(
            key, value, k_vllm, v_vllm, slots, *args), reps),
        "vllm fallback": _median_ms(lambda: fallback.reshape_and_cache(
            key, value, k_vllm, v_vllm, slots, *args), reps),
        "nhd ours": _median_ms(lambda: torch.ops.paged_attn.reshape_and_cache_flash.default(
            key, value, k_nhd, v_nhd, slots, *args), reps),
        "nhd fallback": _median_ms(lambda: fallback.reshape_and_cache_flash(
            key, value, k_nhd, v_nhd, slots, *args), reps),
    }
    if kv == "auto":
        k_rows, v_rows = k_nhd.view(-1, heads, head), v_nhd.view(-1, heads, head)
        row["nhd index_copy_"] = _median_ms(
            lambda: (k_rows.index_copy_(0, slots, key), v_rows.index_copy_(0, slots, value)), reps)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    print(f"torch threads {torch.get_num_threads()}, CPU kernel threads "
          f"{paged_attention_ext.cpu_threading()}")
    for tokens, heads, head, dtype, kv, consecutive in CASES:
        row = run_case(tokens, heads, head, dtype, kv, consecutive, args.reps)
        name = (f"{tokens} x {heads} x {head} {str(dtype)[6:]} {kv} "
                f"{'consecutive' if consecutive else 'random'}")
        print(f"{name:42s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()) + "  (ms)")


if __name__ == "__main__":
    main()
