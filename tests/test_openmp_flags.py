"""The build's OpenMP probe (build_helpers/openmp_flags.py): the flags it returns are
the first candidate the compiler really compiles and links an OpenMP program with, and None when
there is none, so setup.py builds without OpenMP and says so instead of failing. Stand-in
compilers are shell scripts that refuse what a real compiler refuses and pass the rest to c++."""

import os
import shutil
import stat

import pytest

from support import build_helpers

openmp_flags = build_helpers.load("openmp_flags")

CXX = shutil.which("c++") or shutil.which("g++")
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")

GNU = (["-fopenmp"], ["-fopenmp"])
APPLE = (["-Xclang", "-fopenmp"], ["-lomp"])


def _stand_in(tmp_path, name, refuse_if):
    """A compiler command that exits 1 when `refuse_if` (a bash test on "$*") holds, else runs
    c++; also logs every command line it was given."""
    path = tmp_path / name
    log = tmp_path / (name + ".log")
    path.write_text(f'#!/bin/bash\necho "$*" >> {log}\nif {refuse_if}; then exit 1; fi\n'
                    f'exec {CXX} "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path), log


def test_gcc_gets_fopenmp():
    assert openmp_flags.openmp_flags(CXX, platform="linux") == GNU


def test_a_compiler_without_openmp_gets_none(tmp_path):
    # Apple clang without -Xclang, or clang without an OpenMP runtime: -fopenmp fails
    cxx, log = _stand_in(tmp_path, "no-openmp", '[[ "$*" == *-fopenmp* ]]')
    assert openmp_flags.openmp_flags(cxx, platform="linux") is None
    assert log.read_text().count("\n") == 1  # one candidate on Linux, tried once


def test_macos_tries_xclang_first_then_fopenmp(tmp_path):
    # a stand-in that, like the real one, has no libomp to link (-lomp) where the Linux test runs
    cxx, log = _stand_in(tmp_path, "no-libomp", '[[ "$*" == *-lomp* ]]')
    assert openmp_flags.openmp_flags(cxx, platform="darwin") == GNU
    tried = log.read_text().splitlines()
    assert [("-Xclang -fopenmp" in t, "-lomp" in t) for t in tried] == [(True, True),
                                                                       (False, False)]
    assert openmp_flags.candidates("darwin") == [APPLE, GNU]


def test_the_probe_compiles_against_torchs_headers_and_libraries(tmp_path):
    import torch

    cxx, log = _stand_in(tmp_path, "logging", "false")
    assert openmp_flags.openmp_flags(cxx, platform="linux") == GNU
    torch_dir = os.path.dirname(torch.__file__)
    line = log.read_text()
    assert f"-I {torch_dir}/include" in line and f"-L {torch_dir}/lib" in line


def test_a_missing_compiler_gets_none():
    assert openmp_flags.openmp_flags("no-such-compiler-here") is None
    assert openmp_flags.openmp_flags("") is None
