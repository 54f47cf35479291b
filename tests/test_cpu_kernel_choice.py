"""Which CPU kernel variant runs: the best this CPU executes by default, PAGED_ATTN_CPU_KERNEL to
force another, a clear error for one that cannot run, and torch's CPU capability as a cap."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import paged_attention_ext as pa
from paged_attention_ext.tools import testing

pytestmark = pytest.mark.skipif(not pa.extension_loaded(),
                                reason=f"compiled extension: {pa.extension_status()}")


def _cpuinfo(field: str) -> str:
    """The first line of /proc/cpuinfo that starts with `field`, after its colon ('' if none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpu_flags() -> set:
    return set((_cpuinfo("flags") or _cpuinfo("Features")).split())


def _expected_best() -> str:
    """The variant this CPU should get, from /proc/cpuinfo (independent of the C++ probe)."""
    flags, machine = _cpu_flags(), os.uname().machine
    cap = torch.backends.cpu.get_cpu_capability()
    if machine == "x86_64":
        avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "f16c"} <= flags
        if avx512 and "AVX512" in cap:
            if {"avx512_bf16", "amx_tile", "amx_bf16"} <= flags:
                return "amx"  # (Linux grants the tile state to every process since 5.16)
            # the bf16 dot product leads only where it was measured faster: AMD (isa_avx512.cpp)
            amd = _cpuinfo("vendor_id") == "AuthenticAMD"
            return "avx512-bf16" if "avx512_bf16" in flags and amd else "avx512"
        if {"avx2", "fma", "f16c"} <= flags and ("AVX2" in cap or "AVX512" in cap):
            return "avx2-fma"
        return "scalar"
    if machine == "aarch64":
        return "neon"
    return "scalar"


def test_default_is_the_best_variant_this_cpu_runs(monkeypatch):
    monkeypatch.delenv("PAGED_ATTN_CPU_KERNEL", raising=False)
    if not _cpu_flags():
        pytest.skip("no /proc/cpuinfo to check the choice against")
    assert pa.cpu_kernel() == _expected_best()
    runnable = [name for name, ok, _ in pa.cpu_kernel_variants() if ok]
    assert runnable[0] == pa.cpu_kernel()


def test_every_variant_is_listed_with_a_reason_when_it_cannot_run():
    variants = pa.cpu_kernel_variants()
    assert variants[-1][0] == "scalar" and variants[-1][1]  # always there, always runs
    for name, ok, note in variants:
        assert ok or note, name


def test_a_variant_ranked_below_its_place_in_the_build_says_why():
    """A runnable variant is listed after another only where the build's table puts it there
    or its note says why it was measured slower here (only avx512-bf16 on non-AMD CPUs)."""
    ranked = [name for name, _, _ in pa.cpu_kernel_variants()]
    table = pa.build_info()["cpu_kernel_variants"]
    for name, ok, note in pa.cpu_kernel_variants():
        moved = ranked.index(name) > table.index(name)
        if ok and note:
            assert moved and note.startswith("ranked after "), (name, note)
            assert name == "avx512-bf16" and _cpuinfo("vendor_id") != "AuthenticAMD", note
        elif ok:
            assert not moved, (name, ranked, table)


@pytest.mark.parametrize("name,message", [("avx9000", "not a CPU kernel variant of this build"),
                                          ("generic", "not a CPU kernel variant of this build")])
def test_unknown_variant_is_a_clear_error(monkeypatch, name, message):
    monkeypatch.setenv("PAGED_ATTN_CPU_KERNEL", name)
    with pytest.raises(ValueError, match=message):
        pa.cpu_kernel()
    inp = testing.make_attention_inputs(1, 4, 2, 32, 16, [20], seed=1)
    with pytest.raises(ValueError, match=f"^paged_attn.v1: PAGED_ATTN_CPU_KERNEL={name}"):
        testing.call_v1(torch.ops.paged_attn.v1, inp, testing.alloc_v1_outputs(inp))


def test_torch_cpu_capability_caps_the_choice():
    """ATEN_CPU_CAPABILITY=default keeps every x86 SIMD variant off, by default and on request."""
    if os.uname().machine != "x86_64":
        pytest.skip("the cap applies to the x86 variants")
    code = ("import os, paged_attention_ext as pa; print(pa.cpu_kernel());"
            "os.environ['PAGED_ATTN_CPU_KERNEL'] = 'avx2-fma'\n"
            "try: pa.cpu_kernel()\nexcept ValueError as e: print('error:', e)")
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    env.pop("PAGED_ATTN_CPU_KERNEL", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == "scalar"
    assert out[1].startswith("error:") and "capability" in out[1], out


def test_cpu_prefetches_go_through_the_volatile_helpers():
    """GCC takes __builtin_prefetch for free of side effects and dropped every call of a helper
    that only prefetched (docs/PERFORMANCE.md, "Regression checks"): the CPU code prefetches only
    through kernel_common.h's prefetch_l1 / prefetch_l2 (volatile asm on x86 and aarch64)."""
    cpu = pathlib.Path(__file__).resolve().parents[1] / "csrc" / "cpu"
    call = re.compile(r"(?:__builtin_prefetch|_mm_prefetch)\s*\(")
    found = {path.name: len(call.findall(path.read_text()))
             for path in cpu.glob("*") if path.suffix in (".h", ".cpp")}
    # kernel_common.h: the portable fallback of each helper, for compilers on other ISAs
    assert {name: n for name, n in found.items() if n} == {"kernel_common.h": 2}
