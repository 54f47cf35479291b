"""Each op's arguments as one Python record, derived from schemas.py (THE list of the arguments):
names, order and defaults are read from the parsed schemas, never typed again.

  ARGS[op]   a namedtuple type per op (V1Args, V2Args, ReshapeAndCacheArgs, DecodeArgs,
             ReshapeAndCacheFlashArgs): its fields are the schema's arguments in order, its
             defaults those of the float-scale overload (the `.scale_tensor` one has none for
             kv_cache_dtype / k_scale / v_scale). ARGS[op](*args, **kwargs) binds a call as the
             op does: positionally or by name, defaults filling the rest, TypeError for a missing
             or unknown argument.
  function   makes a Python function with the op's signature (real parameter names, defaults
             and types) that binds its arguments to the record and calls impl(op, args): the
             public functions of reference.py, fallback.py, api.py and vllm_compat.py.

Every Python layer past the public signature passes (op name, record): the fake kernels,
validation.check_args, the oracle, the fallback. tests/test_op_args.py ties the public
signatures to the schemas.
"""

import collections
import inspect
from typing import Optional, Union

import torch

from . import schemas

# The Python function of each op in reference.py, fallback.py and vllm_compat (vLLM's names);
# an op not listed here is its own name.
_FUNCTION_NAMES = {"v1": "paged_attention_v1", "v2": "paged_attention_v2"}

# Schema types -> Python annotations (for inspect.signature).
_ANNOTATIONS = {"Tensor": torch.Tensor, "Optional[Tensor]": Optional[torch.Tensor], "int": int,
                "float": float, "str": str}


def function_name(op):
    """The Python name of op's function: 'paged_attention_v1' for v1, else the op's name."""
    return _FUNCTION_NAMES.get(op, op)


def _overloads(op):
    """{overload name: torch FunctionSchema} of op's schemas ('v1', 'v1.scale_tensor')."""
    return {name: torch._C.parse_schema(f"{schemas.LIBRARY}::{name}{signature}")
            for name, signature in schemas.SCHEMAS if name.partition(".")[0] == op}


def _parameters(op):
    """[(name, default or inspect.Parameter.empty, annotation)] of op, in schema order. The
    overloads must agree on the names; defaults come from the default (float-scale) overload;
    an argument typed differently by the overloads (k_scale: float or Tensor) is a Union."""
    overloads = _overloads(op)
    names = {name: [a.name for a in s.arguments] for name, s in overloads.items()}
    if len({tuple(n) for n in names.values()}) != 1:
        raise ValueError(f"schemas.py: the overloads of {op} name their arguments differently: "
                         f"{names}")
    params = []
    default_first = [overloads[op]] + [s for name, s in overloads.items() if name != op]
    for i, arg in enumerate(overloads[op].arguments):
        types = tuple(dict.fromkeys(_ANNOTATIONS[str(s.arguments[i].type)]
                                    for s in default_first))
        default = arg.default_value if arg.has_default_value() else inspect.Parameter.empty
        params.append((arg.name, default, types[0] if len(types) == 1 else Union[types]))
    return params


def record_type(op, rename=None):
    """A namedtuple type of op's arguments (schema names, order, defaults); rename: {schema name:
    other name} for a signature that spells some arguments its own way (the seed's `output`)."""
    rename = rename or {}
    params = _parameters(op)
    type_name = "".join(part.title() for part in op.split("_")) + "Args"  # v1 -> V1Args
    defaults = [d for _, d, _ in params if d is not inspect.Parameter.empty]
    return collections.namedtuple(type_name, [rename.get(n, n) for n, _, _ in params],
                                  defaults=defaults)


ARGS = {op: record_type(op) for op in schemas.OP_NAMES}
V1Args, V2Args = ARGS["v1"], ARGS["v2"]
ReshapeAndCacheArgs, DecodeArgs = ARGS["reshape_and_cache"], ARGS["decode"]
ReshapeAndCacheFlashArgs = ARGS["reshape_and_cache_flash"]


def scratch(args):
    """(exp_sums, max_logits, tmp_out) of v2's record, (None, None, None) of v1's: the one
    difference between their arguments."""
    if isinstance(args, V2Args):
        return args.exp_sums, args.max_logits, args.tmp_out
    return None, None, None


def with_scratch(args, exp_sums, max_logits, tmp_out):
    """v1's record plus v2's scratch tensors: v2's record."""
    return V2Args(**args._asdict(), exp_sums=exp_sums, max_logits=max_logits, tmp_out=tmp_out)


# op -> (default overload, packet, `.scale_tensor` overload), indexed by how many of the two
# scales are tensors; filled on first use (the ops are registered after this module loads).
_BY_TENSOR_SCALES = {}


def overload(op, k_scale=1.0, v_scale=1.0):
    """The overload of torch.ops.paged_attn.<op> that torch.ops would pick for these scales,
    named directly: `.scale_tensor` for two tensors, the default one for two numbers, else the
    packet itself (torch resolves mixed scales). The packet makes the same choice
    (_registration.py); naming the overload skips that Python step."""
    return _overload_choices(op)[isinstance(k_scale, _Tensor) + isinstance(v_scale, _Tensor)]


def _direct(choices):
    """The overloads' C++ callables (what OpOverload.__call__ calls: one Python frame less, 0.25 us
    of a 6 us call); the packet as it is. Only outside torch.compile's tracing, which knows the
    OpOverloads and not these."""
    return tuple(getattr(o, "_op", o) if isinstance(o, torch._ops.OpOverload) else o
                 for o in choices)


def _overload_choices(op):
    """op's overloads indexed by how many of the two scales are tensors (overload)."""
    choices = _BY_TENSOR_SCALES.get(op)
    if choices is None:
        packet = getattr(getattr(torch.ops, schemas.LIBRARY), op)
        choices = (packet.default, packet, getattr(packet, schemas.TENSOR_SCALES_OVERLOAD))
        _BY_TENSOR_SCALES[op] = choices
    return choices


_Tensor = torch.Tensor  # (a module global: one lookup less per call)

# Where k_scale and v_scale sit in each op's arguments.
_SCALE_INDEX = {op: (record._fields.index("k_scale"), record._fields.index("v_scale"))
                for op, record in ARGS.items()}


def _int_tail(record):
    """(index, defaults) of the trailing arguments of `record` whose defaults are ints (v1 / v2:
    tp_rank and the blocksparse ones); (len, ()) when the last default is not an int."""
    defaults = list(record._field_defaults.values())
    n = 0
    while n < len(defaults) and type(defaults[-1 - n]) is int:
        n += 1
    return len(record._fields) - n, tuple(defaults[len(defaults) - n:])


def _caller_source(op, name, fields):
    """Source of `def name(<fields: op's arguments>)` that calls op's overload for its scales (its
    C++ callable, _direct, unless torch.compile is tracing the call). Trailing int arguments
    that are their defaults (the very objects: CPython shares small ints) are left to the
    schema's defaults: the dispatcher fills a default faster than it parses an argument (v1's
    five: 0.4 us of a 6 us call)."""
    start, tail = _INT_TAIL[op]
    k_scale, v_scale = (fields[i] for i in _SCALE_INDEX[op])
    src = (f"def {name}({', '.join(fields)}):\n"  # overload's choice, inlined (_direct)
           f"    op = (_choices or _resolve())[isinstance({k_scale}, _Tensor) + "
           f"isinstance({v_scale}, _Tensor) + 3 * _compiling()]\n")
    if tail:
        same = " and ".join(f"{f} is _tail{i}" for i, f in enumerate(fields[start:]))
        src += f"    if {same}:\n        return op({', '.join(fields[:start])})\n"
    return src + f"    return op({', '.join(fields)})\n"


def _make_caller(op, name, fields):
    namespace = {"_op": op, "_Tensor": _Tensor, "_choices": None,
                 "_compiling": torch.compiler.is_compiling}

    def resolve():  # overload's choices, looked up on the first call (the ops register late)
        choices = _overload_choices(op)
        namespace["_choices"] = _direct(choices) + choices
        return namespace["_choices"]

    namespace["_resolve"] = resolve
    namespace.update({f"_tail{i}": d for i, d in enumerate(_INT_TAIL[op][1])})
    exec(_caller_source(op, name, fields), namespace)
    return namespace[name]


_INT_TAIL = {op: _int_tail(record) for op, record in ARGS.items()}
_CALLERS = {op: _make_caller(op, function_name(op), record._fields) for op, record in ARGS.items()}


def caller(op):
    """The fastest Python call of torch.ops.paged_attn.<op>: a function of all of op's arguments
    in schema order (as call_op's args), the overload for its scales (_caller_source), then the
    dispatcher picks the backend."""
    return _CALLERS[op]


def call_op(op, args):
    """torch.ops.paged_attn.<op>(*args), args all of the op's arguments in schema order (a record
    of ARGS[op] or a plain tuple), through caller(op)."""
    return _CALLERS[op](*args)


def signature(op, record=None):
    """inspect.Signature of op's arguments (names from `record`, default ARGS[op]) -> None."""
    record = record or ARGS[op]
    return inspect.Signature(
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                           annotation=annotation)
         for name, (_, default, annotation) in zip(record._fields, _parameters(op))],
        return_annotation=None)


def function(op, impl, doc, record=None, name=None, module=None):
    """A Python function of op with signature(op, record) that returns impl(op, args), args its
    arguments bound to `record` (default ARGS[op]). name: default function_name(op); module:
    the module it is a public name of (default impl's).

    NOTE: a real `def` with named parameters (generated from record's fields, as namedtuple
    makes its __new__), not a (*args, **kwargs) wrapper: torch.compile(fullgraph=True) of the
    fallback through such a wrapper failed in its static plan (divmod of the token extent;
    tests/test_fallback.py test_compile_fullgraph_v1_v2)."""
    record = record or ARGS[op]
    name = name or function_name(op)
    params = ", ".join(record._fields)
    if impl is call_op:  # the op itself: caller's body, no record made
        bound = _make_caller(op, name, record._fields)
    else:
        namespace = {"_impl": impl, "_op": op, "_record": record}
        exec(f"def {name}({params}):\n    return _impl(_op, _record({params}))\n", namespace)
        bound = namespace[name]
    bound.__defaults__ = tuple(record._field_defaults.values())  # the last fields' defaults
    bound.__module__ = module or impl.__module__
    bound.__doc__ = doc
    parameters = signature(op, record).parameters.values()
    bound.__annotations__ = {p.name: p.annotation for p in parameters}
    bound.__annotations__["return"] = None
    return bound
