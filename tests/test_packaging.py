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
              if path.startswith(("build_helpers/", "csrc/", "docs/", "paged_attention_ext/"))
              or path in ("setup.py", "pyproject.toml", "CMakeLists.txt", "README.md", "LICENSE")}
    missing = sorted(needed - in_sdist)
    assert not missing, f"missing from the sdist: {missing}"
    assert not [name for name in in_sdist if name.endswith((".so", ".o", ".pyc"))]


@pytest.mark.slow  # a CPU-only build of the extension (reuses this checkout's objects when it has them)
def test_wheel_installs_into_a_fresh_venv_and_checks(tmp_path):
    """`pip wheel --no-build-isolation` (CPU-only) in this checkout gives a wheel that installs,
    with no index, into a fresh venv that sees this environment's torch (and nothing of this
    checkout), loads its _C there and passes `paged-attn check`: the round trip a release wheel
    makes. (The sdist test above checks that a clean copy of the sources has everything.)"""
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_ATTN_")}
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                            "--no-deps", "-w", str(dist), ROOT], cwd=tmp_path,
                           env=env | {"PAGED_ATTN_BUILD_CUDA": "0"}, capture_output=True,
                           text=True, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = dist.glob("paged_attention_ext-*.whl")
    assert "-cp39-abi3-" in wheel.name, wheel.name  # one wheel for every CPython >= 3.9

    # The fresh venv sees this environment's packages (torch, rich) through a .pth file: its own
    # site-packages comes first, and the parent's .pth files (this checkout's editable install)
    # are not processed there.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    import sysconfig
    parent = sysconfig.get_paths()["purelib"]
    [site] = venv.glob("lib/python*/site-packages")
    (site / "parent_site_packages.pth").write_text(parent + "\n")
    python = venv / "bin" / "python"
    installed = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(wheel)],
                               cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import paged_attention_ext as pa; "
                            "print(pa.__file__, pa._C.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    assert all(path.startswith(str(site)) for path in where.stdout.split()), where.stdout
    checked = subprocess.run([str(venv / "bin" / "paged-attn"), "check"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=900,
                             env=env | {"PAGED_ATTN_REQUIRE_EXTENSION": "1"})
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
