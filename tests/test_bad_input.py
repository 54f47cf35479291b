"""Bad input: one case per rule of docs/DESIGN.md's bad-input table and op (v1, v2,
reshape_and_cache, decode, reshape_and_cache_flash), each a ValueError whose message matches the
table's regex, for two backends:
  reference: paged_attention_ext.reference called directly (the Python checks, validation.py);
  ops:       torch.ops.paged_attn.* (whatever is registered for the CPU: the compiled kernel's
             C++ checks, or the Python implementation).
Every case starts from a valid call (test_valid_baseline_is_accepted proves it is valid) and
breaks exactly one thing. A rejected call must leave its outputs untouched. A compiled kernel
rejects every active blocksparse call before looking at its arguments (its own row of the table),
so for the blocksparse-argument cases the ops backend expects that row when a kernel is compiled.
"""

import pathlib
import re

import pytest
import torch

from conftest import registered_ops
from paged_attention_ext import reference
from paged_attention_ext.tools import backends, testing

BACKENDS = ["reference", "ops"]
REF_FNS = {"v1": reference.paged_attention_v1, "v2": reference.paged_attention_v2,
           "reshape_and_cache": reference.reshape_and_cache, "decode": reference.decode,
           "reshape_and_cache_flash": reference.reshape_and_cache_flash}
MUTATED = {"v1": ("out",), "v2": ("out", "exp_sums", "max_logits", "tmp_out"),
           "reshape_and_cache": ("key_cache", "value_cache"), "decode": ("out",),
           "reshape_and_cache_flash": ("key_cache", "value_cache")}
OPS = list(REF_FNS)

# The valid baseline: 2 rows (one spanning 2 partitions), 4 query heads over 2 KV heads,
# head_size 32, blocks of 8, fp32, garbage past each row's used blocks.
SEQ_LENS = [520, 9]


def _fn(backend, op):
    if backend == "reference":
        return REF_FNS[op]
    return getattr(registered_ops(), op)


def attention_args(op):
    """The full argument list of v1 / v2 (schema order) as an ordered dict."""
    i = testing.make_attention_inputs(2, 4, 2, 32, 8, SEQ_LENS, seed=0)
    outs = testing.alloc_v2_outputs(i)
    args = {"out": outs.out}
    if op == "v2":
        args.update(exp_sums=outs.exp_sums, max_logits=outs.max_logits, tmp_out=outs.tmp_out)
    args.update(query=i.query, key_cache=i.key_cache, value_cache=i.value_cache,
                num_kv_heads=i.num_kv_heads, scale=i.scale, block_tables=i.block_tables,
                seq_lens=i.seq_lens, block_size=i.block_size, max_seq_len=i.max_seq_len,
                alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, tp_rank=0,
                blocksparse_local_blocks=0, blocksparse_vert_stride=0,
                blocksparse_block_size=64, blocksparse_head_sliding_step=0)
    return args


def cache_args(op):
    """reshape_and_cache arguments: 5 tokens (one padding) into a NaN cache of 4 blocks of 8."""
    assert op == "reshape_and_cache"
    key = torch.randn(5, 2, 32)
    return dict(key=key, value=torch.randn(5, 2, 32),
                key_cache=torch.full((4, 2, 8, 8, 4), float("nan")),
                value_cache=torch.full((4, 2, 32, 8), float("nan")),
                slot_mapping=torch.tensor([3, 17, -1, 31, 0], dtype=torch.int64),
                kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)


def decode_args(op):
    """decode's arguments (schema order): the attention baseline with its caches NHD-ordered,
    seen through the transposed view of HND caches (so every case also runs on strided caches)."""
    assert op == "decode"
    i = testing.make_decode_inputs(2, 4, 2, 32, 8, SEQ_LENS, layout="hnd", seed=0)
    return dict(out=testing.alloc_v1_outputs(i), query=i.query, key_cache=i.key_cache,
                value_cache=i.value_cache, block_tables=i.block_tables, seq_lens=i.seq_lens,
                scale=i.scale, alibi_slopes=None, kv_cache_dtype="auto", k_scale=1.0,
                v_scale=1.0)


def flash_cache_args(op):
    """reshape_and_cache_flash arguments: 5 tokens (one padding) of a key with 6 rows (the last
    one CUDA-graph padding, vLLM's num_tokens = slot_mapping.size(0)) into NaN caches of 4 blocks
    of 8, HND storage passed as its NHD view."""
    assert op == "reshape_and_cache_flash"
    return dict(key=torch.randn(6, 2, 32), value=torch.randn(6, 2, 32),
                key_cache=torch.full((4, 2, 8, 32), float("nan")).transpose(1, 2),
                value_cache=torch.full((4, 2, 8, 32), float("nan")).transpose(1, 2),
                slot_mapping=torch.tensor([3, 17, -1, 31, 0], dtype=torch.int64),
                kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0)


_MAKE_ARGS = {"v1": attention_args, "v2": attention_args, "reshape_and_cache": cache_args,
              "decode": decode_args, "reshape_and_cache_flash": flash_cache_args}


def make_args(op):
    return _MAKE_ARGS[op](op)


# ---- mutation helpers ----

def with_head_size(a, head_size):
    """query / out / tmp_out with another head size (the caches keep 32)."""
    a["query"] = torch.randn(2, 4, head_size)
    a["out"] = torch.full((2, 4, head_size), float("nan"))
    if "tmp_out" in a:
        a["tmp_out"] = torch.full((2, 4, a["tmp_out"].shape[2], head_size), float("nan"))


def noncontig_copy(t):
    """The same values in a tensor that is not contiguous (every other element of a wider one)."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    view = wide[..., ::2]
    view.copy_(t)
    return view


def key_cache_inner_transposed(a):
    k = a["key_cache"]  # [nb, kvh, d/x, bs, x] with strides (.., .., bs*x, 1, bs) instead
    t = torch.empty(k.shape[0], k.shape[1], k.shape[2], k.shape[4], k.shape[3]).transpose(3, 4)
    t.copy_(k)
    a["key_cache"] = t


def value_cache_rows_padded(a):
    """Caches whose V rows ([block_size] tokens of one head dim) are padded by one element:
    value_cache.stride(2) = block_size + 1, last dim contiguous, block / head strides equal to
    the key_cache's (also padded), so only the V inner-contiguity rule is broken."""
    k, v = a["key_cache"], a["value_cache"]
    nb, kvh, dx, bs, x = k.shape
    head = dx * x * (bs + 1)  # elements per (block, head) slice, room for the padded V rows
    k_strided = torch.full((nb * kvh * head,), float("nan")).as_strided(
        k.shape, (kvh * head, head, bs * x, x, 1))
    v_strided = torch.full((nb * kvh * head,), float("nan")).as_strided(
        v.shape, (kvh * head, head, bs + 1, 1))
    k_strided.copy_(k)
    v_strided.copy_(v)
    a["key_cache"], a["value_cache"] = k_strided, v_strided


def smaller_scratch(a):
    for name in ("exp_sums", "max_logits", "tmp_out"):
        a[name] = a[name][:, :, :1].contiguous()


def set_(name, value):
    def mutate(a):
        a[name] = value(a[name]) if callable(value) else value
    return mutate


def both_scales(k, v):
    def mutate(a):
        a["k_scale"], a["v_scale"] = k, v
    return mutate


def poke(name, index, value):
    def mutate(a):
        a[name][index] = value
    return mutate


def chain(*mutations):
    def mutate(a):
        for m in mutations:
            m(a)
    return mutate


def _design_rows():
    """{row key: regex} from docs/DESIGN.md's bad-input table. The key is the row's first
    backticked regex as written; the regex ORs the row's alternatives (`<name>` -> a word,
    `...` -> anything)."""
    design = pathlib.Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
    text = design.read_text().split("## Bad-input messages", 1)[1]
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| ") or " | " not in line:
            continue
        alternatives = re.findall(r"`([^`]+)`", line.split(" | ", 1)[1])  # after the rule cell
        if not alternatives:
            continue
        rows[alternatives[0]] = "|".join(
            f"(?:{alt.replace('<name>', r'[a-z_]+').replace('...', '.*')})" for alt in alternatives)
    return rows


DESIGN_ROWS = _design_rows()


def case(row, name, op, regex, mutate, compiled_row=None):
    """row: the DESIGN.md row (its first regex); regex: what this case's message must match too
    (the row's regex narrowed to the argument broken here). compiled_row: the row a compiled
    kernel's message matches instead (it rejects the call earlier, for another reason)."""
    for r in (row, compiled_row or row):
        assert r in DESIGN_ROWS, f"not a row of DESIGN.md's table: {r}"
    compiled = DESIGN_ROWS[compiled_row] if compiled_row else None
    return pytest.param(op, DESIGN_ROWS[row], regex, mutate, compiled, id=f"{op}-{name}")


FP16 = lambda t: t.half()  # noqa: E731
META = lambda t: t.to("meta")  # noqa: E731
DTYPE_ROW = r"(out|tmp_out|key_cache|value_cache|key|value) dtype .* must"
BLOCKSPARSE_ROW = r"(tp_rank|blocksparse_[a-z_]+) \(-?\d+\) must"


def blocksparse_case(name, op, regex, **values):
    """An active blocksparse call (vert_stride 4 unless given) with one argument out of range."""
    values = {"blocksparse_vert_stride": 4, **values}
    return case(BLOCKSPARSE_ROW, name, op, regex,
                chain(*(set_(k, v) for k, v in values.items())))
CONTIG_ROW = r"<name> must be contiguous"

CASES = [
    case(r"block_tables must be int32", "block_tables_int64", "v2", r"block_tables must be int32",
         set_("block_tables", torch.Tensor.long)),
    case(r"seq_lens must be int32", "seq_lens_int64", "v1", r"seq_lens must be int32",
         set_("seq_lens", torch.Tensor.long)),
    case(r"slot_mapping must be int64", "slot_mapping_int32", "reshape_and_cache",
         r"slot_mapping must be int64", set_("slot_mapping", torch.Tensor.int)),
    case(r"num_heads \(\d+\) must be divisible by num_kv_heads", "heads_not_divisible", "v2",
         r"num_heads \(4\) must be divisible by num_kv_heads \(3\)", set_("num_kv_heads", 3)),
    case(r"num_kv_heads \(\d+\) does not match key_cache", "num_kv_heads_vs_cache", "v2",
         r"num_kv_heads \(4\)", set_("num_kv_heads", 4)),
    case(r"head_size \(\d+\) does not match (key_cache|value_cache)", "head_size_vs_cache", "v2",
         r"head_size \(64\)", lambda a: with_head_size(a, 64)),
    case(r"head_size \(\d+\) does not match (key_cache|value_cache)", "head_size_vs_cache",
         "reshape_and_cache", r"head_size \(64\)",
         chain(set_("key", lambda t: torch.randn(5, 2, 64)),
               set_("value", lambda t: torch.randn(5, 2, 64)))),
    case(r"value_cache .* key_cache", "num_blocks_differ", "v2", r"value_cache shape",
         set_("value_cache", lambda t: t[:-1])),
    # A view of the valid value_cache, one token shorter per block: every stride (so the
    # inner-contiguity and stride rules) still holds, only the block_size rule catches it.
    case(r"value_cache .* key_cache", "block_size_differs", "v1", r"value_cache shape",
         set_("value_cache", lambda t: t[..., :-1])),
    case(r"value_cache .* key_cache", "block_head_strides_differ", "v2",
         r"value_cache block/head strides \(\d+, \d+\) do not match key_cache",
         set_("value_cache", lambda t: testing.strided_cache_view(t, "head_padding"))),
    case(r"head_size \(\d+\) must be divisible by x", "head_size_not_multiple_of_x", "v1",
         r"head_size \(34\) must be divisible by x \(4\)", lambda a: with_head_size(a, 34)),
    case(r"key_cache.size\(4\) must be x", "key_cache_x", "v2", r"x = 16 / element size = 4",
         set_("key_cache", lambda t: t.reshape(t.shape[0], t.shape[1], -1, 8, 8))),
    case(DTYPE_ROW, "out_dtype", "v1", r"^paged_attn.v1: out dtype", set_("out", FP16)),
    case(DTYPE_ROW, "tmp_out_dtype", "v2", r"tmp_out dtype", set_("tmp_out", FP16)),
    case(DTYPE_ROW, "key_cache_dtype", "v2", r"key_cache dtype", set_("key_cache", FP16)),
    case(DTYPE_ROW, "value_cache_dtype", "v1", r"value_cache dtype", set_("value_cache", FP16)),
    case(DTYPE_ROW, "key_dtype", "reshape_and_cache", r"^paged_attn.reshape_and_cache: key dtype",
         chain(set_("key", torch.Tensor.double), set_("value", torch.Tensor.double))),
    case(DTYPE_ROW, "value_dtype", "reshape_and_cache", r"value dtype", set_("value", FP16)),
    case(r"query dtype", "query_dtype", "v2", r"query dtype", set_("query", torch.Tensor.double)),
    case(r"must be uint8 for kv_cache_dtype", "fp8_cache_not_uint8", "v2", r"key_cache",
         set_("kv_cache_dtype", "fp8")),
    case(r"must be uint8 for kv_cache_dtype", "fp8_cache_not_uint8", "reshape_and_cache",
         r"key_cache", set_("kv_cache_dtype", "fp8_e5m2")),
    case(r"unknown kv_cache_dtype", "unknown_kv_cache_dtype", "v2", r"'fp16'",
         set_("kv_cache_dtype", "fp16")),
    case(r"unknown kv_cache_dtype", "unknown_kv_cache_dtype", "reshape_and_cache", r"'int8'",
         set_("kv_cache_dtype", "int8")),
    case(r"block_size \(\d+\) does not match", "block_size", "v2", r"block_size \(16\)",
         set_("block_size", 16)),
    case(r"(out|exp_sums|max_logits|tmp_out) shape", "out_shape", "v1", r"out shape",
         set_("out", lambda t: t[:, :3].contiguous())),
    case(r"(out|exp_sums|max_logits|tmp_out) shape", "exp_sums_shape", "v2", r"exp_sums shape",
         set_("exp_sums", lambda t: t[:, :, :1].contiguous())),
    case(r"(out|exp_sums|max_logits|tmp_out) shape", "max_logits_shape", "v2",
         r"max_logits shape", set_("max_logits", lambda t: t[:1].contiguous())),
    case(r"(out|exp_sums|max_logits|tmp_out) shape", "tmp_out_shape", "v2", r"tmp_out shape",
         set_("tmp_out", lambda t: t[..., :16].contiguous())),
    case(r"(exp_sums|max_logits) must be float32", "exp_sums_dtype", "v2", r"exp_sums",
         set_("exp_sums", FP16)),
    case(r"(exp_sums|max_logits) must be float32", "max_logits_dtype", "v2", r"max_logits",
         set_("max_logits", torch.Tensor.double)),
    case(CONTIG_ROW, "out_contiguous", "v2", r"out must be contiguous", set_("out", noncontig_copy)),
    case(CONTIG_ROW, "tmp_out_contiguous", "v2", r"tmp_out must be contiguous",
         set_("tmp_out", noncontig_copy)),
    case(CONTIG_ROW, "block_tables_contiguous", "v1", r"block_tables must be contiguous",
         set_("block_tables", noncontig_copy)),
    case(CONTIG_ROW, "seq_lens_contiguous", "v2", r"seq_lens must be contiguous",
         set_("seq_lens", noncontig_copy)),
    case(CONTIG_ROW, "query_last_dim_stride", "v2", r"query .*stride",
         set_("query", noncontig_copy)),
    case(CONTIG_ROW, "key_cache_inner_contiguous", "v1", r"key_cache must be contiguous",
         key_cache_inner_transposed),
    case(CONTIG_ROW, "value_cache_inner_contiguous", "v2", r"value_cache must be contiguous",
         value_cache_rows_padded),
    case(CONTIG_ROW, "key_last_dim_stride", "reshape_and_cache", r"key .*stride",
         set_("key", noncontig_copy)),
    case(r"device", "device_key_cache", "v2", r"key_cache is on device", set_("key_cache", META)),
    case(r"device", "device_block_tables", "v1", r"block_tables is on device",
         set_("block_tables", META)),
    case(r"device", "device_slot_mapping", "reshape_and_cache", r"slot_mapping is on device",
         set_("slot_mapping", META)),
    case(r"alibi_slopes", "alibi_shape", "v2", r"alibi_slopes", set_("alibi_slopes", torch.zeros(3))),
    case(r"alibi_slopes", "alibi_dtype", "v1", r"alibi_slopes",
         set_("alibi_slopes", torch.zeros(4, dtype=torch.float16))),
    case(r"alibi_slopes", "alibi_contiguous", "v2", r"alibi_slopes must be a contiguous",
         set_("alibi_slopes", noncontig_copy(torch.rand(4)))),
    case(r"device", "device_alibi_slopes", "v1", r"alibi_slopes is on device",
         set_("alibi_slopes", torch.rand(4, device="meta"))),
    case(r"device", "device_exp_sums", "v2", r"exp_sums is on device", set_("exp_sums", META)),
    case(r"device", "device_k_scale", "v2", r"k_scale is on device",
         both_scales(torch.ones((), device="meta"), torch.ones(()))),
    case(r"k_scale", "k_scale_two_elements", "v2", r"k_scale",
         both_scales(torch.ones(2), torch.ones(()))),
    case(r"k_scale", "v_scale_float64", "v1", r"v_scale",
         both_scales(torch.ones(()), torch.ones((), dtype=torch.float64))),
    case(r"k_scale", "k_scale_three_elements", "reshape_and_cache", r"k_scale",
         both_scales(torch.ones(1, 1, 3), torch.ones(1))),
    case(r"block_tables shape", "block_tables_shape", "v2", r"block_tables shape",
         set_("block_tables", lambda t: t[:1].contiguous())),
    case(r"block_tables shape", "seq_lens_shape", "v1", r"seq_lens shape",
         set_("seq_lens", lambda t: t.repeat(2))),
    case(r"block_tables.* out of range", "block_id_too_large", "v2", r"block_tables\[1, 1\]",
         lambda a: poke("block_tables", (1, 1), a["key_cache"].shape[0])(a)),
    case(r"block_tables.* out of range", "block_id_negative", "v1", r"block_tables\[0, 64\] = -1",
         poke("block_tables", (0, 64), -1)),
    case(r"seq_lens.* negative", "seq_len_negative", "v2", r"seq_lens\[1\] = -1",
         poke("seq_lens", 1, -1)),
    case(r"seq_lens.* exceeds", "seq_len_exceeds_table", "v1", r"seq_lens\[1\]",
         lambda a: poke("seq_lens", 1, a["block_tables"].shape[1] * 8 + 1)(a)),
    case(r"max_num_partitions .* too small", "scratch_too_small", "v2", r"seq_lens\[0\] = 520",
         smaller_scratch),
    blocksparse_case("sparse_block_size_0", "v2", r"blocksparse_block_size \(0\) must be > 0",
                     blocksparse_block_size=0),
    blocksparse_case("local_blocks_negative", "v1",
                     r"blocksparse_local_blocks \(-1\) must be >= 0", blocksparse_local_blocks=-1),
    blocksparse_case("tp_rank_negative", "v2", r"tp_rank \(-2\) must be >= 0", tp_rank=-2),
    blocksparse_case("vert_stride_beyond_int32", "v1",
                     r"blocksparse_vert_stride \(2147483648\) must fit in a 32-bit int",
                     blocksparse_vert_stride=2**31),
    blocksparse_case("sliding_step_beyond_int32", "v2",
                     r"blocksparse_head_sliding_step \(-2147483648\) must fit",
                     blocksparse_head_sliding_step=-2**31),
    case(r"slot_mapping.* out of range", "slot_out_of_range", "reshape_and_cache",
         r"slot_mapping\[1\] = 32", poke("slot_mapping", 1, 4 * 8)),
    case(r"(key|value) shape", "key_shape", "reshape_and_cache", r"key shape",
         set_("key", lambda t: t[:, 0])),
    case(r"(key|value) shape", "value_shape", "reshape_and_cache", r"value shape",
         set_("value", lambda t: t[:, :1].contiguous())),
    case(r"slot_mapping shape", "slot_mapping_shape", "reshape_and_cache",
         r"slot_mapping shape \[6\] must be \[num_tokens\] with num_tokens <= key.size\(0\) = 5",
         set_("slot_mapping", lambda t: torch.cat([t, t[:1]]))),
]

# decode and reshape_and_cache_flash (NHD-ordered strided caches): the rules they share with
# v1 / reshape_and_cache, and their own.
NHD_ROW = r"(key_cache|value_cache) must be 4-D"
BLOCK_SIZE_0_ROW = r"block_size \(key_cache.size\(1\) = \d+\) must be > 0"
DECODE_CASES = [
    case(r"block_tables must be int32", "block_tables_int64", "decode",
         r"block_tables must be int32", set_("block_tables", torch.Tensor.long)),
    case(r"seq_lens must be int32", "seq_lens_int64", "decode", r"seq_lens must be int32",
         set_("seq_lens", torch.Tensor.long)),
    case(r"slot_mapping must be int64", "slot_mapping_int32", "reshape_and_cache_flash",
         r"slot_mapping must be int64", set_("slot_mapping", torch.Tensor.int)),
    case(r"num_heads \(\d+\) must be divisible by num_kv_heads", "heads_not_divisible", "decode",
         r"num_heads \(3\) must be divisible by num_kv_heads \(2, key_cache.size\(2\)\)",
         set_("query", lambda t: t[:, :3])),
    case(r"head_size \(\d+\) does not match (key_cache|value_cache)", "head_size_vs_cache",
         "decode", r"head_size \(64\) does not match key_cache.size\(3\) \(32\)",
         lambda a: with_head_size(a, 64)),
    case(r"head_size \(\d+\) does not match (key_cache|value_cache)", "head_size_vs_cache",
         "reshape_and_cache_flash", r"head_size \(64\)",
         chain(set_("key", lambda t: torch.randn(6, 2, 64)),
               set_("value", lambda t: torch.randn(6, 2, 64)))),
    case(r"value_cache .* key_cache", "num_blocks_differ", "decode", r"value_cache shape",
         set_("value_cache", lambda t: t[:-1])),
    case(r"value_cache .* key_cache", "heads_differ", "reshape_and_cache_flash",
         r"value_cache shape", set_("value_cache", lambda t: t[:, :, :1])),
    case(NHD_ROW, "legacy_5d_key_cache", "decode", r"key_cache must be 4-D",
         set_("key_cache", lambda t: t.unsqueeze(0))),
    case(NHD_ROW, "value_cache_3d", "reshape_and_cache_flash", r"value_cache must be 4-D",
         set_("value_cache", lambda t: t[0])),
    case(BLOCK_SIZE_0_ROW, "block_size_0", "decode", r"= 0\) must be > 0",
         chain(set_("key_cache", lambda t: t[:, :0]), set_("value_cache", lambda t: t[:, :0]))),
    case(BLOCK_SIZE_0_ROW, "block_size_0", "reshape_and_cache_flash", r"= 0\) must be > 0",
         chain(set_("key_cache", lambda t: t[:, :0]), set_("value_cache", lambda t: t[:, :0]))),
    case(DTYPE_ROW, "out_dtype", "decode", r"^paged_attn.decode: out dtype", set_("out", FP16)),
    case(DTYPE_ROW, "key_cache_dtype", "decode", r"key_cache dtype", set_("key_cache", FP16)),
    case(DTYPE_ROW, "key_dtype", "reshape_and_cache_flash",
         r"^paged_attn.reshape_and_cache_flash: key dtype",
         chain(set_("key", torch.Tensor.double), set_("value", torch.Tensor.double))),
    case(DTYPE_ROW, "value_cache_dtype", "reshape_and_cache_flash", r"value_cache dtype",
         set_("value_cache", FP16)),
    case(r"query dtype", "query_dtype", "decode", r"query dtype",
         set_("query", torch.Tensor.double)),
    case(r"must be uint8 for kv_cache_dtype", "fp8_cache_not_uint8", "decode", r"key_cache",
         set_("kv_cache_dtype", "fp8")),
    case(r"must be uint8 for kv_cache_dtype", "fp8_cache_not_uint8", "reshape_and_cache_flash",
         r"key_cache", set_("kv_cache_dtype", "fp8_e4m3")),
    case(r"unknown kv_cache_dtype", "unknown_kv_cache_dtype", "decode", r"'fp16'",
         set_("kv_cache_dtype", "fp16")),
    case(r"unknown kv_cache_dtype", "unknown_kv_cache_dtype", "reshape_and_cache_flash",
         r"'int8'", set_("kv_cache_dtype", "int8")),
    case(r"(out|exp_sums|max_logits|tmp_out) shape", "out_shape", "decode", r"out shape",
         set_("out", lambda t: t[:, :3].contiguous())),
    case(CONTIG_ROW, "out_contiguous", "decode", r"out must be contiguous",
         set_("out", noncontig_copy)),
    case(CONTIG_ROW, "block_tables_contiguous", "decode", r"block_tables must be contiguous",
         set_("block_tables", noncontig_copy)),
    case(CONTIG_ROW, "seq_lens_contiguous", "decode", r"seq_lens must be contiguous",
         set_("seq_lens", noncontig_copy)),
    case(CONTIG_ROW, "query_last_dim_stride", "decode", r"query .*stride",
         set_("query", noncontig_copy)),
    case(CONTIG_ROW, "key_cache_last_dim_stride", "decode",
         r"key_cache must have a contiguous last dim", set_("key_cache", noncontig_copy)),
    case(CONTIG_ROW, "value_cache_last_dim_stride", "reshape_and_cache_flash",
         r"value_cache must have a contiguous last dim", set_("value_cache", noncontig_copy)),
    case(CONTIG_ROW, "value_last_dim_stride", "reshape_and_cache_flash", r"value .*stride",
         set_("value", noncontig_copy)),
    case(r"device", "device_value_cache", "decode", r"value_cache is on device",
         set_("value_cache", META)),
    case(r"device", "device_seq_lens", "decode", r"seq_lens is on device",
         set_("seq_lens", META)),
    case(r"device", "device_key_cache", "reshape_and_cache_flash", r"key_cache is on device",
         set_("key_cache", META)),
    case(r"alibi_slopes", "alibi_shape", "decode", r"alibi_slopes",
         set_("alibi_slopes", torch.zeros(3))),
    case(r"k_scale", "k_scale_two_elements", "decode", r"k_scale",
         both_scales(torch.ones(2), torch.ones(()))),
    case(r"k_scale", "v_scale_float64", "reshape_and_cache_flash", r"v_scale",
         both_scales(torch.ones(()), torch.ones((), dtype=torch.float64))),
    case(r"block_tables shape", "block_tables_shape", "decode", r"block_tables shape",
         set_("block_tables", lambda t: t[:1].contiguous())),
    case(r"block_tables shape", "seq_lens_shape", "decode", r"seq_lens shape",
         set_("seq_lens", lambda t: t.repeat(2))),
    case(r"block_tables.* out of range", "block_id_too_large", "decode",
         r"block_tables\[1, 1\]",
         lambda a: poke("block_tables", (1, 1), a["key_cache"].shape[0])(a)),
    case(r"block_tables.* out of range", "block_id_negative", "decode",
         r"block_tables\[0, 64\] = -1", poke("block_tables", (0, 64), -1)),
    case(r"seq_lens.* negative", "seq_len_negative", "decode", r"seq_lens\[1\] = -1",
         poke("seq_lens", 1, -1)),
    case(r"seq_lens.* exceeds", "seq_len_exceeds_table", "decode", r"seq_lens\[1\]",
         lambda a: poke("seq_lens", 1, a["block_tables"].shape[1] * 8 + 1)(a)),
    case(r"slot_mapping.* out of range", "slot_out_of_range", "reshape_and_cache_flash",
         r"slot_mapping\[1\] = 32", poke("slot_mapping", 1, 4 * 8)),
    case(r"(key|value) shape", "key_shape", "reshape_and_cache_flash", r"key shape",
         set_("key", lambda t: t[:, 0])),
    case(r"(key|value) shape", "key_heads_vs_cache", "reshape_and_cache_flash",
         r"key shape .* does not match key_cache \(num_kv_heads = key_cache.size\(2\) = 2\)",
         chain(set_("key", lambda t: torch.randn(6, 1, 32)),
               set_("value", lambda t: torch.randn(6, 1, 32)))),
    case(r"(key|value) shape", "value_shape", "reshape_and_cache_flash", r"value shape",
         set_("value", lambda t: t[:5].contiguous())),
    case(r"slot_mapping shape", "more_slots_than_key_rows", "reshape_and_cache_flash",
         r"slot_mapping shape \[7\] must be \[num_tokens\] with num_tokens <= key.size\(0\) = 6",
         set_("slot_mapping", lambda t: torch.cat([t, t[:2]]))),
    case(r"slot_mapping shape", "slot_mapping_contiguous", "reshape_and_cache_flash",
         r"slot_mapping shape .* contiguous", set_("slot_mapping", noncontig_copy)),
]
CASES += DECODE_CASES


def _snapshot(args, op):
    return {n: args[n].clone() for n in MUTATED[op] if args[n].device.type != "meta"}


def _assert_untouched(args, before):
    for name, old in before.items():
        new = args[name]
        if new.shape == old.shape and new.dtype == old.dtype:
            torch.testing.assert_close(new, old, rtol=0, atol=0, equal_nan=True,
                                       msg=lambda m, n=name: f"{n} modified by a rejected call: {m}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_valid_baseline_is_accepted(backend, op):
    """Without this, every case below could pass by rejecting a call that was already bad."""
    args = make_args(op)
    _fn(backend, op)(*args.values())
    if op == "reshape_and_cache":
        assert not args["key_cache"][0, :, :, 3].isnan().any()  # slot 3 written
    elif op == "reshape_and_cache_flash":
        assert not args["key_cache"][0, 3].isnan().any()  # slot 3 written
        assert not args["value_cache"][3, 7].isnan().any()  # slot 31 written
    else:
        assert not args["out"].isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op,row_regex,regex,mutate,compiled_regex", CASES)
def test_bad_input_raises_value_error(backend, op, row_regex, regex, mutate, compiled_regex):
    if backend == "ops" and compiled_regex and backends.compiled_kernel(op, "CPU"):
        row_regex = regex = compiled_regex
    args = make_args(op)
    mutate(args)
    before = _snapshot(args, op)
    fn = _fn(backend, op)
    with pytest.raises(ValueError) as info:
        fn(*args.values())
    message = str(info.value)
    assert message.startswith(f"paged_attn.{op}: "), message
    assert re.search(row_regex, message), f"{message!r} does not match the table's {row_regex!r}"
    assert re.search(regex, message), f"{message!r} does not match {regex!r}"
    _assert_untouched(args, before)


def test_every_design_table_row_has_a_case():
    covered = {p.values[1] for p in CASES} | {p.values[4] for p in CASES if p.values[4]}
    missing = [row for row, regex in DESIGN_ROWS.items() if regex not in covered]
    assert not missing, f"DESIGN.md rows without a bad-input case: {missing}"
