"""The implementations a test can run, by name, each called with the ops' vLLM argument order.

- "ops": torch.ops.paged_attn.* on CPU tensors: the C++ CPU kernel when the extension is built,
  else the PyTorch implementation registered by the package.
- "fallback": paged_attention_ext.fallback called directly (the fast PyTorch implementation), when
  that module exists.
The oracle (paged_attention_ext.reference) is the judge, not a backend here.
"""

import importlib
from types import SimpleNamespace

import torch

import paged_attention_ext  # noqa: F401  (registers the ops)


def _ops_backend():
    ops = torch.ops.paged_attn
    return SimpleNamespace(v1=ops.v1, v2=ops.v2, reshape_and_cache=ops.reshape_and_cache)


def _fallback_backend():
    try:
        fb = importlib.import_module("paged_attention_ext.fallback")
    except ImportError:
        return None
    return SimpleNamespace(v1=fb.paged_attention_v1, v2=fb.paged_attention_v2,
                           reshape_and_cache=fb.reshape_and_cache)


def available_backends():
    """{name: namespace with v1, v2, reshape_and_cache}."""
    backends = {"ops": _ops_backend()}
    fallback = _fallback_backend()
    if fallback is not None:
        backends["fallback"] = fallback
    return backends


BACKEND_NAMES = list(available_backends())
