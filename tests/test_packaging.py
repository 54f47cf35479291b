"""The source distribution holds everything a build needs: every tracked file of csrc/ (headers,
.cu files, the instantiation generator), the package, CMakeLists.txt and the docs (MANIFEST.in).
An sdist without them installs from PyPI-style archives only to fail at the compile step."""

import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tracked_files():
    if shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")):
        pytest.skip("needs a git checkout to list the tracked files")
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout
    return set(listing.split())


def test_sdist_holds_every_source_the_build_needs(tmp_path):
    # From a copy of the tracked files: in the checkout, an egg-info left by an earlier install
    # lists the sources itself and would hide a MANIFEST.in that misses them.
    tracked = _tracked_files()
    src, dist = tmp_path / "src", tmp_path / "dist"
    for path in tracked:
        if os.path.isfile(os.path.join(ROOT, path)):
            os.makedirs(src / os.path.dirname(path), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, path), src / path)
    # build_sdist as pip runs it without build isolation (torch is already here).
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    done = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    archive = dist / done.stdout.split()[-1]
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        in_sdist = {name[len(top) + 1:] for name in tar.getnames() if name.startswith(top + "/")}
        pkg_info = tar.extractfile(f"{top}/PKG-INFO").read().decode()
    # The version has one owner, the package's __version__ (pyproject reads it).
    import paged_attention_ext
    assert f"\nVersion: {paged_attention_ext.__version__}\n" in pkg_info
    needed = {path for path in tracked
              if path.startswith(("csrc/", "docs/", "paged_attention_ext/"))
              or path in ("setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE")}
    missing = sorted(needed - in_sdist)
    assert not missing, f"missing from the sdist: {missing}"
    assert not [name for name in in_sdist if name.endswith((".so", ".o", ".pyc"))]
