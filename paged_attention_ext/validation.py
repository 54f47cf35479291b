"""Argument checks for the paged_attn ops: the Python mirror of csrc/torch_glue/validate.cpp.

Every failure raises ValueError with a message that starts with "paged_attn.<op>: " and matches
the regexes of docs/DESIGN.md's bad-input table (C++ and Python say the same).

Two kinds of check:
- check_attention_args / check_cache_args: shapes, dtypes, devices, strides. They read NO tensor
  data, so they run on meta tensors and FakeTensors (the register_fake kernels call them).
- check_attention_data / check_cache_data: read block_tables / seq_lens / slot_mapping (a host
  copy, i.e. a sync on CUDA): used block ids in range, 0 <= seq_len <= capacity, v2 scratch large
  enough, slots in range. Entries of a block table past a row's used blocks are garbage: not read.
"""

import math

import torch

PARTITION_SIZE = 512  # v2 partition length in tokens (csrc/core/params.h kPartitionSize)

# kv_cache_dtype string -> cache kind ("auto": the cache has the query dtype; fp8: uint8 bytes).
KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# fp8 cache kind -> the torch dtype its uint8 bytes are viewed as.
FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _fail(op, msg):
    raise ValueError(f"paged_attn.{op}: {msg}")


def _require(cond, op, msg):
    if not cond:
        _fail(op, msg)


def _shape(t):
    return list(t.shape)


def parse_kv_cache_dtype(op, kv_cache_dtype):
    """"auto" | "fp8" | "fp8_e4m3" | "fp8_e5m2" -> "auto" | "fp8_e4m3" | "fp8_e5m2"."""
    kind = KV_CACHE_DTYPES.get(kv_cache_dtype)
    _require(kind is not None, op,
             f"unknown kv_cache_dtype '{kv_cache_dtype}' (expected auto, fp8, fp8_e4m3 or fp8_e5m2)")
    return kind


def cache_dtype_for(kind, query_dtype):
    """The element dtype of the cache tensors for a cache kind."""
    return query_dtype if kind == "auto" else torch.uint8


def _check_device(op, name, t, device, ref="query"):
    _require(t.device == device, op, f"{name} is on device {t.device} but {ref} is on {device}")


def _check_contiguous(op, name, t):
    _require(t.is_contiguous(), op, f"{name} must be contiguous (strides {list(t.stride())})")


def _check_scale(op, name, s, device, ref="query"):
    """k_scale / v_scale: a Python float or a 1-element float32 tensor on `ref`'s device."""
    if isinstance(s, torch.Tensor):
        _require(s.numel() == 1 and s.dtype == torch.float32, op,
                 f"{name} must be a float or a 1-element float32 tensor "
                 f"(got shape {_shape(s)}, dtype {s.dtype})")
        _check_device(op, name, s, device, ref)
    else:
        _require(isinstance(s, (float, int)), op,
                 f"{name} must be a float or a 1-element float32 tensor (got {type(s).__name__})")


def _check_caches(op, key_cache, value_cache, kind, elem_dtype, elem_name, num_kv_heads,
                  head_size, block_size):
    """The K/V cache checks shared by attention and reshape_and_cache.

    key_cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value_cache [num_blocks, num_kv_heads, head_size, block_size]
    elem_dtype / elem_name: the query's (attention) or key's (reshape_and_cache) dtype and name.
    Returns x.
    """
    _require(key_cache.dim() == 5, op,
             f"key_cache shape {_shape(key_cache)} must be 5-D "
             "[num_blocks, num_kv_heads, head_size/x, block_size, x]")
    _require(value_cache.dim() == 4, op,
             f"value_cache shape {_shape(value_cache)} must be 4-D "
             "[num_blocks, num_kv_heads, head_size, block_size]")
    if kind == "auto":
        _require(key_cache.dtype == elem_dtype, op,
                 f"key_cache dtype {key_cache.dtype} must equal {elem_name} dtype {elem_dtype} "
                 "for kv_cache_dtype 'auto'")
    else:
        _require(key_cache.dtype == torch.uint8, op,
                 f"key_cache dtype {key_cache.dtype} must be uint8 for kv_cache_dtype '{kind}'")
    _require(value_cache.dtype == key_cache.dtype, op,
             f"value_cache dtype {value_cache.dtype} must equal key_cache dtype {key_cache.dtype}")

    x = 16 // key_cache.element_size()
    _require(head_size % x == 0, op, f"head_size ({head_size}) must be divisible by x ({x})")
    _require(key_cache.size(4) == x, op,
             f"key_cache.size(4) must be x = 16 / element size = {x}, got {key_cache.size(4)}")
    _require(key_cache.size(1) == num_kv_heads, op,
             f"num_kv_heads ({num_kv_heads}) does not match key_cache.size(1) ({key_cache.size(1)})")
    _require(key_cache.size(2) * x == head_size, op,
             f"head_size ({head_size}) does not match key_cache (size(2) * x = {key_cache.size(2) * x})")
    _require(value_cache.size(2) == head_size, op,
             f"head_size ({head_size}) does not match value_cache.size(2) ({value_cache.size(2)})")
    _require(key_cache.size(3) == block_size, op,
             f"block_size ({block_size}) does not match key_cache.size(3) ({key_cache.size(3)})")
    same_layout = (value_cache.size(0) == key_cache.size(0)
                   and value_cache.size(1) == key_cache.size(1)
                   and value_cache.size(3) == key_cache.size(3))
    _require(same_layout, op,
             f"value_cache shape {_shape(value_cache)} disagrees with key_cache shape "
             f"{_shape(key_cache)} (num_blocks, num_kv_heads, block_size)")
    _require(value_cache.stride(0) == key_cache.stride(0)
             and value_cache.stride(1) == key_cache.stride(1), op,
             f"value_cache strides {list(value_cache.stride()[:2])} on dims 0, 1 differ from "
             f"key_cache strides {list(key_cache.stride()[:2])}")
    # Inner dims contiguous: K [head_size/x, block_size, x], V [head_size, block_size].
    _require(key_cache.stride(4) == 1 and key_cache.stride(3) == x
             and key_cache.stride(2) == block_size * x, op,
             f"key_cache must be contiguous in its inner dims (stride {list(key_cache.stride())})")
    _require(value_cache.stride(3) == 1 and value_cache.stride(2) == block_size, op,
             f"value_cache must be contiguous in its inner dims (stride {list(value_cache.stride())})")
    return x


def check_attention_args(op, out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache,
                         num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len,
                         alibi_slopes, kv_cache_dtype, k_scale, v_scale, tp_rank, bs_local,
                         bs_vert, bs_block, bs_step):
    """Shape/dtype/device/stride checks of v1 (exp_sums, max_logits, tmp_out None) or v2.

    Reads no tensor data. Returns the cache kind ("auto", "fp8_e4m3" or "fp8_e5m2").
    """
    kind = parse_kv_cache_dtype(op, kv_cache_dtype)
    _require(bs_vert <= 1, op,
             f"blocksparse attention is not implemented (blocksparse_vert_stride={bs_vert})")

    # query [num_seqs, num_heads, head_size]: any stride on dims 0, 1; last dim contiguous.
    _require(query.dim() == 3, op,
             f"query shape {_shape(query)} must be [num_seqs, num_heads, head_size]")
    _require(query.dtype in QUERY_DTYPES, op,
             f"query dtype {query.dtype} is not supported (float32, float16 or bfloat16)")
    _require(query.stride(2) == 1, op,
             f"query must be contiguous in its last dim (stride {list(query.stride())})")
    num_seqs, num_heads, head_size = query.shape
    device = query.device

    _require(num_kv_heads > 0, op, f"num_kv_heads ({num_kv_heads}) must be positive")
    _require(num_heads % num_kv_heads == 0, op,
             f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")
    _check_caches(op, key_cache, value_cache, kind, query.dtype, "query", num_kv_heads,
                  head_size, block_size)

    _require(block_tables.dtype == torch.int32, op,
             f"block_tables must be int32, got {block_tables.dtype}")
    _require(seq_lens.dtype == torch.int32, op, f"seq_lens must be int32, got {seq_lens.dtype}")
    _require(block_tables.dim() == 2 and block_tables.size(0) == num_seqs, op,
             f"block_tables shape {_shape(block_tables)} must be "
             f"[num_seqs={num_seqs}, max_blocks_per_seq]")
    _require(seq_lens.dim() == 1 and seq_lens.size(0) == num_seqs, op,
             f"seq_lens shape {_shape(seq_lens)} must be [num_seqs={num_seqs}]")
    _check_contiguous(op, "block_tables", block_tables)
    _check_contiguous(op, "seq_lens", seq_lens)

    if alibi_slopes is not None:
        _require(alibi_slopes.dtype == torch.float32, op,
                 f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
        _require(alibi_slopes.dim() == 1 and alibi_slopes.size(0) == num_heads, op,
                 f"alibi_slopes shape {_shape(alibi_slopes)} must be [num_heads={num_heads}]")
        _check_contiguous(op, "alibi_slopes", alibi_slopes)
    _check_scale(op, "k_scale", k_scale, device)
    _check_scale(op, "v_scale", v_scale, device)

    # out [num_seqs, num_heads, head_size], query dtype, contiguous.
    _require(_shape(out) == [num_seqs, num_heads, head_size], op,
             f"out shape {_shape(out)} must be [{num_seqs}, {num_heads}, {head_size}] (query's)")
    _require(out.dtype == query.dtype, op,
             f"out dtype {out.dtype} must equal query dtype {query.dtype}")
    _check_contiguous(op, "out", out)

    named = [("out", out), ("key_cache", key_cache), ("value_cache", value_cache),
             ("block_tables", block_tables), ("seq_lens", seq_lens)]
    if alibi_slopes is not None:
        named.append(("alibi_slopes", alibi_slopes))

    if tmp_out is not None:  # v2 scratch
        _require(tmp_out.dim() == 4 and _shape(tmp_out)[:2] == [num_seqs, num_heads]
                 and tmp_out.size(3) == head_size, op,
                 f"tmp_out shape {_shape(tmp_out)} must be "
                 f"[{num_seqs}, {num_heads}, max_num_partitions, {head_size}]")
        max_num_partitions = tmp_out.size(2)
        for name, t in (("exp_sums", exp_sums), ("max_logits", max_logits)):
            _require(_shape(t) == [num_seqs, num_heads, max_num_partitions], op,
                     f"{name} shape {_shape(t)} must be "
                     f"[{num_seqs}, {num_heads}, {max_num_partitions}] (max_num_partitions from tmp_out)")
            _require(t.dtype == torch.float32, op, f"{name} must be float32, got {t.dtype}")
            _check_contiguous(op, name, t)
        _require(tmp_out.dtype == query.dtype, op,
                 f"tmp_out dtype {tmp_out.dtype} must equal query dtype {query.dtype}")
        _check_contiguous(op, "tmp_out", tmp_out)
        named += [("exp_sums", exp_sums), ("max_logits", max_logits), ("tmp_out", tmp_out)]

    for name, t in named:
        _check_device(op, name, t, device)
    return kind


def check_attention_data(op, key_cache, block_tables, seq_lens, block_size, tmp_out=None):
    """Data-dependent checks (reads block_tables and seq_lens; a host sync on CUDA).

    0 <= seq_len <= max_blocks_per_seq * block_size, every USED block id (the first
    ceil(seq_len / block_size) entries of a row) in [0, num_blocks), and for v2 (tmp_out given)
    max_num_partitions >= ceil(seq_len / 512). Run after check_attention_args.
    """
    num_blocks = key_cache.size(0)
    max_blocks_per_seq = block_tables.size(1)
    capacity = max_blocks_per_seq * block_size
    lens = seq_lens.cpu().tolist()
    table = block_tables.cpu()
    for s, seq_len in enumerate(lens):
        _require(seq_len >= 0, op, f"seq_lens[{s}] = {seq_len} is negative")
        _require(seq_len <= capacity, op,
                 f"seq_lens[{s}] = {seq_len} exceeds max_blocks_per_seq * block_size = "
                 f"{max_blocks_per_seq} * {block_size} = {capacity}")
        used = table[s, :math.ceil(seq_len / block_size)]
        bad = ((used < 0) | (used >= num_blocks)).nonzero()
        if bad.numel():
            j = int(bad[0, 0])
            _fail(op, f"block_tables[{s}, {j}] = {int(used[j])} is out of range "
                      f"[0, {num_blocks}) (num_blocks of the cache)")
    if tmp_out is not None and lens:
        needed = math.ceil(max(lens) / PARTITION_SIZE)
        _require(tmp_out.size(2) >= needed, op,
                 f"max_num_partitions ({tmp_out.size(2)}, tmp_out.size(2)) is too small for "
                 f"seq_len {max(lens)} (needs ceil({max(lens)} / {PARTITION_SIZE}) = {needed})")


def check_cache_args(op, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                     k_scale, v_scale):
    """reshape_and_cache shape/dtype/device/stride checks; reads no data. Returns the cache kind.

    key, value [num_tokens, num_kv_heads, head_size] (last dim contiguous), slot_mapping int64
    [num_tokens], caches as for attention.
    """
    kind = parse_kv_cache_dtype(op, kv_cache_dtype)
    _require(key.dim() == 3, op,
             f"key shape {_shape(key)} must be [num_tokens, num_kv_heads, head_size]")
    _require(_shape(value) == _shape(key), op,
             f"value shape {_shape(value)} must equal key shape {_shape(key)}")
    _require(key.dtype in QUERY_DTYPES, op,
             f"key dtype {key.dtype} must be float32, float16 or bfloat16")
    _require(value.dtype == key.dtype, op,
             f"value dtype {value.dtype} must equal key dtype {key.dtype}")
    for name, t in (("key", key), ("value", value)):
        _require(t.stride(2) == 1, op,
                 f"{name} must be contiguous in its last dim (stride {list(t.stride())})")
    num_tokens, num_kv_heads, head_size = key.shape
    device = key.device

    _check_caches(op, key_cache, value_cache, kind, key.dtype, "key", num_kv_heads, head_size,
                  key_cache.size(3) if key_cache.dim() == 5 else -1)
    _require(slot_mapping.dtype == torch.int64, op,
             f"slot_mapping must be int64, got {slot_mapping.dtype}")
    _require(slot_mapping.dim() == 1 and slot_mapping.size(0) == num_tokens, op,
             f"slot_mapping shape {_shape(slot_mapping)} must be [num_tokens={num_tokens}]")
    _check_contiguous(op, "slot_mapping", slot_mapping)
    _check_scale(op, "k_scale", k_scale, device, ref="key")
    _check_scale(op, "v_scale", v_scale, device, ref="key")
    for name, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache),
                    ("slot_mapping", slot_mapping)):
        _check_device(op, name, t, device, ref="key")
    return kind


def check_cache_data(op, key_cache, slot_mapping):
    """Every non-negative slot < num_blocks * block_size (reads slot_mapping; a sync on CUDA)."""
    capacity = key_cache.size(0) * key_cache.size(3)
    slots = slot_mapping.cpu()
    bad = (slots >= capacity).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        _fail(op, f"slot_mapping[{i}] = {int(slots[i])} is out of range "
                  f"(num_blocks * block_size = {capacity})")
