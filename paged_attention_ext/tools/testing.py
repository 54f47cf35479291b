"""Test inputs and comparisons shared by the tests, the CLI and the benchmarks.

make_attention_inputs builds inputs that make a wrong kernel fail loudly:
- q, k, v ~ N(0, 1) with scale 1/sqrt(head_size): a sharp softmax (a wrong key layout or a
  wrong token order changes the output by O(1), unlike vLLM's near-uniform test inputs);
- a shuffled block table (sequences own scattered blocks) whose entries past each row's used
  blocks are garbage, including -1 and ids >= num_blocks;
- NaN in every cache slot no sequence uses (the tail of each last block and all unused blocks;
  fp8 caches: the NaN byte 0x7F), so reading one shows up as NaN in the output;
- fp8 caches quantised with k_scale, v_scale != 1 (a kernel ignoring the scale fails);
- optionally a query that is a slice of a wider fused qkv tensor (stride(0) > num_heads*head_size)
  whose other columns are NaN.
Outputs are allocated pre-filled with NaN to prove every element that must be written is written.
make_decode_inputs gives the same inputs for decode, the caches NHD-ordered and laid out NHD, HND
(a transposed view), combined K/V, or with padded strides (DECODE_LAYOUTS).
"""

import contextlib
import dataclasses
import math
import os
from typing import List, NamedTuple, Optional, Union

import torch

from ..core import FP8_DTYPES  # cache kind -> torch fp8 dtype (tests take it from here)
from ..core import PARTITION_SIZE, cache_storage_dtype, encode_cache, key_chunk_elements
from .. import op_args
from ..validation import BLOCKSPARSE_ARGS, DENSE, parse_kv_cache_dtype

# NaN as an fp8 byte: 0x7F is NaN in both float8_e4m3fn (S.1111.111) and float8_e5m2 (S.11111.11).
FP8_NAN_BYTE = 0x7F
FP8_K_SCALE = 0.37  # != 1 so that a kernel ignoring the scales is caught
FP8_V_SCALE = 1.9

Scale = Union[float, torch.Tensor]


@dataclasses.dataclass
class AttentionInputs:
    query: torch.Tensor  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor  # [num_blocks, num_kv_heads, head_size/x, block_size, x]
    value_cache: torch.Tensor  # [num_blocks, num_kv_heads, head_size, block_size]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    num_kv_heads: int
    scale: float
    block_size: int
    max_seq_len: int
    alibi_slopes: Optional[torch.Tensor]  # float32 [num_heads] or None
    kv_cache_dtype: str
    k_scale: Scale
    v_scale: Scale
    # shape facts
    num_seqs: int
    num_heads: int
    head_size: int
    num_blocks: int
    seq_lens_list: List[int]
    dtype: torch.dtype  # query / out dtype


class V2Outputs(NamedTuple):
    out: torch.Tensor  # [num_seqs, num_heads, head_size], query dtype
    exp_sums: torch.Tensor  # [num_seqs, num_heads, max_num_partitions], float32
    max_logits: torch.Tensor  # [num_seqs, num_heads, max_num_partitions], float32
    tmp_out: torch.Tensor  # [num_seqs, num_heads, max_num_partitions, head_size], query dtype


def num_partitions(seq_len):
    """Number of 512-token v2 partitions of a row (0 for an empty row)."""
    return math.ceil(seq_len / PARTITION_SIZE)


def make_attention_inputs(num_seqs, num_heads, num_kv_heads, head_size, block_size, seq_lens,
                          dtype=torch.float32, kv_cache_dtype="auto", use_alibi=False,
                          device="cpu", seed=0, extra_blocks=3, poison=True,
                          noncontig_query=False, scale_as_tensor=False):
    """Random paged-attention inputs (see the module docstring). seq_lens: list of num_seqs ints.
    extra_blocks: cache blocks no sequence uses (poisoned). scale_as_tensor: k_scale / v_scale as
    0-dim float32 tensors on `device` (as current vLLM passes them) instead of floats."""
    assert len(seq_lens) == num_seqs
    kind = parse_kv_cache_dtype("testing", kv_cache_dtype)
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731

    # Block ownership: sequence s owns blocks_per_seq[s] blocks drawn from a shuffled pool.
    blocks_per_seq = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = max(1, sum(blocks_per_seq) + extra_blocks)
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    max_blocks_per_seq = max(blocks_per_seq, default=0) + 2  # >= 2 garbage columns per row
    # Garbage everywhere first: values in [-1, num_blocks + 16), i.e. -1, valid ids of other
    # sequences, and ids past the pool; each row's first garbage entry is forced out of range.
    table = torch.randint(-1, num_blocks + 16, (num_seqs, max_blocks_per_seq), generator=gen)
    owned = []
    for s, nb in enumerate(blocks_per_seq):
        ids, pool = pool[:nb], pool[nb:]
        owned.append(ids)
        table[s, :nb] = torch.tensor(ids, dtype=table.dtype)
        table[s, nb] = -1 if s % 2 == 0 else num_blocks + s
    block_tables = table.to(torch.int32)

    # Caches: values ~ N(0, 1); fp8 caches hold fp8(value / scale).
    cache_dtype = cache_storage_dtype(kind, dtype)
    x = key_chunk_elements(cache_dtype)
    k_values = randn(num_blocks, num_kv_heads, head_size // x, block_size, x)
    v_values = randn(num_blocks, num_kv_heads, head_size, block_size)
    if kind == "auto":
        k_scale, v_scale = 1.0, 1.0
        key_cache, value_cache = k_values.to(dtype), v_values.to(dtype)
        nan = float("nan")
    else:
        k_scale, v_scale = FP8_K_SCALE, FP8_V_SCALE
        key_cache = encode_cache(k_values, kind, k_scale)
        value_cache = encode_cache(v_values, kind, v_scale)
        nan = FP8_NAN_BYTE

    if poison:
        used = set()
        for s, ids in enumerate(owned):
            for j, b in enumerate(ids):
                first_unused = min(block_size, seq_lens[s] - j * block_size)
                key_cache[b, :, :, first_unused:, :] = nan
                value_cache[b, :, :, first_unused:] = nan
                used.add(b)
        for b in range(num_blocks):
            if b not in used:
                key_cache[b] = nan
                value_cache[b] = nan

    query = randn(num_seqs, num_heads, head_size).to(dtype)
    if noncontig_query:
        # A slice of a fused [num_seqs, (num_heads + 2*num_kv_heads) * head_size] qkv tensor.
        qkv = torch.full((num_seqs, (num_heads + 2 * num_kv_heads) * head_size),
                         float("nan") if poison else 0.0, dtype=dtype)
        qkv[:, :num_heads * head_size] = query.reshape(num_seqs, -1)
        query = qkv.to(device)[:, :num_heads * head_size].view(num_seqs, num_heads, head_size)

    alibi_slopes = None
    if use_alibi:
        # Slopes up to 4 / longest row: the bias moves logits by at most ~4 over a row, so every
        # partition still matters (realistic slopes up to 0.5 would mute all but the last one).
        alibi_slopes = torch.rand(num_heads, generator=gen) * 4.0 / max(1, max(seq_lens, default=1))
        alibi_slopes = alibi_slopes.to(device)

    if scale_as_tensor:
        k_scale = torch.tensor(k_scale, dtype=torch.float32, device=device)
        v_scale = torch.tensor(v_scale, dtype=torch.float32, device=device)

    return AttentionInputs(
        query=query.to(device), key_cache=key_cache.to(device), value_cache=value_cache.to(device),
        block_tables=block_tables.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        num_kv_heads=num_kv_heads, scale=1.0 / math.sqrt(head_size), block_size=block_size,
        max_seq_len=max(seq_lens, default=0), alibi_slopes=alibi_slopes,
        kv_cache_dtype=kv_cache_dtype, k_scale=k_scale, v_scale=v_scale, num_seqs=num_seqs,
        num_heads=num_heads, head_size=head_size, num_blocks=num_blocks,
        seq_lens_list=list(seq_lens), dtype=dtype)


CACHE_LAYOUTS = ("blocks_interleaved", "head_padding")


def strided_cache_view(cache, layout):
    """cache (same values, same device) as a view into a bigger NaN-filled tensor: outer strides
    the contract allows that no contiguous tensor has. 'blocks_interleaved': block b is slot 0 of
    block b of a [num_blocks, 2, ...] tensor (K and V of a block side by side); 'head_padding':
    one unused head after the real ones."""
    fill = float("nan") if cache.is_floating_point() else FP8_NAN_BYTE
    n, kvh = cache.shape[:2]
    if layout == "blocks_interleaved":
        big = torch.full((n, 2, kvh) + tuple(cache.shape[2:]), fill, dtype=cache.dtype,
                         device=cache.device)
        view = big[:, 0]
    elif layout == "head_padding":
        big = torch.full((n, kvh + 1) + tuple(cache.shape[2:]), fill, dtype=cache.dtype,
                         device=cache.device)
        view = big[:, :kvh]
    else:
        raise ValueError(f"unknown layout {layout!r}; choose from {CACHE_LAYOUTS}")
    view.copy_(cache)
    return view


def with_strided_caches(inputs, layout):
    """inputs with key_cache and value_cache replaced by strided_cache_view copies."""
    return dataclasses.replace(inputs, key_cache=strided_cache_view(inputs.key_cache, layout),
                               value_cache=strided_cache_view(inputs.value_cache, layout))


def alloc_v1_outputs(inputs, fill=float("nan")):
    """out [num_seqs, num_heads, head_size] in the query dtype, pre-filled with `fill`."""
    return torch.full((inputs.num_seqs, inputs.num_heads, inputs.head_size), fill,
                      dtype=inputs.dtype, device=inputs.query.device)


def alloc_v2_outputs(inputs, max_num_partitions=None, fill=float("nan")):
    """V2Outputs pre-filled with `fill`; max_num_partitions defaults to the longest row's
    partition count (at least 1)."""
    if max_num_partitions is None:
        max_num_partitions = max(1, max(map(num_partitions, inputs.seq_lens_list), default=0))
    s, h, d = inputs.num_seqs, inputs.num_heads, inputs.head_size
    dev = inputs.query.device
    return V2Outputs(
        out=alloc_v1_outputs(inputs, fill),
        exp_sums=torch.full((s, h, max_num_partitions), fill, dtype=torch.float32, device=dev),
        max_logits=torch.full((s, h, max_num_partitions), fill, dtype=torch.float32, device=dev),
        tmp_out=torch.full((s, h, max_num_partitions, d), fill, dtype=inputs.dtype, device=dev))


def _attention_args(inputs, blocksparse=DENSE):
    """The arguments after the outputs, in the schema's order (op_args.V1Args): the inputs'
    fields of those names, then blocksparse (a validation.Blocksparse; default off)."""
    names = [n for n in op_args.V1Args._fields[1:] if n not in BLOCKSPARSE_ARGS]
    return (*(getattr(inputs, n) for n in names), *blocksparse)


def call_v1(op_or_fn, inputs, out, blocksparse=DENSE):
    """op_or_fn: torch.ops.paged_attn.v1 or reference.paged_attention_v1 (same argument order)."""
    op_or_fn(out, *_attention_args(inputs, blocksparse))
    return out


def call_v2(op_or_fn, inputs, outputs, blocksparse=DENSE):
    """op_or_fn: torch.ops.paged_attn.v2 or reference.paged_attention_v2; outputs: V2Outputs."""
    op_or_fn(*outputs, *_attention_args(inputs, blocksparse))
    return outputs


# Tolerances for an implementation vs the oracle (or the oracle vs float64), both computing in
# fp32 and rounding out once to `dtype`. eps = torch.finfo(dtype).eps.
# - fp16 / bf16: dominated by rounding to the output dtype: <= eps/2 relative to |out|, plus the
#   same again if an implementation rounds tmp_out (phase 2 reads it back) or the probabilities
#   (vLLM's P.V in the query dtype) to the dtype; |out| is a convex combination of N(0,1) values
#   (|out| <~ 4). 4 * eps covers those three roundings with margin: fp16 3.9e-3, bf16 3.1e-2.
# - fp32: fp32 accumulation in a different order over up to a few thousand tokens (~sqrt(n)*eps
#   ~ 5e-6 typical) and fast exp (a few ulp): 2e-5 (~170 eps).
# - fp8 caches add nothing: both sides decode the same bytes exactly to fp32 (times the scale),
#   so the query dtype decides.
# The fp32 softmax statistics (exp_sums, max_logits) get the fp32 bound scaled by 5 (sums of up
# to 512 exp terms in any order), whatever the query dtype.
def tolerances(dtype, kv_cache_dtype="auto"):
    """(atol, rtol) for comparing `out` / `tmp_out` of query dtype `dtype`."""
    parse_kv_cache_dtype("testing", kv_cache_dtype)  # rejects unknown strings
    if dtype == torch.float32:
        return 2e-5, 2e-5
    eps = torch.finfo(dtype).eps
    return 4 * eps, 4 * eps


STATS_TOLERANCES = (1e-4, 1e-4)  # (atol, rtol) for exp_sums / max_logits


def partition_mask(seq_lens, max_num_partitions, device):
    """bool [num_seqs, max_num_partitions]: True for the partitions p < ceil(seq_len / 512)."""
    counts = torch.tensor([num_partitions(n) for n in seq_lens], device=device)
    return torch.arange(max_num_partitions, device=device)[None, :] < counts[:, None]


def assert_out_matches(actual, expected, dtype, kv_cache_dtype="auto", name="out"):
    """Compare an output with the expected one (NaN anywhere in `actual` fails)."""
    atol, rtol = tolerances(dtype, kv_cache_dtype)
    expected = expected.to(actual.device)
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol,
                               msg=lambda m: f"{name}: {m}")


def assert_v2_matches(actual, expected, seq_lens, dtype, kv_cache_dtype="auto"):
    """Compare V2Outputs: out everywhere; exp_sums / max_logits / tmp_out only in the partitions
    p < ceil(seq_len / 512) of each row (the rest is not part of the contract)."""
    assert_out_matches(actual.out, expected.out, dtype, kv_cache_dtype)
    device = actual.out.device
    num_heads = actual.out.shape[1]
    mask = partition_mask(seq_lens, actual.tmp_out.shape[2], device)  # [num_seqs, P]
    mask = mask[:, None, :].expand(-1, num_heads, -1)  # [num_seqs, num_heads, P]
    expected = V2Outputs(*(t.to(device) for t in expected))
    s_atol, s_rtol = STATS_TOLERANCES
    for name in ("exp_sums", "max_logits"):
        torch.testing.assert_close(getattr(actual, name)[mask].double(),
                                   getattr(expected, name)[mask].double(), atol=s_atol,
                                   rtol=s_rtol, msg=lambda m, n=name: f"{n}: {m}")
    assert_out_matches(actual.tmp_out[mask], expected.tmp_out[mask], dtype, kv_cache_dtype,
                       name="tmp_out")


# ---- NHD / HND caches: decode and reshape_and_cache_flash ----

# How a test lays out the NHD-ordered caches decode reads (every one a view, never a copy):
#   nhd:          K and V each a contiguous [num_blocks, block_size, num_kv_heads, head_size]
#   hnd:          K and V each a contiguous [num_blocks, num_kv_heads, block_size, head_size],
#                 passed as cache.transpose(1, 2)
#   combined:     one [num_blocks, 2, block_size, num_kv_heads, head_size], passed as kv[:, 0],
#                 kv[:, 1]
#   combined_hnd: one [num_blocks, 2, num_kv_heads, block_size, head_size], passed as
#                 kv[:, 0].transpose(1, 2), kv[:, 1].transpose(1, 2)
#   mixed:        K NHD, V HND (K and V with different strides)
#   padded:       NHD inside a NaN-filled [num_blocks + 1, block_size, num_kv_heads + 1,
#                 head_size + 8] tensor (every outer stride unusual, the padding poisoned)
DECODE_LAYOUTS = ("nhd", "hnd", "combined", "combined_hnd", "mixed", "padded")


@dataclasses.dataclass
class DecodeInputs:
    query: torch.Tensor  # [num_seqs, num_heads, head_size]
    key_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size] (a view)
    value_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size] (a view)
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]
    scale: float
    alibi_slopes: Optional[torch.Tensor]  # float32 [num_heads] or None
    kv_cache_dtype: str
    k_scale: Scale
    v_scale: Scale
    layout: str  # one of DECODE_LAYOUTS
    storage: tuple  # the tensor(s) the cache views live in
    legacy: AttentionInputs  # the same K/V, query, tables in v1's layout (v1 on it = decode)
    # shape facts
    num_seqs: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    num_blocks: int
    seq_lens_list: List[int]
    dtype: torch.dtype  # query / out dtype


def legacy_to_nhd(key_cache, value_cache):
    """v1's caches -> the same values NHD-ordered, contiguous:
    key_cache [nb, kvh, d/x, bs, x] and value_cache [nb, kvh, d, bs] -> [nb, bs, kvh, d] each."""
    nb, kvh, dx, bs, x = key_cache.shape
    k = key_cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, kvh, dx * x)
    v = value_cache.permute(0, 3, 1, 2).contiguous()
    return k.contiguous(), v


def nhd_cache_views(k_nhd, v_nhd, layout):
    """(key view, value view, storage tuple): k_nhd / v_nhd [nb, bs, kvh, d] copied into the
    storage `layout` names (DECODE_LAYOUTS) and seen through NHD-ordered views of it. Storage
    the views do not cover holds NaN (fp8: the NaN byte)."""
    fill = float("nan") if k_nhd.is_floating_point() else FP8_NAN_BYTE
    nb, bs, kvh, d = k_nhd.shape
    full = lambda *shape: torch.full(shape, fill, dtype=k_nhd.dtype, device=k_nhd.device)  # noqa: E731
    if layout == "nhd":
        storage = (full(nb, bs, kvh, d), full(nb, bs, kvh, d))
        views = storage
    elif layout == "hnd":
        storage = (full(nb, kvh, bs, d), full(nb, kvh, bs, d))
        views = tuple(t.transpose(1, 2) for t in storage)
    elif layout == "combined":
        storage = (full(nb, 2, bs, kvh, d),)
        views = (storage[0][:, 0], storage[0][:, 1])
    elif layout == "combined_hnd":
        storage = (full(nb, 2, kvh, bs, d),)
        views = (storage[0][:, 0].transpose(1, 2), storage[0][:, 1].transpose(1, 2))
    elif layout == "mixed":
        storage = (full(nb, bs, kvh, d), full(nb, kvh, bs, d))
        views = (storage[0], storage[1].transpose(1, 2))
    elif layout == "padded":
        storage = (full(nb + 1, bs, kvh + 1, d + 8), full(nb + 1, bs, kvh + 1, d + 8))
        views = tuple(t[1:, :, 1:, 4:4 + d] for t in storage)
    else:
        raise ValueError(f"unknown layout {layout!r}; choose from {DECODE_LAYOUTS}")
    views[0].copy_(k_nhd)
    views[1].copy_(v_nhd)
    return views[0], views[1], storage


def make_decode_inputs(num_seqs, num_heads, num_kv_heads, head_size, block_size, seq_lens,
                       layout="nhd", dtype=torch.float32, kv_cache_dtype="auto", use_alibi=False,
                       device="cpu", seed=0, extra_blocks=3, poison=True, noncontig_query=False,
                       scale_as_tensor=False):
    """Random decode inputs: make_attention_inputs' (shuffled block tables with garbage past
    each row's blocks, NaN in every unused slot and block, fp8 scales != 1, ...) with the caches
    converted to NHD order and laid out as `layout` says (DECODE_LAYOUTS). head_size must be a
    multiple of v1's x (16 bytes) so that `legacy` holds the same K/V in v1's layout."""
    legacy = make_attention_inputs(num_seqs, num_heads, num_kv_heads, head_size, block_size,
                                   seq_lens, dtype=dtype, kv_cache_dtype=kv_cache_dtype,
                                   use_alibi=use_alibi, device=device, seed=seed,
                                   extra_blocks=extra_blocks, poison=poison,
                                   noncontig_query=noncontig_query,
                                   scale_as_tensor=scale_as_tensor)
    return decode_inputs_from(legacy, layout)


def decode_inputs_from(legacy, layout):
    """DecodeInputs holding the K/V of `legacy` (AttentionInputs, vLLM's layout) in `layout`
    (DECODE_LAYOUTS), the same query, tables and scales."""
    k_nhd, v_nhd = legacy_to_nhd(legacy.key_cache, legacy.value_cache)
    key_cache, value_cache, storage = nhd_cache_views(k_nhd, v_nhd, layout)
    return DecodeInputs(
        query=legacy.query, key_cache=key_cache, value_cache=value_cache,
        block_tables=legacy.block_tables, seq_lens=legacy.seq_lens, scale=legacy.scale,
        alibi_slopes=legacy.alibi_slopes, kv_cache_dtype=legacy.kv_cache_dtype,
        k_scale=legacy.k_scale, v_scale=legacy.v_scale, layout=layout, storage=storage,
        legacy=legacy, num_seqs=legacy.num_seqs, num_heads=legacy.num_heads,
        num_kv_heads=legacy.num_kv_heads, head_size=legacy.head_size,
        block_size=legacy.block_size, num_blocks=legacy.num_blocks,
        seq_lens_list=list(legacy.seq_lens_list), dtype=legacy.dtype)


# ---- every fp8 byte through one side of attention ----
# Random fp8 caches hold fp8(N(0, 1) / scale): the bytes of a few octaves around the scale, never
# the largest values nor e5m2's infinities. These inputs put all 256 bytes of a format through K
# or through V, with queries that make each byte's decoded value reach an output on its own:
# GQA 16 (4 KV heads, 64 query heads), head 64, fp32 query, one full block of 16 tokens per
# sequence (block s, in order), scale 1, k_scale = v_scale = 1.
EVERY_BYTE_SIDES = ("value", "key")
_EB_BS, _EB_KVH, _EB_HEADS, _EB_D = 16, 4, 64, 64


def every_fp8_byte_inputs(kv_cache_dtype, side, layout="vllm", device="cpu"):
    """(inputs, want): AttentionInputs ("vllm") or DecodeInputs (a DECODE_LAYOUTS name) on
    `device`, and the out any right implementation gives, float64 [S, 64, 64] on the CPU.
    side "value": each sequence attends one token (logit 128 there, 0 elsewhere: p = 1, and
      exp(-128) is 0 in fp32) whose V holds 256 distinct bytes over its KV heads and dims (the
      other tokens' V is 0), a different lane of vLLM's 16-token V vectors per sequence: out
      is the decoded byte, exactly, NaN for the NaN bytes, +-inf for e5m2's.
    side "key": query head h of sequence s reads the K byte 64 s + h at dim 4 (h % 16) + h // 16
      of its KV head, in one token whose V is 1 (the other tokens' K and V are 0), with the
      query 1 / |value| there: logit +-1 (0 for a zero byte), out = e^l / (e^l + 15) in every
      dim, so a byte decoded wrong by more than about 1e-4 (relative) moves out beyond fp32's
      tolerance. The bytes that are not finite are 0 here: one would poison its whole KV head
      through the 0 * NaN (0 * inf) of the other dims; the value side decodes them."""
    kind = parse_kv_cache_dtype("testing", kv_cache_dtype)
    assert kind != "auto" and side in EVERY_BYTE_SIDES, (kv_cache_dtype, side)
    fp8 = FP8_DTYPES[kind]
    byte_of = lambda value: int(torch.tensor([value]).to(fp8).view(torch.uint8))  # noqa: E731
    gqa = _EB_HEADS // _EB_KVH
    attended = [3, 14] if side == "value" else [0, 5, 10, 15]
    num_seqs = len(attended)
    k = torch.zeros(num_seqs, _EB_BS, _EB_KVH, _EB_D, dtype=torch.uint8)  # NHD, block s = seq s
    v = torch.zeros_like(k)
    query = torch.zeros(num_seqs, _EB_HEADS, _EB_D)
    if side == "value":
        v_bytes = (torch.arange(num_seqs * _EB_KVH * _EB_D) % 256).to(torch.uint8)
        v_bytes = v_bytes.view(num_seqs, _EB_KVH, _EB_D)
        for s, t in enumerate(attended):
            k[s, t, :, 0] = byte_of(16.0)
            v[s, t] = v_bytes[s]
        query[:, :, 0] = 8.0
        want = v_bytes.view(fp8).double().repeat_interleave(gqa, dim=1)
    else:
        k_bytes = torch.arange(256).to(torch.uint8).view(num_seqs, _EB_HEADS)
        values = k_bytes.view(fp8).float()
        not_finite = ~values.isfinite()
        k_bytes[not_finite], values[not_finite] = 0, 0.0
        for s, t in enumerate(attended):
            v[s, t] = byte_of(1.0)
            for h in range(_EB_HEADS):
                g, dim = h // gqa, 4 * (h % gqa) + h // gqa
                k[s, t, g, dim] = k_bytes[s, h]
                query[s, h, dim] = 1.0 / abs(values[s, h]) if values[s, h] != 0 else 1.0
        e = torch.exp(values.double().sign())
        want = (e / (e + _EB_BS - 1))[:, :, None].expand(-1, -1, _EB_D).clone()
    x = key_chunk_elements(torch.uint8)
    legacy = AttentionInputs(  # NHD -> [nb, kvh, D / x, bs, x] and [nb, kvh, D, bs]
        query=query.to(device),
        key_cache=k.view(num_seqs, _EB_BS, _EB_KVH, _EB_D // x, x).permute(0, 2, 3, 1, 4)
        .contiguous().to(device),
        value_cache=v.permute(0, 2, 3, 1).contiguous().to(device),
        block_tables=torch.arange(num_seqs, dtype=torch.int32, device=device)[:, None],
        seq_lens=torch.full((num_seqs,), _EB_BS, dtype=torch.int32, device=device),
        num_kv_heads=_EB_KVH,
        scale=1.0, block_size=_EB_BS, max_seq_len=_EB_BS, alibi_slopes=None,
        kv_cache_dtype=kv_cache_dtype, k_scale=1.0, v_scale=1.0, num_seqs=num_seqs,
        num_heads=_EB_HEADS, head_size=_EB_D, num_blocks=num_seqs,
        seq_lens_list=[_EB_BS] * num_seqs, dtype=torch.float32)
    return (legacy if layout == "vllm" else decode_inputs_from(legacy, layout)), want


def decode_args(inputs):
    """decode's arguments after `out`, in the schema's order: the inputs' fields of those names."""
    return tuple(getattr(inputs, n) for n in op_args.DecodeArgs._fields[1:])


def call_decode(op_or_fn, inputs, out):
    """op_or_fn: torch.ops.paged_attn.decode, reference.decode or fallback.decode."""
    op_or_fn(out, *decode_args(inputs))
    return out


# ---- the CUDA attention kernel a call runs (csrc/cuda/kernel_choice.h) ----

CUDA_KERNEL_ENV = "PAGED_ATTN_CUDA_KERNEL"  # read once per process; reloaded below
CUDA_SPLIT_ENV = "PAGED_ATTN_CUDA_SPLIT"  # the v1 / decode split's aim, read with it
CUDA_PDL_ENV = "PAGED_ATTN_CUDA_PDL"  # the reduce's programmatic dependent launch, read with it


def cuda_attention_launches(reload=False):
    """{kernel name: attention launches so far} (_C.cuda_attention_launches: its keys are the
    CUDA attention kernels of this build); {} without a loaded extension or without CUDA kernels.
    reload: the extension reads its CUDA settings (the *_ENV names here) again first."""
    import paged_attention_ext as package  # the package decides whether _C is loaded
    if not package.extension_loaded():
        return {}
    return dict(package._C.cuda_attention_launches(reload))


def on_tensor_cores(dtype, num_heads, num_kv_heads):
    """Whether the "mma" kernel choice runs a call on tensor cores: 16-bit queries with a GQA
    ratio >= 3 (docs/CUDA.md "The tensor-core path"; csrc/cuda/dispatch.cuh uses_tensor_cores
    owns the rule, stated per head tile; the CUDA tests check that the two agree)."""
    return dtype in (torch.float16, torch.bfloat16) and num_heads // num_kv_heads >= 3


def require_launches_of(choice, before, after, tensor_cores_expected=False):
    """AssertionError unless the attention launches between two readings of
    cuda_attention_launches() are those of the kernel choice `choice` (a PAGED_ATTN_CUDA_KERNEL
    value): that kernel and no other, except that "mma" launches the pipelined kernel for the
    shapes tensor cores do not take (csrc/cuda/kernel_choice.h). tensor_cores_expected: the calls
    included shapes tensor cores take, so "mma" must have launched its own kernel too."""
    ran = {name: after[name] - before.get(name, 0) for name in after}
    allowed = {choice, "pipelined"} if choice == "mma" else {choice}
    ok = sum(ran.get(name, 0) for name in allowed) > 0 and not any(
        n for name, n in ran.items() if name not in allowed)
    if choice == "mma" and tensor_cores_expected:
        ok = ok and ran.get("mma", 0) > 0
    if not ok:
        raise AssertionError(f"{CUDA_KERNEL_ENV}={choice}, but the attention launches were {ran}")


@contextlib.contextmanager
def cuda_kernel_setting(value, env=CUDA_KERNEL_ENV):
    """PAGED_ATTN_CUDA_KERNEL=value (or another of the CUDA settings the extension reads once
    per process: `env` CUDA_SPLIT_ENV, CUDA_PDL_ENV), read again by the extension; the old
    setting afterwards."""
    saved = os.environ.get(env)
    os.environ[env] = value
    cuda_attention_launches(reload=True)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = saved
        cuda_attention_launches(reload=True)
