"""Python-side registration of the paged_attn ops.

- When the compiled extension `_C` is missing, define the schemas here (paged_attention_ext/
  schemas.py, the list csrc/ops.cpp is built from), so user code never changes.
- Always register:
  * fake (meta) kernels for torch.compile / opcheck: shape checks only, no data reads;
  * the pure-PyTorch implementation for CompositeExplicitAutograd, so any device with no compiled
    kernel (a CPU-only build used on CUDA, an exotic accelerator) still runs. Compiled CPU / CUDA
    kernels take precedence over it for their own devices.
- Resolve each packet's overload from the scales' Python types (_install_scale_resolution): a
  call through `torch.ops.paged_attn.<op>(...)` with float scales would otherwise first fail to
  match the `.scale_tensor` overload (schemas.py), which costs more than a small call itself.
"""

import torch

from . import op_args, schemas, validation

_LIBS = []  # keep torch.library.Library objects alive: dropping them unregisters the ops


def _define_schemas():
    lib = torch.library.Library(schemas.LIBRARY, "DEF")
    for schema in schemas.full_schemas():
        lib.define(schema)
    _LIBS.append(lib)


def _check_only(op, args):
    """A fake (meta) kernel's work: the argument checks (shapes only, no data read)."""
    validation.check_args(op, args)


def _register_impls(implementation):
    """`implementation`: a module with a function per op named op_args.function_name(op)
    (paged_attention_v1, ..., decode) taking the op's arguments."""
    lib = torch.library.Library(schemas.LIBRARY, "IMPL")
    for name, _ in schemas.SCHEMAS:
        op = name.partition(".")[0]
        lib.impl(name, getattr(implementation, op_args.function_name(op)),
                 "CompositeExplicitAutograd")
        fake = op_args.function(op, _check_only, f"The fake kernel of {op}: its argument checks.")
        torch.library.register_fake(f"{schemas.LIBRARY}::{name}", fake, lib=lib)
    _LIBS.append(lib)


def _scale_resolver(op, packet):
    """A callable doing what packet's own resolution does, without a failed schema match on the
    common calls: two tensor scales go straight to the `.scale_tensor` overload (torch tries it
    first and it matches), two Python numbers to the default one (the tensor overload cannot
    match a number; torch would try it, fail, then take the default). Anything else (mixed,
    symbolic, missing arguments) goes to torch's own resolution, so errors and corner cases
    stay torch's."""
    fields = op_args.ARGS[op]._fields
    k_at, v_at = fields.index("k_scale"), fields.index("v_scale")
    tensor_op = getattr(packet, schemas.TENSOR_SCALES_OVERLOAD)._op
    float_op = packet.default._op
    resolve = packet._op  # torch's: every overload in schema order
    tensor, numbers = torch.Tensor, (float, int)

    def call(*args, **kwargs):
        n = len(args)
        k = args[k_at] if n > k_at else kwargs.get("k_scale", 1.0)
        v = args[v_at] if n > v_at else kwargs.get("v_scale", 1.0)
        if isinstance(k, tensor) and isinstance(v, tensor):
            return tensor_op(*args, **kwargs)
        if type(k) in numbers and type(v) in numbers:
            return float_op(*args, **kwargs)
        return resolve(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"{schemas.LIBRARY}.{op}"
    call.torch_resolution = resolve  # for the tests: what torch alone would pick
    return call


def _install_scale_resolution():
    """Each packet torch.ops.paged_attn.<op> calls _scale_resolver's callable (the packet's
    `_op`, what OpOverloadPacket.__call__ runs); done once, before anything hashes the packets
    (their hash is their `_op`'s)."""
    namespace = getattr(torch.ops, schemas.LIBRARY)
    for op in schemas.OP_NAMES:
        packet = getattr(namespace, op)
        if not getattr(packet, "_paged_attn_resolution", False):
            packet._op = _scale_resolver(op, packet)
            packet._paged_attn_resolution = True


def register(extension_loaded: bool, implementation) -> None:
    if not extension_loaded:
        _define_schemas()
    _register_impls(implementation)
    _install_scale_resolution()
