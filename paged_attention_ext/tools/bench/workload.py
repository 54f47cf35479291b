"""The data of one benchmark shape: a paged KV cache with a shuffled block pool, queries, and the
byte count the GB/s figures use.

Layouts (docs/CONTRACT.md), chosen by kv_layout:
  query        [batch, heads, head]
  "vllm"  key_cache    [num_blocks, kv_heads, head // x, block, x]   (v1 / v2)
          value_cache  [num_blocks, kv_heads, head, block]
  "nhd"   key_cache, value_cache  [num_blocks, block, kv_heads, head]   (decode)
  "hnd"   the same view of caches stored [num_blocks, kv_heads, block, head]   (decode)
  block_tables int32 [batch, ceil(ctx / block)]  (a random permutation of the pool: no locality)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .presets import Shape

KV_LAYOUTS = ("vllm", "nhd", "hnd")
FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn,
              "fp8_e5m2": torch.float8_e5m2}
# Scales that keep N(0,1) data well inside each fp8 format's range.
_FP8_SCALE = {"fp8": 0.05, "fp8_e4m3": 0.05, "fp8_e5m2": 0.05}


@dataclass
class Workload:
    shape: Shape
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float
    kv_cache_dtype: str
    k_scale: float
    v_scale: float
    kv_layout: str = "vllm"
    # vLLM's (tp_rank, local_blocks, vert_stride, block_size, head_sliding_step), or None: dense
    blocksparse: Optional[tuple] = None

    def blocksparse_args(self) -> tuple:
        """The five trailing v1 / v2 arguments (dense: vLLM's defaults)."""
        return self.blocksparse or (0, 0, 0, 64, 0)
    @property
    def max_seq_len(self) -> int:
        return self.shape.ctx

    def bytes_moved(self) -> int:
        """Bytes a decode step must move at least: K and V of every token once (fp8: 1 byte an
        element), the query read once and the output written once. Blocksparse: only the tokens
        of cache blocks some query head of the KV head attends (a kernel must not read the rest)."""
        s = self.shape
        cache_elt = self.key_cache.element_size()
        kv = 2 * s.batch * self.kv_tokens_read() * s.head * cache_elt
        q_and_out = 2 * s.batch * s.heads * s.head * self.query.element_size()
        return kv + q_and_out


    def kv_tokens_read(self) -> int:
        """Tokens x KV heads of one sequence a kernel must read (every sequence is ctx long)."""
        s = self.shape
        if self.blocksparse is None:
            return s.ctx * s.kv_heads
        from ...reference import blocksparse_keep
        from ...validation import Blocksparse
        keep = blocksparse_keep(Blocksparse(*self.blocksparse), s.ctx, s.block, s.heads,
                                s.kv_heads)                       # [heads, blocks]
        read = keep.reshape(s.kv_heads, s.heads // s.kv_heads, -1).any(dim=1)  # [kv_heads, blocks]
        tokens = torch.full((read.shape[1],), s.block)
        tokens[-1] = s.ctx - s.block * (read.shape[1] - 1)       # the last block's tokens
        return int((read * tokens).sum())


def _random_cache(shape, dtype, kv_cache_dtype, scale, device, gen):
    """N(0,1) values in the cache's storage: the dtype itself, or fp8 bytes of value / scale."""
    values = torch.randn(shape, generator=gen, device=device,
                         dtype=torch.float32 if kv_cache_dtype != "auto" else dtype)
    if kv_cache_dtype == "auto":
        return values
    fp8 = FP8_DTYPES[kv_cache_dtype]
    fmax = torch.finfo(fp8).max
    return (values / scale).clamp(-fmax, fmax).to(fp8).view(torch.uint8)


def _cache_shapes(shape: Shape, num_blocks: int, x: int, kv_layout: str):
    """(key shape, value shape) as stored, and a function turning a stored cache into the view
    the op takes."""
    b, h, d, bs = num_blocks, shape.kv_heads, shape.head, shape.block
    if kv_layout == "vllm":
        return (b, h, d // x, bs, x), (b, h, d, bs), lambda t: t
    if kv_layout == "nhd":
        return (b, bs, h, d), (b, bs, h, d), lambda t: t
    return (b, h, bs, d), (b, h, bs, d), lambda t: t.transpose(1, 2)  # hnd


def make_workload(shape: Shape, dtype: torch.dtype, kv_cache_dtype: str, device: str,
                  seed: int = 0, spare_blocks: Optional[int] = None,
                  kv_layout: str = "vllm", blocksparse: Optional[tuple] = None) -> Workload:
    if kv_cache_dtype != "auto" and kv_cache_dtype not in FP8_DTYPES:
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")
    if blocksparse is not None and kv_layout != "vllm":
        raise ValueError("blocksparse attention is an argument of v1 / v2 (kv_layout vllm)")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"unknown kv_layout {kv_layout!r}; choose from {', '.join(KV_LAYOUTS)}")
    gen = torch.Generator(device=device).manual_seed(seed)
    elt = 1 if kv_cache_dtype != "auto" else torch.empty((), dtype=dtype).element_size()
    x = 16 // elt
    if kv_layout == "vllm" and shape.head % x:
        raise ValueError(f"head size {shape.head} must be divisible by x = {x}")
    blocks_per_seq = math.ceil(shape.ctx / shape.block)
    used = shape.batch * blocks_per_seq
    num_blocks = used + (spare_blocks if spare_blocks is not None else max(1, used // 16))
    k_scale = v_scale = _FP8_SCALE.get(kv_cache_dtype, 1.0)

    k_shape, v_shape, view = _cache_shapes(shape, num_blocks, x, kv_layout)
    key_cache = view(_random_cache(k_shape, dtype, kv_cache_dtype, k_scale, device, gen))
    value_cache = view(_random_cache(v_shape, dtype, kv_cache_dtype, v_scale, device, gen))
    # Each sequence gets distinct random blocks of the pool.
    perm = torch.randperm(num_blocks, generator=gen, device=device)[:used]
    block_tables = perm.reshape(shape.batch, blocks_per_seq).to(torch.int32).contiguous()
    seq_lens = torch.full((shape.batch,), shape.ctx, dtype=torch.int32, device=device)
    query = torch.randn(shape.batch, shape.heads, shape.head, generator=gen, device=device,
                        dtype=torch.float32).to(dtype)
    return Workload(shape, query, key_cache, value_cache, block_tables, seq_lens,
                    1.0 / math.sqrt(shape.head), kv_cache_dtype, k_scale, v_scale, kv_layout,
                    blocksparse)


def decode(cache: torch.Tensor, work: Workload, scale: float) -> torch.Tensor:
    """Cache elements as the query dtype (fp8 bytes decoded and scaled)."""
    if work.kv_cache_dtype == "auto":
        return cache
    values = cache.view(FP8_DTYPES[work.kv_cache_dtype]).to(torch.float32) * scale
    return values.to(work.query.dtype)
