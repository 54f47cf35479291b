"""paged_attention_ext: vLLM-compatible PagedAttention decode ops for PyTorch.

Importing this package makes `torch.ops.paged_attn.v1`, `.v2` and `.reshape_and_cache` available:
from the compiled extension `_C` (CPU kernel, and CUDA kernels in a CUDA build) when it was built,
otherwise from the pure-PyTorch implementation (same schemas, any device torch supports).
"""

from . import fallback, reference
from ._registration import register as _register

__version__ = "0.1.0"

import os as _os

if _os.environ.get("PAGED_ATTN_DISABLE_EXTENSION") == "1":  # force the PyTorch implementation
    EXTENSION_IMPORT_ERROR = ImportError("disabled by PAGED_ATTN_DISABLE_EXTENSION=1")
else:
    try:
        from . import _C  # noqa: F401  (loading the library runs its TORCH_LIBRARY registrations)

        EXTENSION_IMPORT_ERROR = None
    except ImportError as error:  # not built, or built against another torch
        EXTENSION_IMPORT_ERROR = error


def extension_loaded() -> bool:
    """True when the compiled extension `_C` provides the op schemas and kernels."""
    return EXTENSION_IMPORT_ERROR is None


def cpu_kernel() -> str:
    """The CPU kernel variant that the next CPU call of the ops runs ("avx512-bf16", "avx512",
    "avx2-fma", "neon" or "scalar"): the best one this CPU executes, unless the environment
    variable PAGED_ATTN_CPU_KERNEL names another (ValueError if that one cannot run here).
    "python-fallback" when the compiled extension is not loaded."""
    if not extension_loaded():
        return "python-fallback"
    return _C.cpu_kernel()


def cpu_kernel_variants() -> list:
    """Every CPU kernel variant of this build, best first, as (name, runnable here, why not)."""
    if not extension_loaded():
        return []
    return list(_C.cpu_kernel_variants())


# The PyTorch implementation that serves devices with no compiled kernel.
_register(extension_loaded(), fallback)

from .api import PARTITION_SIZE, allocate_kv_cache, paged_attention, reshape_and_cache  # noqa: E402

__all__ = ["PARTITION_SIZE", "allocate_kv_cache", "paged_attention", "reshape_and_cache",
           "extension_loaded", "cpu_kernel", "cpu_kernel_variants", "reference"]
