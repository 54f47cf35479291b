"""Builds the small host C++ programs that run csrc/ headers on the CPU (the CUDA kernels' host-
compilable parts: warp_reduce.cuh, gqa_mma.cuh, core/split_plan.h) for the host tests."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")


def compiler():
    """The first C++ compiler on PATH, or None."""
    for name in ("g++", "c++", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    return None


def build(tmp_dir, name, source, std="c++20", flags=("-O1", "-pthread"), includes=()):
    """Writes `source` to tmp_dir/name.cpp, compiles it against csrc/ (and `includes`) and returns
    the executable's path; skips (with the reason) where there is no compiler, fails with the
    compiler's errors."""
    cxx = compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (g++) on PATH")
    src, exe = os.path.join(str(tmp_dir), name + ".cpp"), os.path.join(str(tmp_dir), name)
    with open(src, "w") as f:
        f.write(source)
    include_flags = [flag for path in (os.path.join(ROOT, "csrc"), *includes)
                     for flag in ("-I", path)]
    result = subprocess.run([cxx, f"-std={std}", *flags, *include_flags, src, "-o", exe],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return exe
