"""Time the CUDA paged attention kernels against SDPA and the oracle on one GPU.

For each shape: torch.ops.paged_attn.v2 and .v1 (shuffled block table), SDPA on the same K/V laid
out contiguously ([batch, kv_heads, ctx, head_size]; flash backend when it accepts the call, else
the backend torch picks, named in the table), and the oracle (paged_attention_ext.reference,
pure PyTorch, few runs). Times are CUDA-event medians after warm-up. GB/s counts the bytes that
must move: K and V of every token once, plus q and out. "% copy" compares with a device-to-device
copy measured in the same run (read + write bytes / time).

    python scripts/bench_cuda.py [--out results.md] [--iters 50] [--quick]
"""

import argparse
import math
import statistics
import sys
import time

import torch

import paged_attention_ext  # noqa: F401  (registers torch.ops.paged_attn)
from paged_attention_ext import reference

# (name, batch, num_heads, num_kv_heads, head_size, ctx, block_size, dtype)
SHAPES = [
    ("Llama-3-8B GQA 32/8 d128, batch 64 x ctx 4k, bf16", 64, 32, 8, 128, 4096, 16, torch.bfloat16),
    ("Llama-3-8B GQA 32/8 d128, batch 1 x ctx 100k, bf16", 1, 32, 8, 128, 100_000, 16,
     torch.bfloat16),
    ("Llama-3-8B GQA 32/8 d128, batch 8 x ctx 4k, fp16", 8, 32, 8, 128, 4096, 16, torch.float16),
    ("MHA 32/32 d128, batch 64 x ctx 1k, fp16", 64, 32, 32, 128, 1024, 16, torch.float16),
]
PARTITION = 512


def cuda_time_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs(iters):
    n = 1 << 30  # 1 GiB
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), iters)
    return 2 * n / (ms * 1e-3) / 1e9


def make_inputs(batch, heads, kv_heads, d, ctx, bs, dtype):
    """Paged inputs on the GPU (shuffled block ids), and the same K/V contiguous for SDPA."""
    x = 16 // torch.empty((), dtype=dtype).element_size()
    blocks_per_seq = math.ceil(ctx / bs)
    num_blocks = batch * blocks_per_seq
    key_cache = torch.randn(num_blocks, kv_heads, d // x, bs, x, dtype=dtype, device="cuda")
    value_cache = torch.randn(num_blocks, kv_heads, d, bs, dtype=dtype, device="cuda")
    perm = torch.randperm(num_blocks, device="cuda", dtype=torch.int64)
    block_tables = perm.view(batch, blocks_per_seq).to(torch.int32)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    query = torch.randn(batch, heads, d, dtype=dtype, device="cuda")
    # contiguous K/V [batch, kv_heads, ctx, d] for SDPA
    ids = block_tables.long()  # [batch, blocks_per_seq]
    k = key_cache[ids]  # [batch, nb, kvh, d/x, bs, x]
    k = k.permute(0, 2, 1, 4, 3, 5).reshape(batch, kv_heads, blocks_per_seq * bs, d)[:, :, :ctx]
    v = value_cache[ids].permute(0, 2, 1, 4, 3).reshape(batch, kv_heads, blocks_per_seq * bs, d)
    v = v[:, :, :ctx]
    return dict(query=query, key_cache=key_cache, value_cache=value_cache,
                block_tables=block_tables, seq_lens=seq_lens, k=k.contiguous(), v=v.contiguous())


def sdpa_call(q, k, v):
    """SDPA on contiguous K/V: flash backend if it accepts the GQA call, else torch's choice."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q4 = q[:, :, None, :]  # [batch, heads, 1, d]
    for backend, name in ((SDPBackend.FLASH_ATTENTION, "flash"), (None, "auto")):
        def fn(backend=backend):
            if backend is None:
                return torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True)
        try:
            fn()
            torch.cuda.synchronize()
            return fn, name
        except RuntimeError:
            continue
    return None, "unavailable"


def bench_shape(shape, iters, oracle_iters):
    name, batch, heads, kvh, d, ctx, bs, dtype = shape
    t = make_inputs(batch, heads, kvh, d, ctx, bs, dtype)
    elem = torch.empty((), dtype=dtype).element_size()
    bytes_moved = 2 * batch * ctx * kvh * d * elem + 2 * batch * heads * d * elem
    parts = math.ceil(ctx / PARTITION)
    out = torch.empty(batch, heads, d, dtype=dtype, device="cuda")
    exp_sums = torch.empty(batch, heads, parts, dtype=torch.float32, device="cuda")
    max_logits = torch.empty_like(exp_sums)
    tmp_out = torch.empty(batch, heads, parts, d, dtype=dtype, device="cuda")
    scale = 1.0 / math.sqrt(d)
    args = (t["query"], t["key_cache"], t["value_cache"], kvh, scale, t["block_tables"],
            t["seq_lens"], bs, ctx, None)
    ops = torch.ops.paged_attn
    rows = []

    def record(impl, ms, note=""):
        gbs = bytes_moved / (ms * 1e-3) / 1e9 if ms else float("nan")
        rows.append((name, impl, ms, gbs, note))

    record("paged_attn.v2", cuda_time_ms(lambda: ops.v2(out, exp_sums, max_logits, tmp_out, *args),
                                         iters))
    record("paged_attn.v1", cuda_time_ms(lambda: ops.v1(out, *args), iters))
    fn, backend = sdpa_call(t["query"] * 1.0, t["k"], t["v"])
    if fn is not None:
        record("SDPA contiguous KV", cuda_time_ms(fn, iters), backend)
    ref_out = torch.empty_like(out)
    record("oracle (reference.py)",
           cuda_time_ms(lambda: reference.paged_attention_v1(ref_out, *args), oracle_iters, 1))
    # agreement check (not a test: the tests are tests/test_cuda_kernels.py)
    ops.v2(out, exp_sums, max_logits, tmp_out, *args)
    err = (out.float() - ref_out.float()).abs().max().item()
    rows.append((name, "max |v2 - oracle|", None, None, f"{err:.3g}"))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="write the markdown table here too")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="first two shapes, fewer runs")
    a = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cuda.py: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    iters = 10 if a.quick else a.iters
    shapes = SHAPES[:2] if a.quick else SHAPES
    t0 = time.time()
    copy_gbs = copy_bandwidth_gbs(iters)
    lines = [f"# CUDA paged attention benchmark ({torch.cuda.get_device_name()})", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}; copy bandwidth (read+write, "
             f"1 GiB D2D): {copy_gbs:.0f} GB/s; median of {iters} runs (oracle: 3)", "",
             "| shape | implementation | ms | GB/s | % copy | note |",
             "|---|---|---|---|---|---|"]
    for shape in shapes:
        for name, impl, ms, gbs, note in bench_shape(shape, iters, 3):
            if ms is None:
                lines.append(f"| {name} | {impl} | | | | {note} |")
            else:
                lines.append(f"| {name} | {impl} | {ms:.3f} | {gbs:.0f} | "
                             f"{100 * gbs / copy_gbs:.0f}% | {note} |")
            print(lines[-1], flush=True)
    lines += ["", f"total wall time {time.time() - t0:.0f} s"]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
