"""CMakeLists.txt builds the same sources into an importable-looking module (CPU only: the CUDA
sources are compiled by setup.py in CI; a second CUDA build here would double CI's build time)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # a second build of the CPU sources
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_builds_the_extension(tmp_path):
    build = tmp_path / "build"
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build), "-DPAGED_ATTN_BUILD_CUDA=OFF",
        # -O0: what is checked is that CMake builds the sources into a working module, not its
        # speed (a quarter of the Release build's compile time)
        "-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_CXX_FLAGS_DEBUG=-O0",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        "-DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda",
    ]
    for cmd in (configure, ["cmake", "--build", str(build), "-j2"]):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    module = build / "_C.abi3.so"
    assert module.exists()
    # The CMake-built _C in a copy of the package: it loads (REQUIRE: no fallback), its kernels
    # serve the CPU ops, and it matches the oracle.
    package = tmp_path / "pkg"
    shutil.copytree(ROOT / "paged_attention_ext", package / "paged_attention_ext",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    shutil.copy(module, package / "paged_attention_ext" / "_C.abi3.so")
    script = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in f.__module__]\n"
        "import torch, paged_attention_ext as pa\n"
        "from paged_attention_ext import reference\n"
        "from paged_attention_ext.tools import backends, testing\n"
        f"assert pa._C.__file__.startswith({str(package)!r}), pa._C.__file__\n"
        "assert backends.compiled_kernel('v2', 'CPU'), 'the CMake build serves no CPU kernel'\n"
        "i = testing.make_attention_inputs(2, 8, 2, 64, 16, [9, 600], dtype=torch.bfloat16)\n"
        "got = testing.call_v2(torch.ops.paged_attn.v2, i, testing.alloc_v2_outputs(i))\n"
        "ref = testing.call_v2(reference.paged_attention_v2, i, testing.alloc_v2_outputs(i))\n"
        "testing.assert_v2_matches(got, ref, i.seq_lens_list, i.dtype)\n"
        "print('cmake _C', pa.build_info()['compiler'], pa.cpu_kernel())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_ATTN_")}
    result = subprocess.run([sys.executable, "-c", script], cwd=package, capture_output=True,
                            text=True, timeout=300,
                            env=env | {"PAGED_ATTN_REQUIRE_EXTENSION": "1"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cmake _C" in result.stdout
