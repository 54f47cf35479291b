"""paged_attention_ext.build_info(): what the extension says it compiled and registered, held
against independent evidence: the CPU variants the launcher chooses from, the schemas and the
dispatcher, the images and symbols in the library file, the torch that loaded it."""

import os
import re
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from support import build_helpers, fatbin
import paged_attention_ext as pa
from paged_attention_ext import core, schemas
from paged_attention_ext.tools import backends

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def build():
    if not pa.extension_loaded():
        pytest.skip(f"extension _C: {pa.extension_status()}")
    return pa.build_info()


def test_keys_and_types(build):
    assert set(build) == {"torch_version", "cpu_kernel_variants", "cpu_kernel_scopes",
                          "registered_kernels", "cuda",
                          "cuda_archs", "cuda_attention_pairs", "cuda_head_sizes",
                          "cuda_runtime_version", "cuda_attention_kernel", "cuda_split", "cuda_pdl",
                          "cuda_baseline_kernel", "compiler", "openmp"}
    assert build["cuda_baseline_kernel"] in (
        ("every arch", "below sm_80 only") if build["cuda"] else ("",))
    assert isinstance(build["cuda"], bool) and isinstance(build["cuda_attention_kernel"], str)
    assert isinstance(build["cuda_split"], str) and isinstance(build["cuda_pdl"], str)
    assert isinstance(build["openmp"], bool) and isinstance(build["compiler"], str)
    # the variants that hand some calls to another variant's code say which calls they keep
    assert set(build["cpu_kernel_scopes"]) <= set(build["cpu_kernel_variants"])
    assert all(isinstance(v, str) and v for v in build["cpu_kernel_scopes"].values())
    if "amx" in build["cpu_kernel_variants"]:
        assert "avx512" in build["cpu_kernel_scopes"]["amx"]
    assert pa.build_info() == build  # a fresh object each call, same content


def test_built_against_the_torch_that_loaded_it(build):
    assert build["torch_version"] == torch.__version__.split("+")[0]


def test_cpu_variants_are_the_launchers(build):
    # the same variants; cpu_kernel_variants() ranks them for this CPU (kernel_choice.cpp)
    assert sorted(build["cpu_kernel_variants"]) == sorted(n for n, _, _ in pa.cpu_kernel_variants())
    assert pa.cpu_kernel() in build["cpu_kernel_variants"]
    assert build["cpu_kernel_variants"][-1] == "scalar"  # the baseline every CPU runs


def test_registered_kernels_are_every_schema_and_in_the_dispatcher(build):
    overloads = sorted(name for name, _ in schemas.SCHEMAS)
    assert sorted(build["registered_kernels"]) == (["CPU", "CUDA"] if build["cuda"] else ["CPU"])
    for key, ops in build["registered_kernels"].items():
        assert sorted(ops) == overloads, key
        for op in ops:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"paged_attn::{op}", key)
    if not build["cuda"]:  # nothing of ours (nor anyone's) under CUDA
        for op in overloads:
            assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"paged_attn::{op}", "CUDA")


def test_cuda_archs_are_the_library_images(build):
    assert build["cuda_archs"] == fatbin.library_archs(pa._C.__file__)


def test_cpu_only_build_reports_no_cuda(build):
    if build["cuda"]:
        pytest.skip("a CUDA build")
    assert build["cuda_archs"] == [] and build["cuda_attention_pairs"] == []
    assert build["cuda_head_sizes"] == [] and build["cuda_runtime_version"] == 0
    assert build["cuda_attention_kernel"] == "" and pa._C.cuda_attention_launches() == {}
    assert build["cuda_split"] == build["cuda_pdl"] == ""


def _launcher_symbols(path, launcher="launch_paged_attention"):
    """The (ScalarKind, CacheKind) of each `launcher` instantiation in the library."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("needs nm (binutils)")
    out = subprocess.run([nm, "-C", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {(int(s), int(c)) for s, c in re.findall(
        launcher + r"<\(paged_attn::ScalarKind\)(\d), \(paged_attn::CacheKind\)(\d)>",
        out)}


def test_cuda_attention_pairs_are_the_instantiated_launchers(build):
    if not build["cuda"]:
        pytest.skip("a CPU-only build")
    scalar = {"float32": 0, "float16": 1, "bfloat16": 2}  # csrc/core/params.h ScalarKind
    cache = {"auto": 0, "fp8_e4m3": 1, "fp8_e5m2": 2}       # csrc/core/params.h CacheKind
    pairs = build["cuda_attention_pairs"]
    for dtype, kv in pairs:
        assert isinstance(getattr(torch, dtype), torch.dtype)
        assert core.KV_CACHE_DTYPES[kv] == kv
    assert {(scalar[d], cache[k]) for d, k in pairs} == _launcher_symbols(pa._C.__file__)
    for launcher in ("launch_paged_attention_pipelined", "launch_paged_attention_mma"):
        assert {(scalar[d], cache[k]) for d, k in pairs} == _launcher_symbols(
            pa._C.__file__, launcher)
    assert build["cuda_head_sizes"] == sorted(set(build["cuda_head_sizes"]))
    assert build["cuda_runtime_version"] > 0


def _undefined_symbols(path):
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


@pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None
                    or not sys.platform.startswith("linux"), reason="needs binutils on Linux")
def test_compiler_and_openmp_are_the_library_files(build):
    """The compiler is the one named in the library's .comment section; openmp says whether the
    library calls an OpenMP runtime (GNU's GOMP_parallel or LLVM's __kmpc_fork_call), as
    at::parallel_for's inline body does only when compiled with OpenMP."""
    comment = subprocess.run(["readelf", "-p", ".comment", pa._C.__file__], capture_output=True,
                             text=True, check=True).stdout
    name, _, version = build["compiler"].partition(" ")
    if name == "clang":
        assert "clang version " + version.split()[0] in comment, comment
    else:
        assert name == "gcc" and "GCC: " in comment and version.split()[0] in comment, comment
    calls_openmp = bool({"GOMP_parallel", "__kmpc_fork_call"} & _undefined_symbols(pa._C.__file__))
    assert build["openmp"] == calls_openmp
    if name == "gcc":  # GCC ships its OpenMP runtime: a GCC build without it is a build bug
        assert build["openmp"]


def test_info_prints_the_build(build):
    lines = dict(backends.describe(backends.detect()))
    assert lines["_C built with"].startswith(
        f"torch {build['torch_version']}, {build['compiler']}, "
        + ("OpenMP, " if build["openmp"] else "no OpenMP, "))
    threading = pa.cpu_threading()
    assert lines["CPU kernel threads"] == (
        f"{torch.get_num_threads()} (torch.get_num_threads(), OpenMP); a call wakes "
        f"{backends.cpu_threads_rule(threading)}" if build["openmp"]
        else '1: _C was built without OpenMP (its compiler had none; docs/BUILD.md, "OpenMP")')
    assert lines["_C CPU kernels"] == ", ".join(build["registered_kernels"]["CPU"])
    assert ("CUDA attention" in lines) == build["cuda"]
    assert ("CUDA attention kernel" in lines) == build["cuda"]
    assert ("CUDA v1 / decode split" in lines) == ("CUDA reduce launch" in lines) == build["cuda"]
    if build["cuda"]:
        assert lines["CUDA attention kernel"].startswith(build["cuda_attention_kernel"])
        assert lines["CUDA v1 / decode split"].startswith(build["cuda_split"])
        assert build["cuda_pdl"] in lines["CUDA reduce launch"]


def test_none_without_the_extension():
    proc = subprocess.run(
        [sys.executable, "-c", "import paged_attention_ext as pa; print(pa.build_info())"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PAGED_ATTN_DISABLE_EXTENSION="1", PAGED_ATTN_REQUIRE_EXTENSION="0"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "None"


def test_check_head_sizes_come_from_the_build(build):
    from paged_attention_ext.tools import conformance

    sizes = conformance.head_sizes(build)
    assert sizes and all(d % 16 == 0 for d in sizes)
    if build["cuda"]:
        assert set(sizes) <= set(build["cuda_head_sizes"])


# ---- the fatbinary reader the arch tests rely on ----

def _fatbin(entries):
    """A synthetic CUDA fatbinary: header + (kind, sm) entries with 16-byte payloads."""
    body = b""
    for kind, sm in entries:
        header = struct.pack("<HHIQ", kind, 0x0101, 64, 16) + b"\0" * 12
        header += struct.pack("<I", sm) + b"\0" * (64 - 32)
        body += header + b"\xab" * 16
    return b"junk" + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body + b"tail"


def test_fatbin_archs_reads_entries():
    blob = _fatbin([(2, 90), (2, 80), (1, 90)])
    assert fatbin.fatbin_archs(blob) == ["sm_80", "sm_90", "compute_90"]
    assert fatbin.fatbin_archs(b"no fatbin here") == []


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_default_arch_list_gives_the_images_build_info_reports(tmp_path, monkeypatch):
    """What a build with no GPU visible and no TORCH_CUDA_ARCH_LIST compiles (the default list:
    `pip install .`, wheels, PAGED_ATTN_BUILD_CUDA=1): the image names setup.py compiles into
    build_info() (cuda_build.resolve_build) are the images nvcc writes with the build's own
    -gencode and device-code flags, in build_info()'s order. One small kernel stands in for the
    extension, so every run with nvcc checks the newcomer's list, not only CI's arch."""
    cuda_build = build_helpers.load("cuda_build")
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(cuda_build, "visible_capabilities", lambda: ([], None))
    archs, _, gencode, targets = cuda_build.resolve_build(None)
    assert archs == cuda_build.DEFAULT_ARCH_LIST
    code_flags, _ = cuda_build.device_code_flags({}, cuda_build.nvcc_has_compress_mode("nvcc"))
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.f; }\n")
    lib = tmp_path / "k.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", *gencode, *code_flags, str(src),
                    "-o", str(lib)], check=True, capture_output=True, timeout=300)
    assert fatbin.library_archs(str(lib)) == targets


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_fatbin_archs_on_a_real_nvcc_library(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(float* x) { x[threadIdx.x] += 1.f; }\n")
    lib = tmp_path / "k.so"
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-gencode",
                    "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=compute_90",
                    str(src), "-o", str(lib)], check=True, capture_output=True, timeout=120)
    assert fatbin.fatbin_archs(lib.read_bytes()) == ["sm_80", "compute_90"]


