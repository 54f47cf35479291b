"""vLLM general plugin: fills the holes in `vllm._custom_ops` with this package's ops.

vLLM calls every `vllm.general_plugins` entry point in each process it starts (the API server,
the engine core, every worker) before that process does any work. This package declares one
(pyproject.toml: `paged_attention_ext = paged_attention_ext.integrations.vllm_plugin:register`),
so installing it is enough. Where `VLLM_PLUGINS` (vLLM's comma-separated allow-list of plugin
names) is set, it must name `paged_attention_ext` for this plugin to run.

`register()` replaces `vllm._custom_ops.<name>` for each of REPLACED_OPS by the function of the
same name in `vllm_compat` only when vLLM's own is unusable, decided from the code alone (no
kernel is run):
  - missing: `_custom_ops` has no attribute of that name;
  - stub: a Python function whose body, after an optional docstring, is the single statement
    `raise NotImplementedError` (bare or called, any message);
  - unregistered: a Python function whose body, after an optional docstring, is the single
    statement `torch.ops.<namespace>.<op>(...)` (or `return` of it) and that torch op is not
    registered in this process (vLLM's wrapper when its compiled library lacks the kernel).
    Another plugin may still register that op after this one ran (plugins run in no set order),
    so the replacement settles at its first call: vLLM's own wrapper if the op is registered by
    then, else ours.
Anything else (a function that does more, a wrapper of another function (`__wrapped__`), a
torch op, a callable whose source cannot be read) counts as working and is never replaced.
vLLM code that calls `ops.<name>(...)` through the module (vLLM's own style: `from vllm import
_custom_ops as ops`) sees the replacement; a name copied out of the module before the plugin ran
(`from vllm._custom_ops import x`) does not.

The plugin never makes vLLM's start-up fail: any error is logged as a warning and nothing is
replaced. It is idempotent: a second call finds its own functions in place and changes nothing.
"""

import ast
import functools
import inspect
import logging
import textwrap
from typing import Callable, Dict, NamedTuple, Optional, Tuple

# A child of vLLM's logger, so that vLLM's log configuration (handler, level) shows these lines.
logger = logging.getLogger("vllm.plugins.paged_attention_ext")

# vllm._custom_ops names this plugin can fill, each with the function of the same name in
# paged_attention_ext.integrations.vllm_compat.
REPLACED_OPS = ("paged_attention_v1", "paged_attention_v2", "reshape_and_cache",
                "reshape_and_cache_flash")


def register() -> Dict[str, str]:
    """The entry point vLLM calls. Returns {op name: why it was replaced} for the ops replaced by
    this call (empty when nothing needed replacing or the plugin could not serve)."""
    try:
        return _fill_holes()
    except Exception as error:  # noqa: BLE001  (a plugin must not stop vLLM from starting)
        logger.warning("paged_attention_ext: vLLM plugin not applied (%s: %s); vLLM's own ops "
                       "are left as they are", type(error).__name__, error, exc_info=True)
        return {}


def _fill_holes() -> Dict[str, str]:
    from vllm import _custom_ops

    holes = {}  # op name -> Hole
    for name in REPLACED_OPS:
        hole = find_hole(getattr(_custom_ops, name, None))
        if hole is not None:
            holes[name] = hole
    if not holes:
        logger.debug("paged_attention_ext: vllm._custom_ops has working %s; nothing replaced",
                     ", ".join(REPLACED_OPS))
        return {}

    # Only now load the ops (the compiled extension, or the PyTorch implementation).
    from . import vllm_compat

    for name, hole in holes.items():
        ours = getattr(vllm_compat, name)
        if hole.awaited_torch_op is not None:
            ours = _chosen_at_first_call(name, getattr(_custom_ops, name), ours,
                                         hole.awaited_torch_op)
        setattr(_custom_ops, name, ours)
        logger.info("paged_attention_ext: vllm._custom_ops.%s was %s; now served by "
                    "paged_attention_ext (%s.%s)", name, hole.reason, vllm_compat.__name__, name)
    return {name: hole.reason for name, hole in holes.items()}


class Hole(NamedTuple):
    reason: str  # why vLLM's op cannot run, in words
    # (namespace, op) of the torch op vLLM's wrapper calls, when that op is merely not registered
    # yet: another plugin (a platform's) may register it after this one ran.
    awaited_torch_op: Optional[Tuple[str, str]] = None


def find_hole(op: Optional[Callable]) -> Optional[Hole]:
    """Why `op` (vllm._custom_ops.<name>, None when missing) cannot run, or None when it counts
    as working (the rule in the module docstring)."""
    if op is None:
        return Hole("missing")
    if getattr(op, "__module__", None) == __package__ + ".vllm_compat":
        return None  # already ours (directly, or wrapped by _chosen_at_first_call)
    statement = _single_statement(op)
    if statement is None:
        return None
    if isinstance(statement, ast.Raise) and _is_not_implemented_error(statement.exc):
        return Hole("a NotImplementedError stub")
    call = statement.value if isinstance(statement, (ast.Expr, ast.Return)) else None
    torch_op = _torch_op_path(call.func) if isinstance(call, ast.Call) else None
    if torch_op is not None and not _torch_op_registered(*torch_op):
        return Hole(f"a call of torch.ops.{torch_op[0]}.{torch_op[1]}, which is not registered",
                    torch_op)
    return None


def _chosen_at_first_call(name: str, vllms: Callable, ours: Callable,
                          torch_op: Tuple[str, str]) -> Callable:
    """A function with our op's signature that, at its first call (when every plugin has run),
    settles on vLLM's own `vllms` if `torch_op` is registered by then, else on `ours`."""
    chosen = []

    @functools.wraps(ours)  # also copies __module__, which find_hole reads as "already ours"
    def op(*args, **kwargs):
        if not chosen:
            registered = _torch_op_registered(*torch_op)
            chosen.append(vllms if registered else ours)
            logger.info("paged_attention_ext: vllm._custom_ops.%s runs %s", name,
                        "vLLM's own op (torch.ops.%s.%s is registered now)" % torch_op
                        if registered else "paged_attention_ext's op")
        return chosen[0](*args, **kwargs)

    return op


def _single_statement(op: Callable) -> Optional[ast.stmt]:
    """The one statement of a Python function's body after its docstring; None when the body has
    more, or `op` is not a function whose source can be read, or it wraps another (a
    `functools.wraps` wrapper, whose source inspect would take from the wrapped function)."""
    if not inspect.isfunction(op) or hasattr(op, "__wrapped__"):
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(op)))
    except (OSError, TypeError, SyntaxError):
        return None
    if not tree.body or not isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = tree.body[0].body
    if ast.get_docstring(tree.body[0]) is not None:
        body = body[1:]
    return body[0] if len(body) == 1 else None


def _is_not_implemented_error(exc: Optional[ast.expr]) -> bool:
    if isinstance(exc, ast.Call):
        exc = exc.func
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _torch_op_path(func: ast.expr):
    """(namespace, op) when `func` is the expression `torch.ops.<namespace>.<op>`, else None."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    parts.reverse()
    if len(parts) == 4 and parts[:2] == ["torch", "ops"]:
        return parts[2], parts[3]
    return None


def _torch_op_registered(namespace: str, op: str) -> bool:
    import torch

    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True
