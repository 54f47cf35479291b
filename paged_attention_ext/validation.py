"""Argument checks for the paged_attn ops: the Python mirror of csrc/torch_glue/validate.cpp.

Every failure raises ValueError with a message that starts with "paged_attn.<op>: " and matches
the regexes of docs/DESIGN.md's bad-input table. The checks run in the same order as the C++ ones
and say the same words (dtypes printed the C++ way: Float, Half, Int, ...), so a bad call fails
with one message whichever backend serves it.

Every check takes (op name, args): args the op's arguments as one record (op_args.ARGS[op]).
Two kinds of check (check_args / check_data pick op's):
- check_attention_args / check_cache_args (v1, v2, reshape_and_cache) and check_decode_args /
  check_flash_cache_args (decode, reshape_and_cache_flash: NHD-ordered strided caches): shapes,
  dtypes, devices, strides. They read NO tensor data, so they run on meta tensors and
  FakeTensors (the register_fake kernels call them).
- check_attention_data / check_cache_data and check_decode_data / check_flash_cache_data: read
  block_tables / seq_lens / slot_mapping (a host copy, i.e. a sync on CUDA): used block ids in
  range, 0 <= seq_len <= capacity, v2 scratch large enough, slots in range. Entries of a block
  table past a row's used blocks are garbage: not read.
"""

import math
from typing import NamedTuple

import torch

from .core import PARTITION_SIZE, cache_kind, key_chunk_elements
from .op_args import V1Args, scratch

# The query (and key, value, "auto" cache) dtypes every op takes (params.h ScalarKind).
QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
QUERY_DTYPE_NAMES = tuple(str(d).replace("torch.", "") for d in QUERY_DTYPES)  # "float32", ...


def _where(op):
    """The op's name as every message starts with it."""
    return f"paged_attn.{op}"


def _fail(op, msg):
    raise ValueError(f"{_where(op)}: {msg}")


def _require(cond, op, msg):
    if not cond:
        _fail(op, msg)


# c10 ScalarType names, as the C++ messages print dtypes.
_C10_NAMES = {torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16",
              torch.float64: "Double", torch.int32: "Int", torch.int64: "Long",
              torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short", torch.bool: "Bool",
              torch.float8_e4m3fn: "Float8_e4m3fn", torch.float8_e5m2: "Float8_e5m2"}


def _dt(dtype):
    return _C10_NAMES.get(dtype, str(dtype))


def _shape(t):
    return list(t.shape)


# 'float32, float16 or bfloat16', as the C++ messages say it.
_QUERY_DTYPES_IN_WORDS = f"{', '.join(QUERY_DTYPE_NAMES[:-1])} or {QUERY_DTYPE_NAMES[-1]}"


def parse_kv_cache_dtype(op, kv_cache_dtype):
    """"auto" | "fp8" | "fp8_e4m3" | "fp8_e5m2" -> "auto" | "fp8_e4m3" | "fp8_e5m2"
    (core.cache_kind, failing in this module's words)."""
    return cache_kind(kv_cache_dtype, _where(op))


def _check_same_device(op, ref, ref_name, t, name):
    _require(t.device == ref.device, op,
             f"{name} is on device {t.device} but {ref_name} is on device {ref.device} "
             "(all tensors must be on one device)")


def _check_scale(op, s, name, ref, ref_name):
    """k_scale / v_scale: a Python float or one float32 element on `ref`'s device."""
    if not isinstance(s, torch.Tensor):
        _require(isinstance(s, (float, int)), op,
                 f"{name} must be a float or a 1-element float32 tensor, got {type(s).__name__}")
        return
    _require(s.numel() == 1 and s.dtype == torch.float32, op,
             f"{name} must be a float or a 1-element float32 tensor, got dtype {_dt(s.dtype)} "
             f"with {s.numel()} elements")
    _check_same_device(op, ref, ref_name, s, name)


def _check_cache_dtypes(op, key_cache, value_cache, kind, elem_dtype, elem_name):
    """Cache elements: the query's / key's dtype for "auto", uint8 bytes for fp8."""
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        if kind == "auto":
            _require(t.dtype == elem_dtype, op,
                     f"{name} dtype {_dt(t.dtype)} must match {elem_name} dtype "
                     f"{_dt(elem_dtype)} for kv_cache_dtype=auto")
        else:
            _require(t.dtype == torch.uint8, op,
                     f"{name} dtype {_dt(t.dtype)} must be uint8 for kv_cache_dtype={kind}")


def _check_caches(op, key_cache, value_cache, kind, elem_dtype, elem_name):
    """The cache checks shared by attention and reshape_and_cache (validate.cpp check_caches).

    key_cache   [num_blocks, num_kv_heads, head_size // x, block_size, x]
    value_cache [num_blocks, num_kv_heads, head_size, block_size]
    elem_dtype / elem_name: the query's (attention) or key's (reshape_and_cache) dtype and name.
    Returns x.
    """
    _require(key_cache.dim() == 5, op,
             "key_cache must be 5-D [num_blocks, num_kv_heads, head_size / x, block_size, x], "
             f"got shape {_shape(key_cache)}")
    _require(value_cache.dim() == 4, op,
             "value_cache must be 4-D [num_blocks, num_kv_heads, head_size, block_size], "
             f"got shape {_shape(value_cache)}")
    _check_cache_dtypes(op, key_cache, value_cache, kind, elem_dtype, elem_name)
    x = key_chunk_elements(key_cache.dtype)
    _require(key_cache.size(4) == x, op,
             f"key_cache.size(4) must be x = 16 / element size = {x}, got {key_cache.size(4)}")
    same_blocks = (value_cache.size(0) == key_cache.size(0)
                   and value_cache.size(1) == key_cache.size(1)
                   and value_cache.size(3) == key_cache.size(3))
    _require(same_blocks, op,
             f"value_cache shape {_shape(value_cache)} does not match key_cache shape "
             f"{_shape(key_cache)} (num_blocks, num_kv_heads and block_size must agree)")
    _require(value_cache.stride(0) == key_cache.stride(0)
             and value_cache.stride(1) == key_cache.stride(1), op,
             f"value_cache block/head strides ({value_cache.stride(0)}, {value_cache.stride(1)}) "
             f"do not match key_cache strides ({key_cache.stride(0)}, {key_cache.stride(1)})")
    block_size = key_cache.size(3)
    _require(key_cache.stride(4) == 1 and key_cache.stride(3) == x
             and key_cache.stride(2) == block_size * x, op,
             "key_cache must be contiguous in its inner dims [head_size / x, block_size, x] "
             f"(got stride {list(key_cache.stride())})")
    _require(value_cache.stride(3) == 1 and value_cache.stride(2) == block_size, op,
             "value_cache must be contiguous in its inner dims [head_size, block_size] "
             f"(got stride {list(value_cache.stride())})")
    _check_same_device(op, key_cache, "key_cache", value_cache, "value_cache")
    return x


def _check_head_size(op, head_size, key_cache, value_cache, x):
    _require(head_size % x == 0, op, f"head_size ({head_size}) must be divisible by x ({x})")
    _require(key_cache.size(2) * x == head_size, op,
             f"head_size ({head_size}) does not match key_cache "
             f"(size(2) * x = {key_cache.size(2) * x})")
    _require(value_cache.size(2) == head_size, op,
             f"head_size ({head_size}) does not match value_cache.size(2) ({value_cache.size(2)})")


def _check_scratch(op, t, name, num_seqs, num_heads, num_partitions, head_size, dtype, query):
    """exp_sums / max_logits (head_size 0: float32 [S, H, P]) or tmp_out ([S, H, P, D], dtype)."""
    is_tmp_out = head_size > 0
    want = [num_seqs, num_heads, num_partitions] + ([head_size] if is_tmp_out else [])
    layout = ("[num_seqs, num_heads, max_num_partitions, head_size]" if is_tmp_out
              else "[num_seqs, num_heads, max_num_partitions]")
    _require(_shape(t) == want, op, f"{name} shape {_shape(t)} must be {layout} = {want}")
    if is_tmp_out:
        _require(t.dtype == dtype, op,
                 f"{name} dtype {_dt(t.dtype)} must match query dtype {_dt(dtype)}")
    else:
        _require(t.dtype == torch.float32, op, f"{name} must be float32, got {_dt(t.dtype)}")
    _require(t.is_contiguous(), op, f"{name} must be contiguous")
    _check_same_device(op, query, "query", t, name)


class Blocksparse(NamedTuple):
    """The blocksparse arguments of an active call (blocksparse_vert_stride > 1)."""
    tp_rank: int
    local_blocks: int
    vert_stride: int
    block_size: int  # tokens per sparse block (not the cache's block_size)
    head_sliding_step: int


# v1 / v2's blocksparse arguments (their last ones, schema names) in Blocksparse's field order.
BLOCKSPARSE_ARGS = V1Args._fields[-len(Blocksparse._fields):]

# Their defaults (schemas.py): dense attention.
DENSE = Blocksparse(*(V1Args._field_defaults[name] for name in BLOCKSPARSE_ARGS))

_INT32_MAX = 2**31 - 1


def blocksparse_of(args):
    """The blocksparse arguments of a v1 / v2 record as a Blocksparse (active or not)."""
    return Blocksparse(*(getattr(args, name) for name in BLOCKSPARSE_ARGS))


def blocksparse_spec(args):
    """Blocksparse of a v1 / v2 record when active (vert_stride > 1), else None (dense; vLLM
    then ignores all five)."""
    sparse = blocksparse_of(args)
    return sparse if sparse.vert_stride > 1 else None


def check_blocksparse(op, sparse):
    """The blocksparse arguments (a Blocksparse) of an active call must make sense
    (docs/CONTRACT.md): vLLM's kernel takes them as 32-bit ints and divides by the sparse block
    size. Inactive (vert_stride <= 1): nothing is checked, as vLLM ignores them."""
    if sparse.vert_stride <= 1:
        return
    why = f"when blocksparse is active (blocksparse_vert_stride = {sparse.vert_stride} > 1)"
    _require(sparse.block_size > 0, op,
             f"blocksparse_block_size ({sparse.block_size}) must be > 0 {why}")
    _require(sparse.local_blocks >= 0, op,
             f"blocksparse_local_blocks ({sparse.local_blocks}) must be >= 0 {why}")
    _require(sparse.tp_rank >= 0, op, f"tp_rank ({sparse.tp_rank}) must be >= 0 {why}")
    for name, value in zip(BLOCKSPARSE_ARGS, sparse):
        _require(abs(value) <= _INT32_MAX, op,
                 f"{name} ({value}) must fit in a 32-bit int (|value| <= {_INT32_MAX}) {why}")


def check_tensor_rank(fn, t, name, rank, shape_in_words):
    """TypeError unless t is a tensor, ValueError unless it has `rank` dims. For the API
    functions (fn: the function's name) that read a shape before the op's own checks run."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{fn}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != rank:
        raise ValueError(f"{fn}: {name} must be {rank}-D {shape_in_words}, got shape {_shape(t)}")


def _check_query(op, query):
    """query [num_seqs, num_heads, head_size], fp32/fp16/bf16, last dim contiguous."""
    _require(query.dim() == 3, op,
             f"query must be 3-D [num_seqs, num_heads, head_size], got shape {_shape(query)}")
    _require(query.dtype in QUERY_DTYPES, op,
             f"query dtype {_dt(query.dtype)} must be {_QUERY_DTYPES_IN_WORDS}")
    _require(query.stride(2) == 1, op,
             f"query must have a contiguous last dim (got stride {list(query.stride())})")


def _check_heads(op, num_heads, num_kv_heads, where=""):
    """GQA: every KV head serves the same number of query heads. where: how num_kv_heads was
    found (decode reads it from the cache)."""
    _require(num_kv_heads > 0 and num_heads % num_kv_heads == 0, op,
             f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads}{where})")


def _check_tables(op, block_tables, seq_lens, num_seqs):
    """block_tables int32 [num_seqs, max_blocks_per_seq], seq_lens int32 [num_seqs], contiguous."""
    _require(block_tables.dtype == torch.int32, op,
             f"block_tables must be int32, got {_dt(block_tables.dtype)}")
    _require(seq_lens.dtype == torch.int32, op, f"seq_lens must be int32, got {_dt(seq_lens.dtype)}")
    _require(block_tables.dim() == 2 and block_tables.size(0) == num_seqs, op,
             f"block_tables shape {_shape(block_tables)} must be "
             f"[num_seqs = {num_seqs}, max_blocks_per_seq]")
    _require(seq_lens.dim() == 1 and seq_lens.size(0) == num_seqs, op,
             f"seq_lens shape {_shape(seq_lens)} must be [num_seqs = {num_seqs}]")
    _require(block_tables.is_contiguous(), op, "block_tables must be contiguous")
    _require(seq_lens.is_contiguous(), op, "seq_lens must be contiguous")


def _check_out(op, out, query):
    """out: the query's shape and dtype, contiguous."""
    _require(_shape(out) == _shape(query), op,
             f"out shape {_shape(out)} must be [num_seqs, num_heads, head_size] = {_shape(query)}")
    _require(out.dtype == query.dtype, op,
             f"out dtype {_dt(out.dtype)} must match query dtype {_dt(query.dtype)}")
    _require(out.is_contiguous(), op, "out must be contiguous")


def _check_alibi_and_scales(op, alibi_slopes, k_scale, v_scale, query):
    """alibi_slopes None or float32 [num_heads] contiguous; k_scale / v_scale (_check_scale)."""
    if alibi_slopes is not None:
        a = alibi_slopes
        num_heads = query.size(1)
        _require(a.dim() == 1 and a.size(0) == num_heads and a.dtype == torch.float32
                 and a.is_contiguous(), op,
                 f"alibi_slopes must be a contiguous float32 tensor of shape [num_heads = "
                 f"{num_heads}], got dtype {_dt(a.dtype)} shape {_shape(a)}")
        _check_same_device(op, query, "query", a, "alibi_slopes")
    _check_scale(op, k_scale, "k_scale", query, "query")
    _check_scale(op, v_scale, "v_scale", query, "query")


def _check_on_device_of(op, args, ref_name, names):
    """The tensors args.<name> are on the device of args.<ref_name>."""
    ref = getattr(args, ref_name)
    for name in names:
        _check_same_device(op, ref, ref_name, getattr(args, name), name)


# Checked against the query's device first, in this order (as validate.cpp), by attention and
# decode; the scratch, alibi_slopes and scale tensors are checked with their own checks.
_ON_QUERY_DEVICE = ("out", "key_cache", "value_cache", "block_tables", "seq_lens")


def check_attention_args(op, args):
    """Shape/dtype/device/stride checks of v1 or v2 (args: op_args.V1Args / V2Args;
    validate.cpp make_attention_params). Reads no tensor data, so it runs on meta tensors and
    FakeTensors. Returns the cache kind ("auto", "fp8_e4m3" or "fp8_e5m2").
    Blocksparse: its arguments are checked here (check_blocksparse; validate.cpp the same)."""
    a = args
    check_blocksparse(op, blocksparse_of(a))
    kind = parse_kv_cache_dtype(op, a.kv_cache_dtype)

    # ---- query: [num_seqs, num_heads, head_size], last dim contiguous ----
    query, key_cache = a.query, a.key_cache
    _check_query(op, query)
    num_seqs, num_heads, head_size = query.shape
    _check_on_device_of(op, a, "query", _ON_QUERY_DEVICE)

    # ---- heads ----
    _check_heads(op, num_heads, a.num_kv_heads)

    # ---- caches ----
    x = _check_caches(op, key_cache, a.value_cache, kind, query.dtype, "query")
    _require(key_cache.size(1) == a.num_kv_heads, op,
             f"num_kv_heads ({a.num_kv_heads}) does not match key_cache.size(1) "
             f"({key_cache.size(1)})")
    _check_head_size(op, head_size, key_cache, a.value_cache, x)
    _require(a.block_size == key_cache.size(3), op,
             f"block_size ({a.block_size}) does not match key_cache.size(3) ({key_cache.size(3)})")

    # ---- block table and lengths ----
    _check_tables(op, a.block_tables, a.seq_lens, num_seqs)

    # ---- outputs ----
    _check_out(op, a.out, query)
    exp_sums, max_logits, tmp_out = scratch(a)
    if tmp_out is not None:  # v2 scratch
        _require(tmp_out.dim() == 4, op, f"tmp_out shape {_shape(tmp_out)} must be "
                                         "[num_seqs, num_heads, max_num_partitions, head_size]")
        num_partitions = tmp_out.size(2)
        _require(num_partitions >= 1, op,
                 f"tmp_out shape {_shape(tmp_out)} must have max_num_partitions >= 1")
        _check_scratch(op, exp_sums, "exp_sums", num_seqs, num_heads, num_partitions, 0,
                       query.dtype, query)
        _check_scratch(op, max_logits, "max_logits", num_seqs, num_heads, num_partitions, 0,
                       query.dtype, query)
        _check_scratch(op, tmp_out, "tmp_out", num_seqs, num_heads, num_partitions, head_size,
                       query.dtype, query)

    # ---- optional inputs ----
    _check_alibi_and_scales(op, a.alibi_slopes, a.k_scale, a.v_scale, query)
    return kind


def _check_rows(op, key_cache, block_tables, seq_lens, block_size, tmp_out):
    """Data-dependent checks (validate.cpp check_attention_data; reads block_tables and seq_lens,
    a host sync on CUDA). Per row: 0 <= seq_len <= max_blocks_per_seq * block_size, (v2, tmp_out
    given) max_num_partitions >= ceil(seq_len / 512), every USED block id (the first
    ceil(seq_len / block_size) entries) in [0, num_blocks) (num_blocks is key_cache.size(0) in
    both layouts)."""
    num_blocks = key_cache.size(0)
    capacity = block_tables.size(1) * block_size
    table = block_tables.cpu()
    for s, seq_len in enumerate(seq_lens.cpu().tolist()):
        _require(seq_len >= 0, op, f"seq_lens[{s}] = {seq_len} is negative")
        _require(seq_len <= capacity, op,
                 f"seq_lens[{s}] = {seq_len} exceeds the block table's capacity "
                 f"max_blocks_per_seq * block_size = {capacity}")
        if tmp_out is not None:
            needed = math.ceil(seq_len / PARTITION_SIZE)
            _require(needed <= tmp_out.size(2), op,
                     f"max_num_partitions (tmp_out.size(2) = {tmp_out.size(2)}) is too small for "
                     f"seq_lens[{s}] = {seq_len}, which needs {needed} partitions of "
                     f"{PARTITION_SIZE} tokens")
        used = table[s, :math.ceil(seq_len / block_size)]
        bad = ((used < 0) | (used >= num_blocks)).nonzero()
        if bad.numel():
            b = int(bad[0, 0])
            _fail(op, f"block_tables[{s}, {b}] = {int(used[b])} is out of range "
                      f"[0, num_blocks = {num_blocks})")


def check_attention_data(op, args):
    """v1 / v2's data checks (_check_rows: lengths, used block ids, v2 scratch size). Run after
    check_attention_args."""
    _check_rows(op, args.key_cache, args.block_tables, args.seq_lens, args.block_size,
                scratch(args)[2])


def _check_kv_tokens(op, key, value):
    """key, value [num_tokens, num_kv_heads, head_size]: one shape, one fp32/fp16/bf16 dtype,
    last dim contiguous (reshape_and_cache and reshape_and_cache_flash)."""
    _require(key.dim() == 3, op,
             f"key shape {_shape(key)} must be [num_tokens, num_kv_heads, head_size]")
    _require(key.dtype in QUERY_DTYPES, op,
             f"key dtype {_dt(key.dtype)} must be {_QUERY_DTYPES_IN_WORDS}")
    _require(_shape(value) == _shape(key), op,
             f"value shape {_shape(value)} must equal key shape {_shape(key)}")
    _require(value.dtype == key.dtype, op,
             f"value dtype {_dt(value.dtype)} must match key dtype {_dt(key.dtype)}")
    _require(key.stride(2) == 1 and value.stride(2) == 1, op,
             f"key and value must have a contiguous last dim (got strides {list(key.stride())} "
             f"and {list(value.stride())})")


def _check_token_args(op, args):
    """The start of both cache writes' checks: kv_cache_dtype, key / value (_check_kv_tokens),
    every tensor on the key's device. Returns the cache kind."""
    kind = parse_kv_cache_dtype(op, args.kv_cache_dtype)
    _check_kv_tokens(op, args.key, args.value)
    _check_on_device_of(op, args, "key", ("value", "key_cache", "value_cache", "slot_mapping"))
    return kind


def _check_slot_mapping_and_scales(op, args, num_tokens_ok, want):
    """The end of both cache writes' checks: slot_mapping int64 1-D contiguous with a length
    num_tokens_ok accepts (`want` says which), then the scales."""
    slot_mapping = args.slot_mapping
    _require(slot_mapping.dtype == torch.int64, op,
             f"slot_mapping must be int64, got {_dt(slot_mapping.dtype)}")
    _require(slot_mapping.dim() == 1 and num_tokens_ok(slot_mapping.size(0))
             and slot_mapping.is_contiguous(), op,
             f"slot_mapping shape {_shape(slot_mapping)} must be {want}")
    _check_scale(op, args.k_scale, "k_scale", args.key, "key")
    _check_scale(op, args.v_scale, "v_scale", args.key, "key")


def check_cache_args(op, args):
    """reshape_and_cache shape/dtype/device/stride checks (args: op_args.ReshapeAndCacheArgs;
    validate.cpp make_cache_params); reads no data. key, value [num_tokens_padded, num_kv_heads,
    head_size] (last dim contiguous), slot_mapping int64 [num_tokens] with num_tokens <=
    key.size(0) (vLLM: the rows of key past slot_mapping's are padding and are not read), caches
    as for attention. Returns the cache kind."""
    kind = _check_token_args(op, args)
    key, key_cache, value_cache = args.key, args.key_cache, args.value_cache
    x = _check_caches(op, key_cache, value_cache, kind, key.dtype, "key")
    num_rows, num_kv_heads, head_size = key.shape
    _require(num_kv_heads == key_cache.size(1), op,
             f"key shape {_shape(key)} does not match key_cache "
             f"(num_kv_heads = {key_cache.size(1)})")
    _check_head_size(op, head_size, key_cache, value_cache, x)
    _check_slot_mapping_and_scales(op, args, lambda n: n <= num_rows,
                                   f"[num_tokens] with num_tokens <= key.size(0) = {num_rows}, "
                                   "and contiguous")
    return kind


def _check_slots(op, slot_mapping, num_slots):
    """Every slot < num_slots = num_blocks * block_size (negative: padding, skipped)."""
    slots = slot_mapping.cpu()
    bad = (slots >= num_slots).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        _fail(op, f"slot_mapping[{i}] = {int(slots[i])} is out of range "
                  f"[0, num_blocks * block_size = {num_slots})")


def check_cache_data(op, args):
    """Every slot < num_blocks * block_size (negative: padding, skipped). Reads slot_mapping."""
    _check_slots(op, args.slot_mapping, args.key_cache.size(0) * args.key_cache.size(3))


# ---- NHD / HND caches: decode and reshape_and_cache_flash (CONTRACT.md "NHD / HND caches") ----

_NHD = "[num_blocks, block_size, num_kv_heads, head_size]"


def _check_flash_caches(op, key_cache, value_cache, kind, elem_dtype, elem_name):
    """key_cache, value_cache NHD-ordered [num_blocks, block_size, num_kv_heads, head_size], one
    shape, any strides with a contiguous last dim (K and V strides may differ: an HND cache is
    passed as cache.transpose(1, 2), a combined one as kv[:, 0] / kv[:, 1]), block_size > 0.
    elem_dtype / elem_name: the query's (decode) or key's (reshape_and_cache_flash) dtype and
    name. Returns (block_size, num_kv_heads, head_size)."""
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        _require(t.dim() == 4, op,
                 f"{name} must be 4-D {_NHD} (an HND cache is passed as cache.transpose(1, 2)), "
                 f"got shape {_shape(t)}")
    _check_cache_dtypes(op, key_cache, value_cache, kind, elem_dtype, elem_name)
    _require(_shape(value_cache) == _shape(key_cache), op,
             f"value_cache shape {_shape(value_cache)} does not match key_cache shape "
             f"{_shape(key_cache)} (the K and V caches must have one shape {_NHD})")
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        _require(t.stride(3) == 1, op,
                 f"{name} must have a contiguous last dim (head_size) "
                 f"(got stride {list(t.stride())})")
    _check_same_device(op, key_cache, "key_cache", value_cache, "value_cache")
    _, block_size, num_kv_heads, head_size = key_cache.shape
    _require(block_size > 0, op, f"block_size (key_cache.size(1) = {block_size}) must be > 0")
    return block_size, num_kv_heads, head_size


def check_decode_args(op, args):
    """Shape/dtype/device/stride checks of decode (args: op_args.DecodeArgs; NHD-ordered strided
    caches; num_kv_heads and block_size from the cache shape). Reads no tensor data, so it runs
    on meta tensors and FakeTensors. Returns the cache kind ("auto", "fp8_e4m3" or "fp8_e5m2")."""
    a = args
    kind = parse_kv_cache_dtype(op, a.kv_cache_dtype)
    query = a.query
    _check_query(op, query)
    num_seqs, num_heads, head_size = query.shape
    _check_on_device_of(op, a, "query", _ON_QUERY_DEVICE)
    _, num_kv_heads, cache_head_size = _check_flash_caches(op, a.key_cache, a.value_cache, kind,
                                                           query.dtype, "query")
    _check_heads(op, num_heads, num_kv_heads, ", key_cache.size(2)")
    _require(head_size == cache_head_size, op,
             f"head_size ({head_size}) does not match key_cache.size(3) ({cache_head_size})")
    _check_tables(op, a.block_tables, a.seq_lens, num_seqs)
    _check_out(op, a.out, query)
    _check_alibi_and_scales(op, a.alibi_slopes, a.k_scale, a.v_scale, query)
    return kind


def check_decode_data(op, args):
    """decode's data checks (_check_rows with block_size = key_cache.size(1)): per row
    0 <= seq_len <= max_blocks_per_seq * block_size and every used block id in
    [0, num_blocks). Reads block_tables and seq_lens (a host sync on CUDA)."""
    _check_rows(op, args.key_cache, args.block_tables, args.seq_lens, args.key_cache.size(1),
                None)


def check_flash_cache_args(op, args):
    """reshape_and_cache_flash checks (args: op_args.ReshapeAndCacheFlashArgs; vLLM's contract);
    reads no data. key, value [num_tokens_padded, num_kv_heads, head_size] (last dim
    contiguous), slot_mapping int64 [num_tokens] with num_tokens <= key.size(0) (vLLM: the rows
    of key past slot_mapping's are padding and are not read), caches NHD-ordered as for decode.
    Returns the cache kind."""
    kind = _check_token_args(op, args)
    key = args.key
    _, num_kv_heads, cache_head_size = _check_flash_caches(op, args.key_cache, args.value_cache,
                                                           kind, key.dtype, "key")
    num_rows, key_heads, head_size = key.shape
    _require(key_heads == num_kv_heads, op,
             f"key shape {_shape(key)} does not match key_cache "
             f"(num_kv_heads = key_cache.size(2) = {num_kv_heads})")
    _require(head_size == cache_head_size, op,
             f"head_size ({head_size}) does not match key_cache.size(3) ({cache_head_size})")
    _check_slot_mapping_and_scales(op, args, lambda n: n <= num_rows,
                                   f"[num_tokens] with num_tokens <= key.size(0) = {num_rows}, "
                                   "and contiguous")
    return kind


def check_flash_cache_data(op, args):
    """Every slot < num_blocks * block_size (block_size = key_cache.size(1); negative: padding,
    skipped). Reads slot_mapping."""
    _check_slots(op, args.slot_mapping, args.key_cache.size(0) * args.key_cache.size(1))


# op -> (its argument checks, its data checks), for code that serves every op alike.
_CHECKS = {"v1": (check_attention_args, check_attention_data),
           "v2": (check_attention_args, check_attention_data),
           "reshape_and_cache": (check_cache_args, check_cache_data),
           "decode": (check_decode_args, check_decode_data),
           "reshape_and_cache_flash": (check_flash_cache_args, check_flash_cache_data)}


def check_args(op, args):
    """op's shape/dtype/device/stride checks (reads no tensor data). Returns the cache kind."""
    return _CHECKS[op][0](op, args)


def check_data(op, args):
    """op's data-dependent checks (reads block tables, lengths or slots: a host sync on CUDA).
    Run after check_args."""
    _CHECKS[op][1](op, args)
