"""The op registry: C++ and Python schemas agree, overloads resolve as documented, the PyTorch
implementation serves when the extension is absent, and the Python API / README example work."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import paged_attention_ext as pa
from paged_attention_ext import op_args, reference, schemas
from paged_attention_ext.tools import testing

ROOT = Path(__file__).resolve().parents[1]


def _op(name):
    base, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.paged_attn, base), overload or "default")


@pytest.mark.parametrize("name,signature", schemas.SCHEMAS)
def test_registered_schema_equals_python_list(name, signature):
    expected = torch._C.parse_schema(f"{schemas.LIBRARY}::{name}{signature}")
    assert str(_op(name)._schema) == str(expected)


def test_tensor_overload_is_tried_first():
    # ops.cpp / schemas.py register .scale_tensor first so that tensors reach it (see DESIGN.md)
    for base in ("v1", "v2", "reshape_and_cache"):
        assert getattr(torch.ops.paged_attn, base).overloads()[0] == "scale_tensor"


class _RecordOverloads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.called = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "paged_attn":
            self.called.append(func._overloadname)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scale_as_tensor,expected", [(False, "default"), (True, "scale_tensor")])
def test_scale_argument_picks_overload(scale_as_tensor, expected):
    inputs = testing.make_attention_inputs(2, 4, 2, 64, 16, [17, 40], kv_cache_dtype="fp8",
                                           scale_as_tensor=scale_as_tensor, seed=1)
    outputs = testing.alloc_v2_outputs(inputs)
    with _RecordOverloads() as mode:
        testing.call_v2(torch.ops.paged_attn.v2, inputs, outputs)
    assert mode.called == [expected]
    expected_outputs = testing.call_v2(reference.paged_attention_v2, inputs,
                                       testing.alloc_v2_outputs(inputs))
    testing.assert_v2_matches(outputs, expected_outputs, inputs.seq_lens_list, inputs.dtype)


@pytest.mark.parametrize("scale_as_tensor", [False, True])
def test_call_op_names_the_overload_torch_ops_picks(scale_as_tensor):
    # op_args.overload skips torch.ops' search (for float scales a failed match of the tensor
    # overload first); it must land where the search would.
    inputs = testing.make_attention_inputs(2, 4, 2, 64, 16, [17, 40], kv_cache_dtype="fp8",
                                           scale_as_tensor=scale_as_tensor, seed=1)
    picked = []
    for call in (lambda o: testing.call_v2(torch.ops.paged_attn.v2, inputs, o),
                 lambda o: op_args.call_op("v2", op_args.V2Args(
                     *o, *testing._attention_args(inputs)))):
        with _RecordOverloads() as mode:
            call(testing.alloc_v2_outputs(inputs))
        picked.append(mode.called)
    assert picked[0] == picked[1] == [schemas.TENSOR_SCALES_OVERLOAD if scale_as_tensor
                                      else "default"]


def test_overload_is_named_unless_scales_are_mixed():
    one = torch.ones(1)
    for op in schemas.OP_NAMES:
        packet = getattr(torch.ops.paged_attn, op)
        assert op_args.overload(op) is packet.default
        assert op_args.overload(op, 2.0, 0.5) is packet.default
        assert op_args.overload(op, one, one) is getattr(packet, schemas.TENSOR_SCALES_OVERLOAD)
        assert op_args.overload(op, one, 1.0) is packet  # torch resolves a mixed call


def _cache_write_args(seed):
    gen = torch.Generator().manual_seed(seed)
    key, value = (torch.randn(3, 2, 16, generator=gen) for _ in range(2))
    key_cache, value_cache = torch.zeros(4, 2, 4, 4, 4), torch.zeros(4, 2, 16, 4)
    return key, value, key_cache, value_cache, torch.tensor([0, 5, 14])


@pytest.mark.parametrize("k_scale,v_scale,expected", [
    (2.0, 0.5, "default"), (1, 2, "default"),
    (torch.tensor([2.0]), torch.tensor([0.5]), schemas.TENSOR_SCALES_OVERLOAD),
    (torch.tensor([2.0]), 0.5, None), (2.0, torch.tensor(0.5), None)])
@pytest.mark.parametrize("as_keywords", [False, True])
def test_packet_resolves_as_torch_does(k_scale, v_scale, expected, as_keywords):
    # _registration.py resolves each packet's overload from the scales' types (no failed match
    # of the tensor overload for float scales); it must pick what torch's own resolution picks
    # (mixed scales: torch's resolution itself), positional or keyword, and write the same cache.
    packet = torch.ops.paged_attn.reshape_and_cache
    assert packet._paged_attn_resolution
    scales = ({"k_scale": k_scale, "v_scale": v_scale} if as_keywords else {})
    extra = () if as_keywords else (k_scale, v_scale)
    picked, caches = [], []
    for resolve in (packet, packet._op.torch_resolution):
        args = _cache_write_args(seed=3)
        with _RecordOverloads() as mode:
            resolve(*args, "auto", *extra, **scales)
        picked.append(mode.called)
        caches.append(args[2:4])
    assert picked[0] == picked[1]
    if expected is not None:
        assert picked[0] == [expected]
    for ours, torchs in zip(*caches):
        torch.testing.assert_close(ours, torchs, rtol=0, atol=0)


def test_pytorch_implementation_serves_without_extension():
    script = (
        "import torch, paged_attention_ext as pa\n"
        "from paged_attention_ext import reference\n"
        "from paged_attention_ext.tools import testing\n"
        "assert not pa.extension_loaded(), 'extension should be disabled'\n"
        "i = testing.make_attention_inputs(3, 8, 2, 32, 8, [1, 600, 33], dtype=torch.bfloat16)\n"
        "got = testing.call_v2(torch.ops.paged_attn.v2, i, testing.alloc_v2_outputs(i))\n"
        "ref = testing.call_v2(reference.paged_attention_v2, i, testing.alloc_v2_outputs(i))\n"
        "testing.assert_v2_matches(got, ref, i.seq_lens_list, i.dtype)\n"
        "print(torch.ops.paged_attn.v1.default._schema)\n"
    )
    env = dict(os.environ, PAGED_ATTN_DISABLE_EXTENSION="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "paged_attn::v1(Tensor(a!) out" in result.stdout


@pytest.mark.parametrize("version", ["v1", "v2", "auto"])
def test_api_paged_attention_matches_oracle(version):
    inputs = testing.make_attention_inputs(3, 8, 2, 64, 16, [513, 1, 77], dtype=torch.float16,
                                           seed=2)
    out = pa.paged_attention(inputs.query, inputs.key_cache, inputs.value_cache,
                             inputs.block_tables, inputs.seq_lens, max_seq_len=513,
                             scale=inputs.scale, version=version, validate=True)
    expected = testing.call_v1(reference.paged_attention_v1, inputs,
                               testing.alloc_v1_outputs(inputs))
    testing.assert_out_matches(out, expected, inputs.dtype)


def test_api_validate_rejects_bad_block_id():
    inputs = testing.make_attention_inputs(2, 4, 4, 32, 8, [9, 20], seed=3)
    inputs.block_tables[1, 2] = inputs.num_blocks  # used: ceil(20 / 8) = 3 blocks
    with pytest.raises(ValueError, match=r"block_tables.* out of range"):
        pa.paged_attention(inputs.query, inputs.key_cache, inputs.value_cache,
                           inputs.block_tables, inputs.seq_lens, validate=True)


@pytest.mark.parametrize("fn,arg,bad,error,message", [
    ("paged_attention", "query", lambda i: i.query[0], ValueError,
     r"paged_attention: query must be 3-D \[num_seqs, num_heads, head_size\], got shape \[8, 32\]"),
    ("paged_attention", "query", lambda i: i.query.tolist(), TypeError,
     r"paged_attention: query must be a torch.Tensor, got list"),
    ("paged_attention", "key_cache", lambda i: i.key_cache[..., 0], ValueError,
     r"paged_attention: key_cache must be 5-D .*got shape \[\d+, 4, 8, 8\]"),
    ("paged_decode", "query", lambda i: i.query[None], ValueError,
     r"paged_decode: query must be 3-D .*got shape \[1, 2, 8, 32\]"),
    ("paged_decode", "value_cache", lambda i: i.value_cache[:, 0], ValueError,
     r"paged_decode: value_cache must be 4-D \(kv_layout 'hnd'.*got shape"),
])
def test_api_shape_errors_name_the_function(fn, arg, bad, error, message):
    # The API functions read shapes before the op's checks run: a wrong rank or a non-tensor is
    # named, never an unpacking ValueError, IndexError or AttributeError from inside.
    if fn == "paged_attention":
        inputs = testing.make_attention_inputs(2, 8, 4, 32, 8, [9, 20], seed=3)
    else:
        inputs = testing.make_decode_inputs(2, 8, 4, 32, 8, [9, 20], layout="hnd", seed=3)
    kwargs = dict(query=inputs.query, key_cache=inputs.key_cache, value_cache=inputs.value_cache,
                  block_tables=inputs.block_tables, seq_lens=inputs.seq_lens)
    kwargs[arg] = bad(inputs)
    if fn == "paged_decode":
        kwargs["kv_layout"] = "hnd"
    with pytest.raises(error, match=message):
        getattr(pa, fn)(**kwargs)


def test_api_max_seq_len_below_a_row_names_max_seq_len():
    # v2's scratch is sized from max_seq_len: too small a value is named as the caller passed it.
    inputs = testing.make_attention_inputs(2, 4, 2, 32, 8, [600, 20], seed=3)
    with pytest.raises(ValueError, match=r"paged_attention: max_seq_len \(500\) is below the "
                       r"longest seq_len \(600\)"):
        pa.paged_attention(inputs.query, inputs.key_cache, inputs.value_cache,
                           inputs.block_tables, inputs.seq_lens, max_seq_len=500, version="v2")


def test_api_version_and_partitions():
    assert pa.api.num_partitions(0) == 1 and pa.api.num_partitions(513) == 2
    assert pa.api.use_v1(512, 1, 8) and not pa.api.use_v1(513, 1, 8)
    assert pa.api.use_v1(4096, 64, 32) and not pa.api.use_v1(8193, 64, 32)


def test_auto_version_on_cuda_is_v1_unless_the_table_is_much_wider_than_the_rows():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object: no GPU needed
    choose = pa.api.choose_version
    # elsewhere: vLLM's rule, whatever the table
    assert choose(cpu, 513, 1, 8, 1024) == "v2" and choose(cpu, 4096, 64, 32, 4096) == "v1"
    # CUDA: v1 splits rows itself (one row of 100k, 8 rows of 1k: vLLM's rule says v2)
    assert choose(cuda, 100_000, 1, 32, 100_016) == "v1"
    assert choose(cuda, 1024, 8, 32, 1056) == "v1"
    assert choose(cuda, 0, 8, 32, 1024) == "v1"  # 2 x max(max_seq_len, 512) = 1024
    # a table more than twice as wide as the rows need: vLLM's rule
    assert choose(cuda, 1024, 8, 32, 2049) == "v2"
    assert choose(cuda, 1024, 64, 32, 32768) == "v1"  # vLLM's rule: many query heads


@pytest.mark.parametrize("kv_cache_dtype,storage,x", [("auto", torch.bfloat16, 8),
                                                      ("fp8_e5m2", torch.uint8, 16)])
def test_allocate_kv_cache_layout(kv_cache_dtype, storage, x):
    k, v = pa.allocate_kv_cache(10, 4, 128, 16, dtype=torch.bfloat16,
                                kv_cache_dtype=kv_cache_dtype)
    assert k.shape == (10, 4, 128 // x, 16, x) and v.shape == (10, 4, 128, 16)
    assert k.dtype == v.dtype == storage
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        pa.allocate_kv_cache(1, 1, 64, 16, kv_cache_dtype="int4")


def test_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.S)
                if "import torch, paged_attention_ext" in block)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    assert out.shape == (1, 32, 128) and torch.isfinite(out).all()
    # paged_decode on the HND cache written by reshape_and_cache_flash: the same attention
    torch.testing.assert_close(namespace["out_hnd"], out, atol=1e-2, rtol=1e-2)
    # the same attention computed densely: the 40 cached tokens, GQA group of 4
    k = namespace["k"].float()  # [40, kv_heads, head_size]
    q = namespace["query"].float()[0].view(8, 4, 128)  # [kv_heads, group, head_size]
    probs = torch.softmax(torch.einsum("hgd,thd->hgt", q, k) / 128 ** 0.5, dim=-1)
    dense = torch.einsum("hgt,thd->hgd", probs, k).reshape(1, 32, 128)
    torch.testing.assert_close(out.float(), dense, atol=3e-2, rtol=3e-2)
