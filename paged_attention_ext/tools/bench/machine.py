"""Facts about the machine and process a benchmark figure depends on (printed and stored in
the JSON beside the numbers)."""

from __future__ import annotations

import datetime
import os
import platform

import torch

from ..backends import cpu_threads_rule, op_backend_name


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def omp_wait_policy_at_start() -> str:
    """OMP_WAIT_POLICY as the process started (libgomp reads it once, when torch loads it):
    /proc/self/environ holds the environment of exec, not later os.environ edits."""
    try:
        with open("/proc/self/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"OMP_WAIT_POLICY="):
                    return item.split(b"=", 1)[1].decode()
        return "unset"
    except OSError:
        return os.environ.get("OMP_WAIT_POLICY", "unset")


def _cpu_kernel() -> str:
    """The variant of our CPU kernel that the ops run (what the CPU rows measure)."""
    import paged_attention_ext

    try:
        name = paged_attention_ext.cpu_kernel()
    except ValueError as exc:
        return f"error: {exc}"
    build = paged_attention_ext.build_info()
    if build is not None and not build["openmp"]:
        name += " (built without OpenMP: one thread)"
    return name


def _cpu_threads_rule() -> str:
    """How many threads a CPU call of our kernel wakes (paged_attention_ext.cpu_threading)."""
    import paged_attention_ext

    try:
        t = paged_attention_ext.cpu_threading()
    except ValueError as exc:
        return f"error: {exc}"
    if t is None:
        return "no compiled kernel"
    return cpu_threads_rule(t)


def cuda_settings() -> str:
    """Which CUDA attention kernel, split aim and reduce launch our ops run (build_info(): the
    PAGED_ATTN_CUDA_KERNEL / _SPLIT / _PDL settings or their defaults), for CUDA tables."""
    import paged_attention_ext

    build = paged_attention_ext.build_info()
    if not build or not build["cuda"]:
        return "no CUDA kernels compiled"
    return (f"kernel {build['cuda_attention_kernel']}; split {build['cuda_split']}; "
            f"reduce PDL {build['cuda_pdl']}")


def machine_info(device: str) -> dict:
    info = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host_cpu": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_kernel": _cpu_kernel(),
        "omp_wait_policy": omp_wait_policy_at_start(),
        "cpu_threads_rule": _cpu_threads_rule(),
        "device": device,
        "op_backend": op_backend_name(device),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    cuda=torch.version.cuda, cuda_settings=cuda_settings())
    return info
