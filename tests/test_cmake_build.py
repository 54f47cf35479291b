"""CMakeLists.txt builds the same sources into an importable-looking module (CPU only: the CUDA
sources are compiled by setup.py in CI; a second CUDA build here would double CI's build time)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_builds_the_extension(tmp_path):
    build = tmp_path / "build"
    configure = [
        "cmake", "-S", str(ROOT), "-B", str(build), "-DPAGED_ATTN_BUILD_CUDA=OFF",
        f"-DPython_EXECUTABLE={sys.executable}",
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        "-DCUDA_TOOLKIT_ROOT_DIR=/usr/local/cuda",
    ]
    for cmd in (configure, ["cmake", "--build", str(build), "-j2"]):
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    module = build / "_C.abi3.so"
    assert module.exists()
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(module)], capture_output=True,
                             text=True).stdout
    assert "PyInit__C" in symbols
    assert "attention_partition_avx512" in symbols or "paged_attn" in symbols
