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

from ...core import cache_kind, cache_storage_dtype, decode_cache, encode_cache, key_chunk_elements
from ...validation import DENSE
from .presets import Shape

KV_LAYOUTS = ("vllm", "nhd", "hnd")
# A scale that keeps N(0,1) data well inside every fp8 format's range.
_FP8_SCALE = 0.05


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
        """The five trailing v1 / v2 arguments (dense: their defaults)."""
        return self.blocksparse or tuple(DENSE)
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
    kind = cache_kind(kv_cache_dtype, "bench")
    values = torch.randn(shape, generator=gen, device=device,
                         dtype=torch.float32 if kind != "auto" else dtype)
    return encode_cache(values, kind, scale)


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
    kind = cache_kind(kv_cache_dtype, "bench")
    if blocksparse is not None and kv_layout != "vllm":
        raise ValueError("blocksparse attention is an argument of v1 / v2 (kv_layout vllm)")
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"unknown kv_layout {kv_layout!r}; choose from {', '.join(KV_LAYOUTS)}")
    gen = torch.Generator(device=device).manual_seed(seed)
    x = key_chunk_elements(cache_storage_dtype(kind, dtype))
    if kv_layout == "vllm" and shape.head % x:
        raise ValueError(f"head size {shape.head} must be divisible by x = {x}")
    blocks_per_seq = math.ceil(shape.ctx / shape.block)
    used = shape.batch * blocks_per_seq
    num_blocks = used + (spare_blocks if spare_blocks is not None else max(1, used // 16))
    k_scale = v_scale = 1.0 if kind == "auto" else _FP8_SCALE

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
    kind = cache_kind(work.kv_cache_dtype, "bench")
    if kind == "auto":
        return cache
    return decode_cache(cache, kind, scale).to(work.query.dtype)
