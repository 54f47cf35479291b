"""The build's OpenMP flags: which (compile, link) flags give the extension's C++ code OpenMP with
the compiler torch builds it with, found by compiling and linking a small OpenMP program.

Why the build needs OpenMP: at::parallel_for's OpenMP body is inline in ATen's headers, so the C++
code that calls it must itself be compiled with OpenMP, or every CPU kernel call runs on one
thread. Compilers differ:
  - GCC and LLVM clang with an OpenMP runtime installed: -fopenmp.
  - macOS: Apple clang takes OpenMP only as `-Xclang -fopenmp` and has no runtime of its own; it
    links the libomp that torch's macOS wheels ship (torch/lib, with omp.h among torch's
    headers), as torch's inductor does. This path has never run here (docs/BUILD.md).
  - clang without an OpenMP runtime (Debian's clang without libomp-dev): none; the build goes on
    without OpenMP and says so, and the extension reports it (build_info()["openmp"]).

setup.py loads this file by path (importing the package could load a stale _C).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

PROBE = r"""
#include <omp.h>
int main() {
  int threads = 0;
#pragma omp parallel reduction(+ : threads)
  threads += omp_get_num_threads() > 0;
  return threads > 0 ? 0 : 1;
}
"""


def candidates(platform: str = sys.platform) -> list:
    """(compile flags, link flags) to try, in order."""
    gnu = (["-fopenmp"], ["-fopenmp"])
    if platform == "darwin":
        return [(["-Xclang", "-fopenmp"], ["-lomp"]), gnu]
    return [gnu]


def openmp_flags(cxx: str, torch_dir: Optional[str] = None,
                 platform: str = sys.platform) -> Optional[tuple]:
    """The first of candidates() with which `cxx` (a command line, as in $CXX) compiles and links
    PROBE against torch's headers and libraries (torch_dir: the torch package folder; default the
    installed torch's), as (compile flags, link flags); None when none does or `cxx` is missing.
    """
    command = shlex.split(cxx)
    if not command or shutil.which(command[0]) is None:
        return None  # the build itself names the missing compiler
    if torch_dir is None:
        import torch
        torch_dir = os.path.dirname(torch.__file__)
    with tempfile.TemporaryDirectory() as tmp:
        source = os.path.join(tmp, "openmp_probe.cpp")
        with open(source, "w") as f:
            f.write(PROBE)
        for compile_flags, link_flags in candidates(platform):
            done = subprocess.run(
                command + compile_flags + ["-I", os.path.join(torch_dir, "include"), source,
                                           "-o", os.path.join(tmp, "probe"),
                                           "-L", os.path.join(torch_dir, "lib")] + link_flags,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if done.returncode == 0:
                return compile_flags, link_flags
    return None
