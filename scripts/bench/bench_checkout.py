"""Times torch.ops.paged_attn.v2 of one checkout (its own built _C) on vLLM's layout with K / V
read from DRAM: a cache-sized buffer is read before every timed call, as in a real decode step.
For A/B comparisons of two builds of the CPU kernel: run it alternately on both checkouts, in
separate processes, on a quiet machine, and compare within a round.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python scripts/bench/bench_checkout.py /path/to/checkout \
        --dtype float32 --ctx 4096

A warm loop (the same call repeated, K / V in cache) hides regressions in how the kernel streams
K / V from memory; this one does not (docs/PERFORMANCE.md, "Regression checks").
Shape: Llama-3-8B-like by default, batch 8 (--batch), 32 query / 8 KV heads (--heads,
--kv-heads), head 128 (--head), block 16, a random block table; Qwen-like is
--batch 1 --heads 24 --kv-heads 4 --head 256 --ctx 16384.
"""

import argparse
import os
import statistics
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="repository root whose paged_attention_ext (and _C) to time")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=32, help="query heads")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head", type=int, default=128, help="head size")
    ap.add_argument("--calls", type=int, default=15)
    args = ap.parse_args()

    root = os.path.abspath(args.checkout)
    sys.path.insert(0, root)
    os.environ["PAGED_ATTN_REQUIRE_EXTENSION"] = "1"  # its _C or an error, never the fallback
    import torch

    import paged_attention_ext as pa
    if not os.path.abspath(pa.__file__).startswith(root + os.sep) or getattr(pa, "_C", None) is None:
        sys.exit(f"{pa.__file__}: not the compiled extension of {root}")

    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    batch, heads, kv_heads, head, block = args.batch, args.heads, args.kv_heads, args.head, 16
    blocks = batch * (args.ctx // block)
    x = 16 // dtype.itemsize
    key_cache = torch.randn(blocks, kv_heads, head // x, block, x, dtype=dtype)
    value_cache = torch.randn(blocks, kv_heads, head, block, dtype=dtype)
    block_tables = torch.randperm(blocks, dtype=torch.int32).view(batch, -1)
    seq_lens = torch.full((batch,), args.ctx, dtype=torch.int32)
    query = torch.randn(batch, heads, head, dtype=dtype)
    out = torch.empty_like(query)
    partitions = (args.ctx + pa.PARTITION_SIZE - 1) // pa.PARTITION_SIZE
    exp_sums = torch.empty(batch, heads, partitions)
    max_logits = torch.empty(batch, heads, partitions)
    tmp_out = torch.empty(batch, heads, partitions, head, dtype=dtype)
    scale = torch.ones(())
    flush = torch.ones(16 * 2**20)  # 64 MiB: twice this machine's last-level cache

    def call():
        torch.ops.paged_attn.v2(out, exp_sums, max_logits, tmp_out, query, key_cache,
                                value_cache, kv_heads, head**-0.5, block_tables, seq_lens,
                                block, args.ctx, None, "auto", scale, scale, 0, 0, 0, 64, 0)

    call()
    times = []
    for _ in range(args.calls):
        flush.sum()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(f"{root}: {args.dtype} batch {batch} {heads}/{kv_heads}h d{head} ctx {args.ctx}: "
          f"{statistics.median(times) * 1e3:.2f} ms (median of {args.calls}), "
          f"threads {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
