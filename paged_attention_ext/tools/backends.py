"""Which implementations of torch.ops.paged_attn.* exist in this process, and how to call each.

One job: detection. `detect()` answers `info`; `active_backends()` lists what `check` and the
tests run, and `backend(name)` finds one of them by its name.
What the package compiled and registered comes from the extension itself
(paged_attention_ext.build_info()); which dispatch key has a kernel now comes from the dispatcher,
so the report is what torch will actually run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Optional

import torch

from .. import schemas
from . import cuda_arch

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
    origin: str  # "C++" (this build of _C registered it), "Python" (any other) or "" (none)


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
    build_info: Optional[dict] = None  # paged_attention_ext.build_info(); None: _C not loaded
    cuda_archs: list = field(default_factory=list)  # images compiled into _C ("sm_90", ...)
    gpus: list = field(default_factory=list)  # GpuInfo per visible CUDA device
    cpu_kernel: str = ""  # the CPU kernel variant our ops run ("avx2-fma", ...) or the error
    cpu_kernel_variants: list = field(default_factory=list)  # [(name, runnable, note)]
    cpu_threading: Optional[dict] = None  # paged_attention_ext.cpu_threading(); None: no _C
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


def _cpu_threading(package) -> Optional[dict]:
    """package.cpu_threading(), or {"error": why} when PAGED_ATTN_CPU_KV_BYTES_PER_THREAD is bad."""
    if package is None:
        return None
    try:
        return package.cpu_threading()
    except ValueError as exc:
        return {"error": str(exc)}


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


def _build_info() -> Optional[dict]:
    package, _ = _import("paged_attention_ext")
    return package.build_info() if package is not None else None


def kernel_info(op: str, key: str, build: Optional[dict] = None) -> KeyInfo:
    """Is a kernel registered for exactly dispatch key `key` of paged_attn::`op` (an overload
    name: "v2", "v2.scale_tensor"), and did this build of _C register it (build_info's
    registered_kernels; `build` defaults to the loaded package's) or Python code?"""
    if not (_op_exists(f"{_LIB}::{op}")
            and torch._C._dispatch_has_kernel_for_dispatch_key(f"{_LIB}::{op}", key)):
        return KeyInfo(False, "")
    build = _build_info() if build is None else build
    ours = build is not None and op in build.get("registered_kernels", {}).get(key, [])
    return KeyInfo(True, "C++" if ours else "Python")


def compiled_kernel(op: str, key: str, build: Optional[dict] = None) -> bool:
    """True when this build's C++/CUDA kernel (not a Python registration) serves `op` under
    `key`."""
    info = kernel_info(op, key, build)
    return info.registered and info.origin == "C++"


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
        cpu_threading=_cpu_threading(package),
        extension_loaded=ext is not None,
        extension_error=ext_error,
        extension_path=_extension_path(ext) if ext else "",
        ops_registered=all(_op_exists(f"{_LIB}::{op}") for op in OPS),
        build_info=package.build_info() if ext is not None else None,
    )
    build = det.build_info or {}
    det.cuda_archs = list(build.get("cuda_archs", []))
    for op in OPS:
        det.kernels[op] = {key: kernel_info(op, key, build)
                           for key in ("CPU", "CUDA", "CompositeExplicitAutograd", "Meta")}
    if det.cuda_available:
        for i in range(torch.cuda.device_count()):
            cap = tuple(torch.cuda.get_device_capability(i))
            det.gpus.append(GpuInfo(i, torch.cuda.get_device_name(i), cap,
                                    cuda_arch.match(cap, det.cuda_archs) if det.cuda_archs
                                    else None))
    det.fallback_available = _import("paged_attention_ext.fallback")[0] is not None
    det.reference_available = _import("paged_attention_ext.reference")[0] is not None
    return det


def fallback_ops() -> Optional[Any]:
    """The Python fallback's functions (paged_attention_v1 / _v2, the others by their op names),
    callable directly, bypassing the dispatcher."""
    module, _ = _import("paged_attention_ext.fallback")
    if module is None:
        return None
    return SimpleNamespace(**{op: getattr(module, f"paged_attention_{op}" if op in ("v1", "v2")
                                          else op) for op in OPS})


def active_backends(det: Optional[Detection] = None) -> list:
    """The implementations that can run here. The Python fallback is listed on its own when
    a compiled CPU kernel hides it from torch.ops; otherwise torch.ops on CPU *is* the fallback."""
    det = det or detect()
    if not det.ops_registered:
        return []
    backends = []
    build = det.build_info or {}
    cpu_compiled = all(compiled_kernel(op, "CPU", build) for op in OPS)
    if cpu_compiled:
        backends.append(Backend("cpu-kernel", "cpu", torch.ops.paged_attn,
                                f"C++ CPU kernel {det.cpu_kernel}"))
        fallback = fallback_ops()
        if fallback is not None:
            backends.append(Backend("python-fallback", "cpu", fallback, "called directly"))
    else:
        backends.append(Backend("python-fallback", "cpu", torch.ops.paged_attn,
                                "via torch.ops (no compiled CPU kernel)"))
    if det.cuda_available:
        # the current device: our kernels refuse a GPU the build does not cover (ops_cuda.cpp)
        current = next((g for g in det.gpus if g.index == torch.cuda.current_device()), None)
        runs_here = current is None or current.match is None or current.match.runs
        cuda_compiled = all(compiled_kernel(op, "CUDA", build) for op in OPS)
        if cuda_compiled and runs_here:
            backends.append(Backend("cuda-kernel", "cuda", torch.ops.paged_attn,
                                    "archs " + (", ".join(det.cuda_archs) or "unknown")))
            fallback = fallback_ops()
            if fallback is not None:
                backends.append(Backend("python-fallback-cuda", "cuda", fallback,
                                        "called directly"))
        elif cuda_compiled:
            fallback = fallback_ops()
            if fallback is not None:
                backends.append(Backend("python-fallback-cuda", "cuda", fallback,
                                        "called directly (our CUDA kernels cannot run on "
                                        "this GPU)"))
        else:
            backends.append(Backend("python-fallback-cuda", "cuda", torch.ops.paged_attn,
                                    "via torch.ops (no compiled CUDA kernel)"))
    return backends


def backend_names(device: str = "cpu") -> list:
    """The names of the active backends whose tensors live on `device` ("cpu", "cuda")."""
    return [b.name for b in active_backends() if b.device == device]


def backend(name: str) -> Backend:
    """The active backend called `name` ("cpu-kernel", "python-fallback", "cuda-kernel",
    "python-fallback-cuda"): what a caller that names a backend runs, never another. LookupError
    naming the active ones when `name` is not active here."""
    active = active_backends()
    for candidate in active:
        if candidate.name == name:
            return candidate
    raise LookupError(f"backend {name!r} is not active here; active: "
                      + (", ".join(b.name for b in active) or "none"))


def op_backend_name(device: str) -> str:
    """What torch.ops.paged_attn.v2 runs on `device`: 'C++ kernel' or 'Python fallback'."""
    key = "CUDA" if device.startswith("cuda") else "CPU"
    return "C++ kernel" if compiled_kernel("v2", key) else "Python fallback"


def _describe_gpus(det: Detection, cuda_compiled: bool) -> list:
    """(topic, text) lines: each visible GPU and whether our kernels run there; without a GPU,
    which common GPUs the compiled archs cover."""
    if det.cuda_archs:
        archs = ", ".join(det.cuda_archs)
    elif det.extension_loaded:
        archs = ("none: this _C was built without the CUDA kernels. To build them: "
                 f"`{cuda_arch.BUILD_CUDA_COMMAND}` (T4 to Blackwell), or on the GPU's machine "
                 "`pip install --no-build-isolation -e .` (its arch; docs/BUILD.md)")
    else:
        archs = "none compiled (extension not loaded)"
    lines = [("CUDA archs", archs)]
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


def _describe_build(build: dict) -> list:
    """(topic, text) lines: what the loaded _C says it was built with."""
    cuda = build["cuda"]
    runtime = build["cuda_runtime_version"]
    lines = [("_C built with", f"torch {build['torch_version']}, {build['compiler']}, " +
              ("OpenMP, " if build["openmp"] else "no OpenMP, ") +
              (f"CUDA {runtime // 1000}.{runtime % 1000 // 10}" if cuda else "no CUDA"))]
    lines += [(f"_C {key} kernels", ", ".join(ops))
              for key, ops in build["registered_kernels"].items()]
    if cuda:
        pairs = ", ".join(f"{dtype}/{cache}" for dtype, cache in build["cuda_attention_pairs"])
        lines.append(("CUDA attention", f"query dtype / kv_cache_dtype {pairs}; head sizes "
                      f"{', '.join(map(str, build['cuda_head_sizes']))}"))
        package, _ = _import("paged_attention_ext")  # loaded: build came from its _C
        kernels = "|".join(package._C.cuda_attention_launches())  # the names, from csrc
        lines.append(("CUDA attention kernel", f"{build['cuda_attention_kernel']}  "
                      f"[PAGED_ATTN_CUDA_KERNEL={kernels} forces one; the baseline is "
                      f"compiled for {build['cuda_baseline_kernel']}]"))
        lines.append(("CUDA v1 / decode split", f"{build['cuda_split']}  "
                      "[PAGED_ATTN_CUDA_SPLIT=off|B|B:T sets another]"))
        lines.append(("CUDA reduce launch", "programmatic dependent launch: "
                      f"{build['cuda_pdl']}  [PAGED_ATTN_CUDA_PDL=1|0]"))
    return lines


def _cpu_threads(build: dict, threading: dict) -> str:
    """How many threads a CPU kernel call runs on: up to torch's intra-op threads, one per
    threading["min_kv_bytes_per_thread"] of K / V (paged_attention_ext.cpu_threading), or one
    when _C was compiled without OpenMP (at::parallel_for's OpenMP body is inline in ATen's
    headers)."""
    if not build["openmp"]:
        return "1: _C was built without OpenMP (its compiler had none; docs/BUILD.md, \"OpenMP\")"
    threads = f"{torch.get_num_threads()} (torch.get_num_threads(), OpenMP)"
    if "error" in threading:
        return f"{threads}; error: {threading['error']}"
    return f"{threads}; a call wakes {cpu_threads_rule(threading)}"


def cpu_threads_rule(threading: dict) -> str:
    """The rule by which a CPU call of our kernel wakes threads, from
    paged_attention_ext.cpu_threading(): the words `info` and the bench report both print."""
    why = ("PAGED_ATTN_CPU_KV_BYTES_PER_THREAD" if threading["forced"] else
           f"idle OpenMP threads {threading['idle_threads']}: {threading['setting']}")
    return f"one per {threading['min_kv_bytes_per_thread'] / 1024:g} KiB of K/V ({why})"


def describe(det: Detection) -> list:
    """(topic, text) lines for `info`."""
    lines = [("torch", f"{det.torch_version} (CUDA build: {det.torch_cuda or 'no'}, "
                       f"CUDA device: {'yes' if det.cuda_available else 'no'})"),
             ("torch CPU SIMD", det.cpu_capability)]
    if det.extension_loaded:
        lines.append(("extension _C", f"loaded from {det.extension_path}"))
        lines += _describe_build(det.build_info)
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
    build = det.build_info or {}
    cpu = all(compiled_kernel(op, "CPU", build) for op in OPS)
    cuda = all(compiled_kernel(op, "CUDA", build) for op in OPS)
    lines.append(("CPU backend", f"compiled kernel, variant {det.cpu_kernel}" if cpu
                  else "PyTorch fallback (no compiled CPU kernel)"))
    if cpu:
        variants = [(f"{name} ({note})" if note else name) if ok else f"{name} (cannot run: {note})"
                    for name, ok, note in det.cpu_kernel_variants]
        lines.append(("CPU kernel variants", ", ".join(variants) +
                      "  [PAGED_ATTN_CPU_KERNEL=<name> forces one]"))
        scope = build.get("cpu_kernel_scopes", {}).get(det.cpu_kernel)
        if scope:
            lines.append((f"CPU kernel {det.cpu_kernel} runs", scope))
        lines.append(("CPU kernel threads", _cpu_threads(build, det.cpu_threading)))
    if cuda:
        archs = ", ".join(det.cuda_archs) or "archs unknown"
        usable = [g for g in det.gpus if g.match is None or g.match.runs]
        state = ("inactive: no CUDA device" if not det.cuda_available else
                 "active" if len(usable) == len(det.gpus) else
                 "active on " + (", ".join(f"cuda:{g.index}" for g in usable) or "no visible GPU"))
        lines.append(("CUDA backend", f"compiled kernel ({archs}); {state}"))
    else:
        state = "PyTorch fallback" if det.cuda_available else "inactive: no CUDA device"
        lines.append(("CUDA backend", ("not compiled" if det.extension_loaded
                                       else "extension not loaded") + f"; {state}"))
    lines += _describe_gpus(det, cuda)
    lines.append(("oracle", "paged_attention_ext.reference" if det.reference_available
                  else "MISSING"))
    lines.append(("fallback", "PyTorch implementation registered as CompositeExplicitAutograd "
                  "(serves devices with no compiled kernel)"))
    lines.append(("check runs", ", ".join(f"{b.name} ({b.device})" for b in active_backends(det))
                  or "nothing"))
    return lines
