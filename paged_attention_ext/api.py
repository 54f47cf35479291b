"""Python API over torch.ops.paged_attn: allocate outputs and scratch, pick v1 or v2
(choose_version), allocate a KV cache in the paged layout; decode over NHD / HND caches.

Shapes (CONTRACT.md):
  query        [num_seqs, num_heads, head_size]
  key_cache    [num_blocks, num_kv_heads, head_size // x, block_size, x]  x: key_chunk_elements
  value_cache  [num_blocks, num_kv_heads, head_size, block_size]
  block_tables int32 [num_seqs, max_blocks_per_seq];  seq_lens int32 [num_seqs]
NHD / HND caches (paged_decode, reshape_and_cache_flash, allocate_paged_kv_cache):
  kv_layout "nhd"  key_cache, value_cache [num_blocks, block_size, num_kv_heads, head_size]
  kv_layout "hnd"  key_cache, value_cache [num_blocks, num_kv_heads, block_size, head_size]
  (any strides with a contiguous last dim; an HND cache reaches the ops as cache.transpose(1, 2))
"""

import math
from typing import Optional, Tuple, Union

import torch

from . import op_args, validation
from .core import PARTITION_SIZE, cache_kind, cache_storage_dtype, key_chunk_elements

Scale = Union[float, torch.Tensor]


def num_partitions(max_seq_len: int) -> int:
    """v2 scratch size: partitions of PARTITION_SIZE tokens covering max_seq_len (at least 1)."""
    return max(1, -(-max_seq_len // PARTITION_SIZE))


def use_v1(max_seq_len: int, num_seqs: int, num_heads: int) -> bool:
    """vLLM's choice between the single-pass v1 and the partitioned v2 (it counts QUERY heads):
    v1 up to 8192 tokens when the rows fit one partition or there are over 512 rows."""
    return max_seq_len <= 8192 and (max_seq_len <= PARTITION_SIZE or num_seqs * num_heads > 512)


def choose_version(device: torch.device, max_seq_len: int, num_seqs: int, num_heads: int,
                   row_capacity: int) -> str:
    """"v1" or "v2" for version="auto" (docs/CUDA.md "Splitting the KV range").

    CUDA: v1 splits each row across thread blocks itself when num_seqs * num_kv_heads leaves the
    GPU short of blocks (csrc/core/split_plan.h), choosing from the block table's width
    (row_capacity = block_tables.size(1) * block_size) and the SM count, and runs one pass without
    scratch when the rows fill the GPU: v1, unless the table is more than twice as wide as the
    longest row needs (then most of v1's partitions would lie past the rows, while v2's 512-token
    partitions follow max_seq_len), where vLLM's rule decides. Elsewhere: vLLM's rule (use_v1).
    """
    if row_capacity <= 2 * max(max_seq_len, PARTITION_SIZE) and device.type == "cuda":
        return "v1"
    return "v1" if use_v1(max_seq_len, num_seqs, num_heads) else "v2"


# The ops' callers (op_args.caller), and torch.Tensor, as module globals: one lookup each per call.
_CALL = {op: op_args.caller(op) for op in ("v1", "v2", "decode")}
_Tensor = torch.Tensor


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_tables: torch.Tensor, seq_lens: torch.Tensor, *,
                    max_seq_len: Optional[int] = None, scale: Optional[float] = None,
                    alibi_slopes: Optional[torch.Tensor] = None, kv_cache_dtype: str = "auto",
                    k_scale: Scale = 1.0, v_scale: Scale = 1.0, version: str = "auto",
                    out: Optional[torch.Tensor] = None, validate: bool = False,
                    tp_rank: int = 0, blocksparse_local_blocks: int = 0,
                    blocksparse_vert_stride: int = 0, blocksparse_block_size: int = 64,
                    blocksparse_head_sliding_step: int = 0) -> torch.Tensor:
    """Decode attention of each sequence's query over its paged K/V; returns out [num_seqs,
    num_heads, head_size].

    max_seq_len: the longest seq_len (sizes v2's scratch). None reads seq_lens.max(): a host sync
      on CUDA, so pass it on hot paths and under CUDA-graph capture (under torch.compile, None
      takes the block table's capacity, block_tables.size(1) * block_size).
    scale: softmax scale, default 1/sqrt(head_size).
    version: "v1", "v2" or "auto" (choose_version: on CUDA v1, which splits rows itself, unless
      the block table is much wider than max_seq_len; elsewhere vLLM's rule).
    validate: run the data-dependent checks (block ids, lengths) before the op. They always run on
      the CPU; CUDA kernels skip them to stay sync-free and write NaN rows for invalid input, so
      turn this on while debugging a scheduler on CUDA.
    tp_rank, blocksparse_*: vLLM's blocksparse attention (docs/CONTRACT.md), active when
      blocksparse_vert_stride > 1; every backend computes it.
    """
    # The shapes this function reads; when they cannot be read, the checks name the argument as
    # the op would (run only then: they cost more than the reads).
    try:
        num_seqs, num_heads, head_size = query.shape
        _, num_kv_heads, _, block_size, _ = key_cache.shape
        tensors = isinstance(query, _Tensor) and isinstance(key_cache, _Tensor)
    except (AttributeError, TypeError, ValueError):
        tensors = False
    if not tensors:  # raises, naming the argument
        fn = "paged_attention"
        validation.check_tensor_rank(fn, query, "query", 3, "[num_seqs, num_heads, head_size]")
        validation.check_tensor_rank(fn, key_cache, "key_cache", 5,
                                     "[num_blocks, num_kv_heads, head_size / x, block_size, x]")
    max_seq_len_given = max_seq_len is not None
    if not max_seq_len_given:
        if torch.compiler.is_compiling():  # the longest row is data; the table's capacity bounds it
            max_seq_len = block_tables.size(1) * block_size
        else:
            max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
    if scale is None:
        scale = 1.0 / math.sqrt(head_size)
    if version == "auto":  # choose_version's rule; the device and the table read on CUDA only
        if query.is_cuda:
            version = choose_version(query.device, max_seq_len, num_seqs, num_heads,
                                     block_tables.size(1) * block_size)
        else:
            version = "v1" if use_v1(max_seq_len, num_seqs, num_heads) else "v2"
    if version not in ("v1", "v2"):
        raise ValueError(f"paged_attention: version must be 'v1', 'v2' or 'auto', got {version!r}")
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    head = (out,)  # the arguments before the query: v1's out, v2's out and scratch (schemas.py)
    if version == "v2":
        # The scratch is sized from max_seq_len: a longer row would be the op's error about a
        # tmp_out the caller never made. Checked where reading seq_lens costs no device sync and
        # outside torch.compile's tracing (a data-dependent read; the op's own check still runs).
        if (max_seq_len_given and (validate or seq_lens.device.type == "cpu")
                and seq_lens.numel() and not torch.compiler.is_compiling()):
            longest = int(seq_lens.max())
            if longest > max_seq_len:
                raise ValueError(f"paged_attention: max_seq_len ({max_seq_len}) is below the "
                                 f"longest seq_len ({longest}); pass the longest (or None to "
                                 "read it)")
        partitions = num_partitions(max_seq_len)
        exp_sums = torch.empty(num_seqs, num_heads, partitions, dtype=torch.float32,
                               device=query.device)
        head = (out, exp_sums, torch.empty_like(exp_sums),
                torch.empty(num_seqs, num_heads, partitions, head_size, dtype=query.dtype,
                            device=query.device))
    args = head + (query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
                   block_size, max_seq_len, alibi_slopes, kv_cache_dtype, k_scale, v_scale,
                   tp_rank, blocksparse_local_blocks, blocksparse_vert_stride,
                   blocksparse_block_size, blocksparse_head_sliding_step)
    if validate:
        _validate(version, args)
    _CALL[version](*args)  # (not through a helper: a call frame is 2% of a tiny call)
    return out


def _validate(op, args):
    """The argument and data checks of torch.ops.paged_attn.<op>(*args) (args: the op's
    arguments in schema order, all given)."""
    record = op_args.ARGS[op](*args)
    validation.check_args(op, record)
    validation.check_data(op, record)


# The op's own arguments (op_args.function: schemas.py's names, order and defaults).
reshape_and_cache = op_args.function("reshape_and_cache", op_args.call_op, """\
Write key/value [num_tokens, num_kv_heads, head_size] into the paged caches at
slot_mapping (int64, slot = block * block_size + offset; negative slots are skipped).""",
                                     module=__name__)


def _storage_dtype(fn: str, dtype: torch.dtype, kv_cache_dtype: str) -> torch.dtype:
    """What a cache stores: the model dtype ("auto") or uint8 bytes of an fp8 format."""
    return cache_storage_dtype(cache_kind(kv_cache_dtype, fn), dtype)


def allocate_kv_cache(num_blocks: int, num_kv_heads: int, head_size: int, block_size: int,
                      dtype: torch.dtype = torch.float16, device: Union[str, torch.device] = "cpu",
                      kv_cache_dtype: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
    """Zeroed (key_cache, value_cache) in the paged layout. `dtype` is the model dtype; fp8
    caches ("fp8", "fp8_e4m3", "fp8_e5m2") are stored as uint8."""
    storage = _storage_dtype("allocate_kv_cache", dtype, kv_cache_dtype)
    x = key_chunk_elements(storage)
    if head_size % x:
        raise ValueError(f"allocate_kv_cache: head_size ({head_size}) must be divisible by x ({x})")
    key_cache = torch.zeros(num_blocks, num_kv_heads, head_size // x, block_size, x,
                            dtype=storage, device=device)
    value_cache = torch.zeros(num_blocks, num_kv_heads, head_size, block_size, dtype=storage,
                              device=device)
    return key_cache, value_cache


KV_LAYOUTS = ("nhd", "hnd")


def _nhd_views(fn, key_cache, value_cache, kv_layout):
    """The caches as the NHD-ordered views the ops take (kv_layout: how they are stored)."""
    if kv_layout == "hnd":
        return key_cache.transpose(1, 2), value_cache.transpose(1, 2)
    if kv_layout != "nhd":
        raise ValueError(f"{fn}: kv_layout must be 'nhd' or 'hnd', got {kv_layout!r}")
    return key_cache, value_cache


def paged_decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 block_tables: torch.Tensor, seq_lens: torch.Tensor, *,
                 scale: Optional[float] = None, alibi_slopes: Optional[torch.Tensor] = None,
                 kv_cache_dtype: str = "auto", k_scale: Scale = 1.0, v_scale: Scale = 1.0,
                 out: Optional[torch.Tensor] = None, kv_layout: str = "nhd",
                 validate: bool = False) -> torch.Tensor:
    """Decode attention of each sequence's query over its paged K/V in an NHD or HND cache;
    returns out [num_seqs, num_heads, head_size] (torch.ops.paged_attn.decode, CONTRACT.md
    "NHD / HND caches").

    key_cache, value_cache: stored as kv_layout says ("nhd": [num_blocks, block_size,
      num_kv_heads, head_size], "hnd": [num_blocks, num_kv_heads, block_size, head_size]), any
      strides with a contiguous last dim (a combined [num_blocks, 2, ...] tensor: pass kv[:, 0],
      kv[:, 1]). Nothing is copied: an HND cache is handed to the op as its transposed view.
    kv_layout: how the caches are stored; pass the one they were allocated with. The two orders
      cannot be told apart from a tensor whose block_size happens to be a valid head count:
      an HND cache read as "nhd" can pass every check and give wrong output.
    scale: softmax scale, default 1/sqrt(head_size).
    validate: run the data-dependent checks (block ids, lengths) first; the CPU always runs
      them, a CUDA kernel skips them to stay sync-free.
    """
    fn = "paged_decode"
    validation.check_tensor_rank(fn, query, "query", 3, "[num_seqs, num_heads, head_size]")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        validation.check_tensor_rank(fn, cache, name, 4,
                                     f"(kv_layout {kv_layout!r}: see paged_decode's docstring)")
    key_cache, value_cache = _nhd_views("paged_decode", key_cache, value_cache, kv_layout)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    args = (out, query, key_cache, value_cache, block_tables, seq_lens, scale, alibi_slopes,
            kv_cache_dtype, k_scale, v_scale)
    try:
        if validate:
            _validate("decode", args)
        _CALL["decode"](*args)
    except ValueError as error:  # a shape error may be a layout mix-up: say which was assumed
        raise ValueError(f"{error} (paged_decode read the caches as kv_layout={kv_layout!r}: "
                         "pass the layout they were allocated with)") from error
    return out


def reshape_and_cache_flash(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                            value_cache: torch.Tensor, slot_mapping: torch.Tensor,
                            kv_cache_dtype: str = "auto", k_scale: Scale = 1.0,
                            v_scale: Scale = 1.0, *, kv_layout: str = "nhd") -> None:
    """Write key/value [num_rows, num_kv_heads, head_size] into NHD / HND caches (kv_layout, as
    paged_decode) at slot_mapping (int64 [num_tokens], num_tokens <= num_rows: the rows past it
    are padding; slot = block * block_size + offset; negative slots are skipped)."""
    key_cache, value_cache = _nhd_views("reshape_and_cache_flash", key_cache, value_cache,
                                        kv_layout)
    op_args.overload("reshape_and_cache_flash", k_scale, v_scale)(
        key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def allocate_paged_kv_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                            dtype: torch.dtype = torch.float16,
                            device: Union[str, torch.device] = "cpu",
                            kv_cache_dtype: str = "auto",
                            kv_layout: str = "nhd") -> Tuple[torch.Tensor, torch.Tensor]:
    """Zeroed (key_cache, value_cache) for paged_decode / reshape_and_cache_flash, stored as
    kv_layout says ("nhd": [num_blocks, block_size, num_kv_heads, head_size], "hnd":
    [num_blocks, num_kv_heads, block_size, head_size]); pass the same kv_layout to them.
    `dtype` is the model dtype; fp8 caches ("fp8", "fp8_e4m3", "fp8_e5m2") are stored as uint8."""
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"allocate_paged_kv_cache: kv_layout must be 'nhd' or 'hnd', "
                         f"got {kv_layout!r}")
    storage = _storage_dtype("allocate_paged_kv_cache", dtype, kv_cache_dtype)
    shape = ((num_blocks, block_size, num_kv_heads, head_size) if kv_layout == "nhd"
             else (num_blocks, num_kv_heads, block_size, head_size))
    return (torch.zeros(shape, dtype=storage, device=device),
            torch.zeros(shape, dtype=storage, device=device))
