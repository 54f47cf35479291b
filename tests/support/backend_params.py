"""The backends a conformance test runs on, one pytest param each, and how to make one the one
that runs (the `backend` fixture of conftest.py; tests/test_conformance.py).

- cpu-<variant>: every compiled CPU kernel variant of this build (paged_attention_ext.
  cpu_kernel_variants()), forced with PAGED_ATTN_CPU_KERNEL; one this CPU cannot execute is
  skipped with the reason, one that runs is checked to be the one cpu_kernel() names.
- cpu-kernel: the compiled CPU cache writes (csrc/cpu/reshape_and_cache_cpu.cpp: one
  implementation, whatever the attention variant), for the tests that only write caches.
- fallback: the PyTorch implementation (paged_attention_ext.fallback), its functions called
  directly; fallback-<chunking> the same under another chunking (CHUNKINGS), for the tests
  marked `backends(chunkings=True)`.
- cuda-<kernel>: the CUDA attention kernels (baseline, pipelined, mma), forced with
  PAGED_ATTN_CUDA_KERNEL, the extension's launch counters proving afterwards that this kernel and
  no other ran; cuda: the CUDA cache writes. Skipped without a GPU, with the reason.
A backend that is not there is skipped, never replaced by another: backends.backend(name) raises
when the named one is not active.
"""

import contextlib
import dataclasses
from typing import Any

import pytest
import torch

import paged_attention_ext
from paged_attention_ext.tools import backends, testing

# The fallback's chunkings (paged_attention_ext/fallback.py CHUNK_BYTES, PASS_LOGIT_BYTES):
# None for the default plan; (CHUNK_BYTES, PASS_LOGIT_BYTES) of one partition of one row per
# sub-chunk and per pass; the same sub-chunks, all in one pass; everything in one sub-chunk and
# one pass.
CHUNKINGS = {"default": None, "tiny": (1, 1), "one_pass": (1, 1 << 40),
             "one_chunk": (1 << 40, 1 << 40)}

CPU_VARIANTS = paged_attention_ext.cpu_kernel_variants()  # [(name, runnable, note)], best first
CUDA_KERNELS = ("baseline", "pipelined", "mma")  # csrc/cuda/kernel_choice.h
# The head sizes the CUDA kernels are compiled for (csrc/cuda/dispatch.cuh, via build_info()).
CUDA_HEAD_SIZES = tuple((paged_attention_ext.build_info() or {}).get("cuda_head_sizes", ()))


@dataclasses.dataclass(frozen=True)
class Param:
    """What a test asks for: kind "cpu", "fallback" or "cuda", and the choice within it (a CPU
    variant, a chunking, a CUDA kernel; "" for the cache writes, which have one)."""

    kind: str
    choice: str = ""

    @property
    def name(self) -> str:
        if self.kind == "cpu":
            return f"cpu-{self.choice}" if self.choice else "cpu-kernel"
        if self.kind == "fallback":
            return "fallback" if self.choice in ("", "default") else f"fallback-{self.choice}"
        return f"cuda-{self.choice}" if self.choice else "cuda"


@dataclasses.dataclass
class Backend:
    """The backend a test runs: `ops` has every op with torch.ops.paged_attn's argument lists
    (tools.backends.Backend.ops); its tensors live on `device`."""

    name: str
    kind: str
    device: str
    ops: Any

    def require_takes(self, inputs):
        """Skips a case the backend rejects by its own documented limits (the CUDA kernels:
        compiled head sizes, 16-byte aligned caches; tests/test_cuda_kernels.py checks the
        errors), so that a skip names why and never hides a wrong result."""
        if self.kind != "cuda":
            return
        if inputs.head_size not in CUDA_HEAD_SIZES:
            pytest.skip(f"head size {inputs.head_size}: the CUDA kernels are compiled for "
                        f"{', '.join(map(str, CUDA_HEAD_SIZES))}")
        # ops_cuda.cpp check_cuda_attention: data pointers, K's block / head / token strides and
        # V's block / head strides, in bytes, multiples of 16
        k, v = inputs.key_cache, inputs.value_cache
        if k.dim() == 5:  # vLLM's [blocks, heads, head_size / x, block_size, x]; V [.., head_size, block_size]
            strides = (k.stride(0), k.stride(1), k.stride(3)), (v.stride(0), v.stride(1))
        else:  # token-major [blocks, block_size, heads, head_size]
            strides = (k.stride(0), k.stride(1), k.stride(2)), (v.stride(0), v.stride(2))
        for cache, outer in zip((k, v), strides):
            if cache.data_ptr() % 16 or any(s * cache.element_size() % 16 for s in outer):
                pytest.skip(f"{getattr(inputs, 'layout', 'vllm')} caches of {cache.dtype}: not "
                            "16-byte aligned, which the CUDA kernels require")

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()


def params(cpu_variants=True, chunkings=False, slow_off_gpu=False, cuda=True):
    """pytest params (ids: Param.name) of every backend of this build: each CPU variant (or the
    one CPU cache writer), the fallback (under every chunking when `chunkings`), each CUDA
    kernel (or the CUDA cache writer), the CUDA ones marked `cuda`. slow_off_gpu: the CPU and
    fallback params marked slow (long rows or a broad grid: quick on a GPU, seconds on a CPU).
    cuda=False: no CUDA params (tests whose inputs the CUDA kernels' limits would skip)."""
    cpu_slow = [pytest.mark.slow] if slow_off_gpu else []
    if cpu_variants:
        cpu = [Param("cpu", name) for name, _, _ in CPU_VARIANTS] or [Param("cpu", "none")]
    else:
        cpu = [Param("cpu")]
    fallback = [Param("fallback", c) for c in (CHUNKINGS if chunkings else ["default"])]
    gpu = [Param("cuda", k) for k in CUDA_KERNELS] if cpu_variants else [Param("cuda")]
    return ([pytest.param(p, id=p.name, marks=cpu_slow) for p in cpu + fallback]
            + [pytest.param(p, id=p.name, marks=[pytest.mark.cuda]) for p in gpu if cuda])


@contextlib.contextmanager
def activate(param: Param, monkeypatch, test_passed=lambda: True):
    """Makes `param`'s backend the one that runs and yields its Backend (skips when this machine
    cannot run it). On leaving, for a CUDA kernel choice whose test passed (test_passed()), the
    proof that that kernel ran and no other."""
    if param.kind == "cpu":
        yield _cpu(param, monkeypatch)
    elif param.kind == "fallback":
        chunking = CHUNKINGS.get(param.choice)
        if chunking is not None:
            from paged_attention_ext import fallback

            monkeypatch.setattr(fallback, "CHUNK_BYTES", chunking[0])
            monkeypatch.setattr(fallback, "PASS_LOGIT_BYTES", chunking[1])
        yield Backend(param.name, "fallback", "cpu", backends.fallback_ops())
    else:
        ops = _cuda_ops()
        if not param.choice:
            yield Backend(param.name, "cuda", "cuda", ops)
            return
        _skip_unless_cuda_kernel_runs(param.choice)
        with testing.cuda_kernel_setting(param.choice):
            before = testing.cuda_attention_launches()
            yield Backend(param.name, "cuda", "cuda", ops)
            after = testing.cuda_attention_launches()
        if test_passed():
            testing.require_launches_of(param.choice, before, after)


def _cpu(param, monkeypatch):
    if not paged_attention_ext.extension_loaded():
        pytest.skip(f"compiled extension: {paged_attention_ext.extension_status()}")
    if param.choice:
        status = {name: (ok, why) for name, ok, why in CPU_VARIANTS}
        ok, why = status.get(param.choice, (False, "no compiled variants"))
        if not ok:
            pytest.skip(f"CPU kernel variant {param.choice} cannot run here: {why}")
        monkeypatch.setenv("PAGED_ATTN_CPU_KERNEL", param.choice)  # read on every call
        assert paged_attention_ext.cpu_kernel() == param.choice  # the named kernel, not another
    # by name: active only when _C's CPU kernels serve every op (else LookupError: a failure)
    return Backend(param.name, "cpu", "cpu", backends.backend("cpu-kernel").ops)


def _cuda_ops():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (torch.cuda.is_available() is False): the CUDA kernels "
                    "cannot run here (test_cuda_kernels_registered checks that they are registered)")
    if not backends.compiled_kernel("v2", "CUDA"):
        pytest.skip("no compiled CUDA kernel: test_cuda_kernels_registered fails for this build")
    # by name: active only when every op has a compiled CUDA kernel that runs on this GPU
    return backends.backend("cuda-kernel").ops


def _skip_unless_cuda_kernel_runs(name):
    capability = torch.cuda.get_device_capability()
    if name != "baseline" and capability < (8, 0):
        pytest.skip(f"the {name} kernel needs sm_80+ (cp.async, mma.sync); this GPU is sm_"
                    + "".join(map(str, capability)))
    if (name == "baseline" and capability >= (8, 0)
            and paged_attention_ext.build_info()["cuda_baseline_kernel"] != "every arch"):
        pytest.skip("this build has no baseline kernel for sm_80+ (built without "
                    "PAGED_ATTN_CUDA_BASELINE=1, as CI and scripts/gpu/device_check.sh build it)")


def on_device(inputs, device):
    """testing.AttentionInputs with every tensor moved to `device` (inputs built or poisoned on
    the CPU first)."""
    tensors = {f.name: getattr(inputs, f.name) for f in dataclasses.fields(inputs)
               if isinstance(getattr(inputs, f.name), torch.Tensor)}
    return dataclasses.replace(inputs, **{name: t.to(device) for name, t in tensors.items()})
