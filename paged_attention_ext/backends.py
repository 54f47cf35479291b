"""Which implementations of torch.ops.paged_attn.* exist in this process, and how to call each.

One job: detection. `detect()` answers `info`; `active_backends()` lists what `check` runs.
Detection reads the dispatcher (which dispatch key has a kernel, and whether the kernel was
registered from C++ or from Python), so it reports what torch will actually run.
"""

from __future__ import annotations

import importlib
import os
import re
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import torch

from . import cuda_arch, schemas

OPS = schemas.OP_NAMES
_LIB = "paged_attn"


@dataclass(frozen=True)
class Backend:
    """One implementation `check` and `bench` can call. `ops` has every op of schemas.OP_NAMES
    with torch.ops.paged_attn's argument lists (float k_scale / v_scale overload)."""

    name: str    # "cpu-kernel", "cuda-kernel", "python-fallback"
    device: str  # "cpu" or "cuda": where its input tensors live
    ops: Any
    detail: str = ""


@dataclass
class KeyInfo:
    """What the dispatcher holds for one op under one dispatch key."""

    registered: bool
    origin: str  # "C++", "Python" or "" (not registered)
    where: str   # "file:line" the registration came from


@dataclass(frozen=True)
class GpuInfo:
    """One visible CUDA device and whether this build's kernels can run on it."""

    index: int
    name: str
    capability: tuple          # (major, minor)
    match: Optional[cuda_arch.Match]  # None: no CUDA kernels compiled (or their archs unknown)


@dataclass
class Detection:
    torch_version: str
    torch_cuda: Optional[str]
    cuda_available: bool
    cpu_capability: str  # torch's own SIMD level (ATen kernels), not ours
    extension_loaded: bool
    extension_error: str
    extension_path: str
    ops_registered: bool
    kernels: dict = field(default_factory=dict)  # op -> {dispatch key -> KeyInfo}
    cuda_archs: list = field(default_factory=list)  # archs compiled into _C ("sm_90", ...)
    gpus: list = field(default_factory=list)  # GpuInfo per visible CUDA device
    cpu_kernel: str = ""  # the CPU kernel variant our ops run ("avx2-fma", ...) or the error
    cpu_kernel_variants: list = field(default_factory=list)  # [(name, runnable, why_not)]
    fallback_available: bool = False
    reference_available: bool = False


def _cpu_kernel(package) -> str:
    """The CPU kernel variant the ops run here, or why none can."""
    if package is None:
        return "none (package not importable)"
    try:
        return package.cpu_kernel()
    except ValueError as exc:  # PAGED_ATTN_CPU_KERNEL names a variant that cannot run
        return f"error: {exc}"


def _import(name: str):
    """(module or None, error text)."""
    try:
        return importlib.import_module(name), ""
    except Exception as exc:  # a broken build must not stop `info`
        return None, f"{type(exc).__name__}: {exc}"


def _op_exists(qualified: str) -> bool:
    """qualified: 'namespace::name' or 'namespace::name.overload'."""
    namespace, _, rest = qualified.partition("::")
    name, _, overload = rest.partition(".")
    try:
        torch._C._dispatch_find_schema_or_throw(f"{namespace}::{name}", overload)
        return True
    except RuntimeError:
        return False


def kernel_info(qualified: str, key: str) -> KeyInfo:
    """Is a kernel registered for exactly this dispatch key of operator `qualified`
    ("paged_attn::v2"), and from which language? _dispatch_dump lines read
    'CPU: registered at /path/file.cpp:42 :: ...'; anything but a C/C++/CUDA source file there
    (a .py file, '<string>') is a Python registration."""
    if not (_op_exists(qualified)
            and torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)):
        return KeyInfo(False, "", "")
    match = re.search(rf"^{key}(?:\[alias\])?: registered at (\S+)",
                      torch._C._dispatch_dump(qualified), re.MULTILINE)
    where = match.group(1) if match else "?"
    origin = "C++" if re.search(r"\.(cpp|cc|cxx|cu|cuh|h|hpp)(:\d+)?$", where) else "Python"
    return KeyInfo(True, origin, where)


def compiled_kernel(op: str, key: str) -> bool:
    """True when a C++/CUDA kernel (not a Python registration) serves `op` under `key`."""
    info = kernel_info(f"{_LIB}::{op}", key)
    return info.registered and info.origin == "C++"


# -- CUDA archs compiled into the extension --------------------------------------------------
# A CUDA fatbinary starts with magic 0xBA55ED50 (u32), version (u16), header size (u16),
# payload size (u64). Each entry then has: kind (u16: 1 PTX, 2 ELF cubin), version (u16),
# header size (u32), padded payload size (u64), ..., the SM number (u32) at byte 28.
_FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def fatbin_archs(blob: bytes) -> list:
    """Sorted 'sm_XX' (cubin) and 'compute_XX' (PTX) names found in a shared library's fatbins."""
    found = set()
    start = blob.find(_FATBIN_MAGIC)
    while start != -1:
        try:
            _, _, header_size, fat_size = struct.unpack_from("<IHHQ", blob, start)
            pos, end = start + header_size, start + header_size + fat_size
            while pos + 32 <= min(end, len(blob)):
                kind, _, entry_header, padded = struct.unpack_from("<HHIQ", blob, pos)
                sm = struct.unpack_from("<I", blob, pos + 28)[0]
                if kind not in (1, 2) or entry_header == 0 or not 10 <= sm < 1000:
                    break
                found.add(("sm_" if kind == 2 else "compute_") + str(sm))
                pos += entry_header + padded
        except struct.error:
            pass
        start = blob.find(_FATBIN_MAGIC, start + 4)
    return sorted(found, key=lambda a: (int(a.split("_")[1]), a))


def _extension_path(module) -> str:
    return getattr(module, "__file__", "") or ""


def detect() -> Detection:
    """Everything `info` prints. Importing the package registers the ops (C++ via _C, and the
    Python fallback); nothing here runs a kernel."""
    package, package_error = _import("paged_attention_ext")
    # NOTE: never import _C behind the package's back: when the package chose not to load it
    # (PAGED_ATTN_DISABLE_EXTENSION=1), Python already defined the schemas, and loading _C would
    # define them a second time, which aborts the process.
    if package is None:
        ext, ext_error = None, package_error
    elif package.extension_loaded():
        ext, ext_error = package._C, ""
    else:
        ext, ext_error = None, package.extension_status()
    det = Detection(
        torch_version=torch.__version__,
        torch_cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_kernel=_cpu_kernel(package),
        cpu_kernel_variants=package.cpu_kernel_variants() if package is not None else [],
        extension_loaded=ext is not None,
        extension_error=ext_error,
        extension_path=_extension_path(ext) if ext else "",
        ops_registered=all(_op_exists(f"{_LIB}::{op}") for op in OPS),
    )
    for op in OPS:
        det.kernels[op] = {key: kernel_info(f"{_LIB}::{op}", key)
                           for key in ("CPU", "CUDA", "CompositeExplicitAutograd", "Meta")}
    if det.extension_path and os.path.exists(det.extension_path):
        with open(det.extension_path, "rb") as f:
            det.cuda_archs = fatbin_archs(f.read())
    if det.cuda_available:
        for i in range(torch.cuda.device_count()):
            cap = tuple(torch.cuda.get_device_capability(i))
            det.gpus.append(GpuInfo(i, torch.cuda.get_device_name(i), cap,
                                    cuda_arch.match(cap, det.cuda_archs) if det.cuda_archs
                                    else None))
    det.fallback_available = _import("paged_attention_ext.fallback")[0] is not None
    det.reference_available = _import("paged_attention_ext.reference")[0] is not None
    return det


def _fallback_ops() -> Optional[Any]:
    """The Python fallback's functions, callable directly (bypassing the dispatcher), if the
    fallback module exposes them under the op names."""
    module, _ = _import("paged_attention_ext.fallback")
    if module is None:
        return None
    names = {op: getattr(module, op, None) or getattr(module, f"paged_attention_{op}", None)
             for op in OPS}
    if not all(callable(fn) for fn in names.values()):
        return None
    return SimpleNamespace(**names)


def active_backends(det: Optional[Detection] = None) -> list:
    """The implementations that can run here. The Python fallback is listed on its own when
    a compiled CPU kernel hides it from torch.ops; otherwise torch.ops on CPU *is* the fallback."""
    det = det or detect()
    if not det.ops_registered:
        return []
    backends = []
    cpu_compiled = all(compiled_kernel(op, "CPU") for op in OPS)
    if cpu_compiled:
        backends.append(Backend("cpu-kernel", "cpu", torch.ops.paged_attn,
                                f"C++ CPU kernel {det.cpu_kernel}"))
        fallback = _fallback_ops()
        if fallback is not None:
            backends.append(Backend("python-fallback", "cpu", fallback, "called directly"))
    else:
        backends.append(Backend("python-fallback", "cpu", torch.ops.paged_attn,
                                "via torch.ops (no compiled CPU kernel)"))
    if det.cuda_available:
        # the current device: our kernels refuse a GPU the build does not cover (ops_cuda.cu)
        current = next((g for g in det.gpus if g.index == torch.cuda.current_device()), None)
        runs_here = current is None or current.match is None or current.match.runs
        if all(compiled_kernel(op, "CUDA") for op in OPS) and runs_here:
            backends.append(Backend("cuda-kernel", "cuda", torch.ops.paged_attn,
                                    "archs " + (", ".join(det.cuda_archs) or "unknown")))
            fallback = _fallback_ops()
            if fallback is not None:
                backends.append(Backend("python-fallback-cuda", "cuda", fallback,
                                        "called directly"))
        elif all(compiled_kernel(op, "CUDA") for op in OPS):
            fallback = _fallback_ops()
            if fallback is not None:
                backends.append(Backend("python-fallback-cuda", "cuda", fallback,
                                        "called directly (our CUDA kernels cannot run on "
                                        "this GPU)"))
        else:
            backends.append(Backend("python-fallback-cuda", "cuda", torch.ops.paged_attn,
                                    "via torch.ops (no compiled CUDA kernel)"))
    return backends


def op_backend_name(device: str) -> str:
    """What torch.ops.paged_attn.v2 runs on `device`: 'C++ kernel' or 'Python fallback'."""
    key = "CUDA" if device.startswith("cuda") else "CPU"
    return "C++ kernel" if compiled_kernel("v2", key) else "Python fallback"


def _describe_gpus(det: Detection, cuda_compiled: bool) -> list:
    """(topic, text) lines: each visible GPU and whether our kernels run there; without a GPU,
    which common GPUs the compiled archs cover."""
    lines = [("CUDA archs", ", ".join(det.cuda_archs) if det.cuda_archs else
              "none compiled" + ("" if det.extension_loaded else " (extension not loaded)"))]
    if not det.gpus:
        lines.append(("CUDA devices", "none visible"))
    for g in det.gpus:
        head = f"{g.name}, compute capability {g.capability[0]}.{g.capability[1]} " \
               f"({cuda_arch.capability_name(g.capability)}): "
        if not cuda_compiled:
            text = "PyTorch fallback (no compiled CUDA kernel)"
        elif g.match is None:
            text = "compiled archs unknown; the first call checks with the driver"
        elif g.match.runs:
            text = f"our kernels run ({g.match.target} {g.match.how})"
        else:
            text = (f"our kernels CANNOT run (compiled for {', '.join(det.cuda_archs)}); "
                    f"calls raise. Rebuild: `{cuda_arch.rebuild_command(g.capability)}`, or "
                    "PAGED_ATTN_DISABLE_EXTENSION=1 for the PyTorch implementation")
        lines.append((f"cuda:{g.index}", head + text))
    if det.cuda_archs and not det.gpus:
        covered, not_covered = [], []
        for name, cap in cuda_arch.COMMON_GPUS:
            m = cuda_arch.match(cap, det.cuda_archs)
            sm = cuda_arch.capability_name(cap)
            if not m.runs:
                not_covered.append(f"{name} ({sm})")
            elif m.target == sm:
                covered.append(f"{name} ({sm})")
            else:  # binary-compatible SASS of an older minor, or PTX compiled by the driver
                covered.append(f"{name} ({sm} -> {m.target}"
                               f"{'' if m.how == 'SASS' else ' JIT'})")
        lines.append(("runs on", "; ".join(covered) or "none of the common GPUs"))
        if not_covered:
            lines.append(("does not run on", "; ".join(not_covered)))
    return lines


def describe(det: Detection) -> list:
    """(topic, text) lines for `info`."""
    lines = [("torch", f"{det.torch_version} (CUDA build: {det.torch_cuda or 'no'}, "
                       f"CUDA device: {'yes' if det.cuda_available else 'no'})"),
             ("torch CPU SIMD", det.cpu_capability)]
    if det.extension_loaded:
        lines.append(("extension _C", f"loaded from {det.extension_path}"))
    else:
        lines.append(("extension _C", f"not loaded: {det.extension_error}"))
    if not det.ops_registered:
        lines.append(("torch.ops.paged_attn", "NOT registered"))
        return lines
    for op in OPS:
        keys = det.kernels[op]
        parts = []
        for key in ("CPU", "CUDA", "CompositeExplicitAutograd", "Meta"):
            info = keys[key]
            if info.registered:
                parts.append(f"{key}: {info.origin}")
        lines.append((f"paged_attn::{op}", ", ".join(parts) or "no kernels"))
    cpu = all(compiled_kernel(op, "CPU") for op in OPS)
    cuda = all(compiled_kernel(op, "CUDA") for op in OPS)
    lines.append(("CPU backend", f"compiled kernel, variant {det.cpu_kernel}" if cpu
                  else "PyTorch fallback (no compiled CPU kernel)"))
    if cpu:
        variants = [name if ok else f"{name} (cannot run: {why})"
                    for name, ok, why in det.cpu_kernel_variants]
        lines.append(("CPU kernel variants", ", ".join(variants) +
                      "  [PAGED_ATTN_CPU_KERNEL=<name> forces one]"))
    if cuda:
        archs = ", ".join(det.cuda_archs) or "archs unknown"
        usable = [g for g in det.gpus if g.match is None or g.match.runs]
        state = ("inactive: no CUDA device" if not det.cuda_available else
                 "active" if len(usable) == len(det.gpus) else
                 "active on " + (", ".join(f"cuda:{g.index}" for g in usable) or "no visible GPU"))
        lines.append(("CUDA backend", f"compiled kernel ({archs}); {state}"))
    else:
        state = "PyTorch fallback" if det.cuda_available else "inactive: no CUDA device"
        lines.append(("CUDA backend", f"not compiled; {state}"))
    lines += _describe_gpus(det, cuda)
    lines.append(("oracle", "paged_attention_ext.reference" if det.reference_available
                  else "MISSING"))
    lines.append(("fallback", "PyTorch implementation registered as CompositeExplicitAutograd "
                  "(serves devices with no compiled kernel)"))
    lines.append(("check runs", ", ".join(f"{b.name} ({b.device})" for b in active_backends(det))
                  or "nothing"))
    return lines
