"""Python-side registration of the paged_attn ops.

- When the compiled extension `_C` is missing, define the schemas here (paged_attention_ext/
  schemas.py, the list csrc/ops.cpp is built from), so user code never changes.
- Always register:
  * fake (meta) kernels for torch.compile / opcheck: shape checks only, no data reads;
  * the pure-PyTorch implementation for CompositeExplicitAutograd, so any device with no compiled
    kernel (a CPU-only build used on CUDA, an exotic accelerator) still runs. Compiled CPU / CUDA
    kernels take precedence over it for their own devices.
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


def register(extension_loaded: bool, implementation) -> None:
    if not extension_loaded:
        _define_schemas()
    _register_impls(implementation)
