"""paged_attention_ext: vLLM-compatible PagedAttention decode ops for PyTorch.

Importing this package makes `torch.ops.paged_attn.v1`, `.v2`, `.reshape_and_cache` (vLLM's
cache layout) and `.decode`, `.reshape_and_cache_flash` (NHD / HND caches) available:
from the compiled extension `_C` (CPU kernel, and CUDA kernels in a CUDA build) when it was built,
otherwise from the pure-PyTorch implementation (same schemas, any device torch supports).

Environment: PAGED_ATTN_DISABLE_EXTENSION=1 never loads `_C`; PAGED_ATTN_REQUIRE_EXTENSION=1 makes
this import fail unless `_C` loads (or is disabled), instead of falling back to the PyTorch
implementation (scripts/test.sh and CI set it). A `_C` that exists but fails to load (corrupt, or
built against another torch) always warns.
"""

import importlib as _importlib
import os as _os
import warnings as _warnings

from . import fallback, reference
from ._registration import register as _register

__version__ = "0.1.0"


def _load_extension():
    """(status, error); status is 'loaded', 'disabled', 'not built' or 'failed to load'."""
    if _os.environ.get("PAGED_ATTN_DISABLE_EXTENSION") == "1":
        return "disabled", ImportError("disabled by PAGED_ATTN_DISABLE_EXTENSION=1")
    try:  # loading the library runs its TORCH_LIBRARY registrations
        _importlib.import_module(f"{__name__}._C")
    except ModuleNotFoundError as error:
        if error.name == f"{__name__}._C":
            return "not built", error
        return "failed to load", error
    except Exception as error:  # present but unloadable: corrupt, or built against another torch
        return "failed to load", error
    return "loaded", None


EXTENSION_STATUS, EXTENSION_IMPORT_ERROR = _load_extension()


def extension_loaded() -> bool:
    """True when the compiled extension `_C` provides the op schemas and kernels."""
    return EXTENSION_STATUS == "loaded"


def cpu_kernel() -> str:
    """The CPU kernel variant that the next CPU call of the ops runs ("amx", "avx512-bf16",
    "avx512", "avx2-fma", "neon" or "scalar"): the best one this CPU executes, unless the environment
    variable PAGED_ATTN_CPU_KERNEL names another (ValueError if that one cannot run here).
    "python-fallback" when the compiled extension is not loaded."""
    if not extension_loaded():
        return "python-fallback"
    return _C.cpu_kernel()


def cpu_kernel_variants() -> list:
    """Every CPU kernel variant of this build, best first for this CPU, as (name, runnable here,
    note). note: why it cannot run here; for one that runs but was measured slower on this kind
    of CPU than the variant after it in the build's table, why it is ranked after that one;
    else ''. The first runnable one is the default (cpu_kernel())."""
    if not extension_loaded():
        return []
    return list(_C.cpu_kernel_variants())


def cpu_threading():
    """How many threads a CPU call of the ops wakes, as a dict:
      idle_threads             "spin" or "sleep": what idle OpenMP threads do between parallel
                               regions, read once from the environment (GOMP_SPINCOUNT,
                               KMP_BLOCKTIME, OMP_WAIT_POLICY; unset: "spin")
      setting                  the variable that decided it ("OMP_WAIT_POLICY=passive") or
                               "default"
      min_kv_bytes_per_thread  a call wakes one thread (at most torch.get_num_threads()) per
                               this many bytes of K / V it reads: 256 KiB when idle threads spin,
                               4 MiB when waking one means a sleeping thread's wake-up, or the
                               environment variable PAGED_ATTN_CPU_KV_BYTES_PER_THREAD (bytes,
                               read on every call; ValueError if not a positive integer)
      forced                   that variable is set
    None when `_C` is not loaded (the PyTorch implementation threads as torch's ops do)."""
    if not extension_loaded():
        return None
    return dict(_C.cpu_threading())


def build_info():
    """What the loaded extension `_C` was built with, as the extension itself reports it
    (csrc/module.cpp): a dict with
      torch_version         the torch it was compiled against
      cpu_kernel_variants   [name] of the CPU kernel variants compiled, in the build's order
      cpu_kernel_scopes     {name: the calls it computes itself, in words} for the variants that
                            hand other calls to another variant's code ("amx": not every cache)
      compiler              the C++ compiler of its host code ("gcc 12.2.0", "clang 14.0.6")
      openmp                whether the C++ code was compiled with OpenMP; without it every CPU
                            kernel call runs on one thread (docs/BUILD.md)
      registered_kernels    {dispatch key ("CPU", "CUDA"): [op overload ("v2", "v2.scale_tensor")]}
      cuda                  whether CUDA kernels were compiled
      cuda_archs            [image] ("sm_80", "compute_120") the CUDA kernels were compiled for
      cuda_attention_pairs  [(query dtype, kv_cache_dtype)] the CUDA attention kernels exist for
      cuda_head_sizes       [int] the CUDA attention kernels accept
      cuda_runtime_version  CUDART_VERSION of the build (0 without CUDA)
      cuda_attention_kernel which CUDA attention kernel runs ("auto: mma where the code ...",
                            or the kernel PAGED_ATTN_CUDA_KERNEL forces; docs/CUDA.md); "" without
                            CUDA
      cuda_split            how the CUDA v1 / decode ops split rows across thread blocks ("auto: 8
                            blocks per SM", or what PAGED_ATTN_CUDA_SPLIT sets; docs/CUDA.md); ""
                            without CUDA
      cuda_pdl              whether a split's reduce kernel is launched with programmatic dependent
                            launch ("off", or "on where ..." with PAGED_ATTN_CUDA_PDL=1;
                            docs/CUDA.md); "" without CUDA
      cuda_baseline_kernel  which archs' code holds the baseline CUDA kernel: "every arch" (built
                            with PAGED_ATTN_CUDA_BASELINE=1) or "below sm_80 only"; "" without CUDA
    None when `_C` is not loaded (extension_status() says why)."""
    if not extension_loaded():
        return None
    return _C.build_info()

def extension_status() -> str:
    """What happened to the compiled extension `_C`, in words (for `info` and skip reasons)."""
    if EXTENSION_STATUS == "loaded":
        return f"loaded from {_C.__file__}"
    if EXTENSION_STATUS == "disabled":
        return "disabled by PAGED_ATTN_DISABLE_EXTENSION=1"
    if EXTENSION_STATUS == "not built":
        return ("not built (no _C module in the package: "
                "build it with `python setup.py build_ext --inplace`)")
    return f"failed to load: {type(EXTENSION_IMPORT_ERROR).__name__}: {EXTENSION_IMPORT_ERROR}"


if EXTENSION_STATUS in ("not built", "failed to load"):
    if _os.environ.get("PAGED_ATTN_REQUIRE_EXTENSION") == "1":
        raise ImportError("paged_attention_ext: PAGED_ATTN_REQUIRE_EXTENSION=1 but the compiled "
                          f"extension _C was not loaded: {extension_status()}"
                          ) from EXTENSION_IMPORT_ERROR
    if EXTENSION_STATUS == "failed to load":
        _warnings.warn(f"paged_attention_ext: the compiled extension _C {extension_status()}; "
                       "serving the ops from the PyTorch implementation instead "
                       "(PAGED_ATTN_REQUIRE_EXTENSION=1 makes this an error)",
                       RuntimeWarning, stacklevel=2)



NO_OPENMP_WARNING = ("paged_attention_ext: the compiled extension _C was built without OpenMP "
                     "(its compiler had none), so every CPU kernel call runs on one thread; "
                     "rebuild with a compiler that has OpenMP (docs/BUILD.md, \"OpenMP\")")


def _torch_mismatch(built: str, running: str):
    """A warning text when `_C` was compiled against another torch release than the one
    running (local tags such as +cu130 aside), else None. torch's C++ ABI is not stable across
    releases: such a _C may load and still misbehave."""
    if built.split("+")[0] == running.split("+")[0]:
        return None
    return (f"paged_attention_ext: the compiled extension _C was built against torch {built} but "
            f"torch {running} is running; rebuild it against this torch (`python setup.py "
            "build_ext --inplace`, or reinstall with `pip install --no-build-isolation -e .`)")


if EXTENSION_STATUS == "loaded":
    import torch as _torch

    _build = _C.build_info()
    _mismatch = _torch_mismatch(_build["torch_version"], _torch.__version__)
    if _mismatch:
        _warnings.warn(_mismatch, RuntimeWarning, stacklevel=2)
    if not _build["openmp"]:
        _warnings.warn(NO_OPENMP_WARNING, RuntimeWarning, stacklevel=2)

# The PyTorch implementation that serves devices with no compiled kernel.
_register(extension_loaded(), fallback)

from .api import (PARTITION_SIZE, allocate_kv_cache, allocate_paged_kv_cache,  # noqa: E402
                  paged_attention, paged_decode, reshape_and_cache, reshape_and_cache_flash)

__all__ = ["PARTITION_SIZE", "allocate_kv_cache", "allocate_paged_kv_cache", "paged_attention",
           "paged_decode", "reshape_and_cache", "reshape_and_cache_flash", "extension_loaded",
           "extension_status", "cpu_kernel", "cpu_kernel_variants", "build_info", "reference"]
