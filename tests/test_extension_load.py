"""What `import paged_attention_ext` does with its compiled extension `_C`, on a copy of the package
in a temporary folder whose `_C` is missing, corrupt or mismatched: the PyTorch implementation
serves the ops with an honest status (and a warning when a `_C` exists but fails to load), and
PAGED_ATTN_REQUIRE_EXTENSION=1 (set by scripts/test.sh and CI) turns a `_C` that did not load into
an import error. PAGED_ATTN_DISABLE_EXTENSION=1 wins over it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "paged_attention_ext"
# The editable install's import hook would find the real _C where the copy has none: drop it.
SCRIPT = (
    "import sys, warnings; warnings.simplefilter('always')\n"
    "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in f.__module__]\n"
    "import torch, paged_attention_ext as pa\n"
    "from paged_attention_ext import reference\n"
    "from paged_attention_ext.tools import backends, testing\n"
    "assert pa.__file__.startswith({root!r}), pa.__file__\n"
    "print('STATUS', pa.EXTENSION_STATUS, '|', pa.extension_status())\n"
    "print('CUDA KERNEL', backends.compiled_kernel('v2', 'CUDA'))\n"
    "i = testing.make_attention_inputs(2, 4, 2, 32, 8, [9, 600])\n"
    "got = testing.call_v2(torch.ops.paged_attn.v2, i, testing.alloc_v2_outputs(i))\n"
    "ref = testing.call_v2(reference.paged_attention_v2, i, testing.alloc_v2_outputs(i))\n"
    "testing.assert_v2_matches(got, ref, i.seq_lens_list, i.dtype)\n"
)
# A stand-in for an extension built against another torch: dlopen refuses it for a symbol that
# nothing loaded provides.
MISMATCHED_C = ("extern void at_symbol_of_another_torch(void);\n"
                "void *PyInit__C(void) { at_symbol_of_another_torch(); return 0; }\n")


def _package_copy(tmp_path, extension):
    """tmp_path/paged_attention_ext without the real _C; `extension` None, 'corrupt' or
    'mismatched' decides what stands in its place."""
    shutil.copytree(PACKAGE, tmp_path / "paged_attention_ext",
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    target = tmp_path / "paged_attention_ext" / "_C.abi3.so"
    if extension == "corrupt":
        target.write_bytes(b"this is not a shared library\n" * 8)
    elif extension == "mismatched":
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            pytest.skip("no C compiler (cc / gcc) to build the mismatched library")
        src = tmp_path / "c.c"
        src.write_text(MISMATCHED_C)
        subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(target)], check=True)
    return tmp_path


def _import(root, **env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGED_ATTN_")} | env
    return subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(root))], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("extension,error", [("corrupt", "invalid ELF header"),
                                             ("mismatched", "undefined symbol: at_symbol_of_another_torch")])
def test_a_built_extension_that_fails_to_load(tmp_path, extension, error):
    root = _package_copy(tmp_path, extension)
    served = _import(root)
    assert served.returncode == 0, served.stderr
    assert "STATUS failed to load | failed to load: ImportError:" in served.stdout
    assert error in served.stdout
    assert "RuntimeWarning: paged_attention_ext: the compiled extension _C failed to load" in (
        served.stderr)
    assert "CUDA KERNEL False" in served.stdout  # the probe test_cuda_kernels_registered uses

    required = _import(root, PAGED_ATTN_REQUIRE_EXTENSION="1")
    assert required.returncode != 0
    assert ("ImportError: paged_attention_ext: PAGED_ATTN_REQUIRE_EXTENSION=1 but the compiled "
            "extension _C was not loaded: failed to load") in required.stderr
    assert error in required.stderr


def test_an_extension_that_was_not_built(tmp_path):
    root = _package_copy(tmp_path, None)
    served = _import(root)
    assert served.returncode == 0, served.stderr
    assert "STATUS not built | not built (no _C module in the package" in served.stdout
    assert "Warning" not in served.stderr

    required = _import(root, PAGED_ATTN_REQUIRE_EXTENSION="1")
    assert required.returncode != 0
    assert "PAGED_ATTN_REQUIRE_EXTENSION=1 but the compiled extension _C was not loaded: not built" in (
        required.stderr)


def test_disabling_the_extension_wins_over_requiring_it(tmp_path):
    root = _package_copy(tmp_path, "corrupt")  # never opened when disabled
    served = _import(root, PAGED_ATTN_DISABLE_EXTENSION="1", PAGED_ATTN_REQUIRE_EXTENSION="1")
    assert served.returncode == 0, served.stderr
    assert "STATUS disabled | disabled by PAGED_ATTN_DISABLE_EXTENSION=1" in served.stdout
    assert "Warning" not in served.stderr


@pytest.mark.parametrize("built,running,warns", [
    ("2.14.1", "2.14.1+cu130", False), ("2.13.0", "2.13.0", False),
    ("2.13.0", "2.14.1+cu130", True), ("2.14.1", "2.14.0", True)])
def test_a_loaded_extension_built_against_another_torch_warns(built, running, warns):
    # A _C that loads may still have been compiled against another torch release (torch's C++
    # ABI is not stable across them): the import warns, naming both and how to rebuild.
    import paged_attention_ext as pa
    message = pa._torch_mismatch(built, running)
    assert (message is not None) == warns
    if warns:
        assert f"torch {built}" in message and f"torch {running}" in message
        assert "build_ext --inplace" in message


def test_the_loaded_extension_matches_this_torch():
    # What the import checked: the _C these tests run was built against the running torch.
    import torch

    import paged_attention_ext as pa
    if not pa.extension_loaded():
        pytest.skip(f"_C not loaded: {pa.extension_status()}")
    assert pa._torch_mismatch(pa.build_info()["torch_version"], torch.__version__) is None


# libstdc++'s stream and locale code (std::ostream, std::istream, ios_base, locale, num_put,
# basic_ostream / basic_streambuf), as mangled names: the extension must import these from the
# shared libstdc++ torch uses, never carry its own copy (tools/libstdcxx_flags.py: a copy made
# every error message that printed a number crash the process on the H200 machine's GCC).
PRIVATE_LIBSTDCXX = ("_ZNSo", "_ZNSi", "_ZNSt8ios_base", "_ZNSt6locale", "_ZNSt7num_put",
                     "_ZNSt13basic_ostream", "_ZNSt15basic_streambuf")


def test_the_extension_carries_no_copy_of_libstdcxx_streams():
    import paged_attention_ext as pa
    if not pa.extension_loaded():
        pytest.skip(f"_C not loaded: {pa.extension_status()}")
    if not sys.platform.startswith("linux"):
        pytest.skip("an ELF check (nm -D); the libstdc++ link flag is Linux-only")
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no `nm` (binutils) to list the extension's symbols")
    so = pa._C.__file__
    listed = subprocess.run([nm, "-D", "--defined-only", so], capture_output=True, text=True,
                            check=True).stdout.split("\n")
    names = [line.split()[-1] for line in listed if line.strip()]
    assert names, f"nm listed no defined symbols in {so}"
    copies = [n for n in names if n.startswith(PRIVATE_LIBSTDCXX)]
    assert not copies, (f"{so} defines libstdc++ stream code itself: {copies[:5]} ... "
                        "(link it against libstdc++.so.6: tools/libstdcxx_flags.py)")
