"""The ops' argument lists are written once (schemas.py): op_args derives a record per op from
it, and every public Python function of an op takes exactly the op's arguments. Held here
against the schemas the dispatcher holds (from the compiled extension when it is loaded)."""

import inspect

import pytest
import torch

import paged_attention_ext as pa
from paged_attention_ext import fallback, op_args, reference, schemas, validation
from paged_attention_ext.integrations import vllm_compat

EMPTY = inspect.Parameter.empty


def _dispatcher_arguments(op):
    """[(name, default)] of the dispatcher's default (float-scale) overload of op."""
    schema = getattr(torch.ops.paged_attn, op).default._schema
    return [(a.name, a.default_value if a.has_default_value() else EMPTY)
            for a in schema.arguments]


def _parameters(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("op", schemas.OP_NAMES)
def test_records_are_the_dispatchers_arguments(op):
    record = op_args.ARGS[op]
    assert list(zip(record._fields, [record._field_defaults.get(f, EMPTY)
                                     for f in record._fields])) == _dispatcher_arguments(op)
    # the .scale_tensor overload: the same names in the same order
    tensor_schema = getattr(torch.ops.paged_attn, op).scale_tensor._schema
    assert [a.name for a in tensor_schema.arguments] == list(record._fields)


@pytest.mark.parametrize("op", schemas.OP_NAMES)
def test_public_functions_take_the_ops_arguments(op):
    want = _dispatcher_arguments(op)
    name = op_args.function_name(op)
    for module in (reference, fallback):
        fn = getattr(module, name)
        assert _parameters(fn) == want, (module.__name__, name)
        assert fn.__name__ == name and fn.__module__ == module.__name__ and fn.__doc__
    if op in ("v1", "reshape_and_cache"):  # vLLM's names, the same arguments
        assert _parameters(getattr(vllm_compat, name)) == want
    if op == "reshape_and_cache":
        assert _parameters(pa.reshape_and_cache) == want


def test_annotations_follow_the_schema_types():
    params = inspect.signature(reference.paged_attention_v2).parameters
    assert params["query"].annotation is torch.Tensor
    assert params["num_kv_heads"].annotation is int and params["scale"].annotation is float
    assert params["kv_cache_dtype"].annotation is str
    assert params["k_scale"].annotation == (float | torch.Tensor)  # the two overloads
    assert params["alibi_slopes"].annotation == (torch.Tensor | None)


def test_binding_is_the_ops():
    args = op_args.DecodeArgs(1, 2, 3, 4, 5, 6, scale=7, alibi_slopes=None, v_scale=0.5)
    assert args.scale == 7 and args.kv_cache_dtype == "auto" and args.k_scale == 1.0
    assert args.v_scale == 0.5
    with pytest.raises(TypeError):
        op_args.DecodeArgs(1, 2, 3)  # missing arguments
    with pytest.raises(TypeError):
        reference.decode(1, 2, 3, 4, 5, 6, 7, None, no_such_argument=1)
    with pytest.raises(TypeError):
        fallback.paged_attention_v1(*range(20))  # one too many


def test_v2_record_is_v1s_plus_the_scratch():
    v1 = op_args.V1Args(*range(11))
    v2 = op_args.with_scratch(v1, "e", "m", "t")
    assert op_args.scratch(v2) == ("e", "m", "t") and op_args.scratch(v1) == (None, None, None)
    assert {f: getattr(v2, f) for f in v1._fields} == v1._asdict()


def test_blocksparse_arguments_are_v1s_and_v2s_last():
    assert validation.BLOCKSPARSE_ARGS == op_args.V2Args._fields[-5:]
    for schema_name, field in zip(validation.BLOCKSPARSE_ARGS, validation.Blocksparse._fields):
        assert schema_name.endswith(field)  # tp_rank, blocksparse_local_blocks, ...
    args = op_args.V1Args(*range(11), "auto", 1.0, 1.0, 3, 4, 5, 6, 7)
    assert validation.blocksparse_of(args) == validation.Blocksparse(3, 4, 5, 6, 7)
    assert validation.blocksparse_spec(args._replace(blocksparse_vert_stride=1)) is None
    assert validation.DENSE == validation.Blocksparse(0, 0, 0, 64, 0)  # vLLM's defaults


def test_keyword_call_is_the_positional_one():
    gen = torch.Generator().manual_seed(1)
    key, value = torch.randn(3, 2, 16, generator=gen), torch.randn(3, 2, 16, generator=gen)
    caches = [torch.full((4, 2, 4, 8, 4), float("nan")), torch.full((4, 2, 16, 8), float("nan"))]
    by_position = [c.clone() for c in caches]
    by_name = [c.clone() for c in caches]
    slots = torch.tensor([5, -1, 30])
    reference.reshape_and_cache(key, value, *by_position, slots)
    reference.reshape_and_cache(value_cache=by_name[1], slot_mapping=slots, key=key, value=value,
                                key_cache=by_name[0])
    for a, b in zip(by_position, by_name):
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    assert not torch.isnan(by_name[1][0, :, :, 5]).any()  # slot 5 was written


@pytest.mark.parametrize("op", ["v1", "v2"])
def test_caller_forwards_every_argument_the_schema_would_not_default(op, monkeypatch):
    # The callers (op_args.caller, the vllm_compat functions) drop v1 / v2's trailing int
    # arguments only when each is its default; the overload follows the scales' types.
    calls = []
    overloads = tuple((lambda i: lambda *a: calls.append((i, a)))(i) for i in range(3))
    monkeypatch.setitem(op_args._BY_TENSOR_SCALES, op, overloads)
    fields = op_args.ARGS[op]._fields
    call = op_args._make_caller(op, "probe", fields)
    start = fields.index("tp_rank")
    head = [object() for _ in range(start)]  # stand-ins, passed through untouched
    head[fields.index("k_scale")], head[fields.index("v_scale")] = 1.0, torch.ones(1)
    defaults = list(op_args.ARGS[op]._field_defaults.values())[-5:]
    assert defaults == [0, 0, 0, 64, 0]
    call(*head, *defaults)
    assert calls[-1][0] == 1 and list(calls[-1][1]) == head  # mixed scales: the packet
    for i in range(5):  # any argument off its default: all of them, in order
        tail = list(defaults)
        tail[i] += 1
        call(*head, *tail)
        assert list(calls[-1][1]) == head + tail
    head[fields.index("v_scale")] = 0.5
    call(*head, *defaults)
    assert calls[-1][0] == 0 and len(calls[-1][1]) == start  # float scales: .default
