"""Build of paged_attention_ext._C: the op registry, the CPU kernels and (with a CUDA torch and
nvcc) the CUDA kernels. Metadata lives in pyproject.toml.

Build against the torch you already have (torch is NOT a build requirement; see docs/BUILD.md):
    pip install --no-build-isolation -e .
    python setup.py develop            (runs the line above)
    python setup.py build_ext --inplace

Environment:
    PAGED_ATTN_BUILD_CUDA  auto (default: CUDA torch + nvcc found) | 1 (require) | 0 (CPU only)
    TORCH_CUDA_ARCH_LIST   always wins when set. Unset: the archs of the GPUs visible now (+PTX of
                           the newest), or with no GPU visible "7.5;8.0;9.0;10.0;12.0+PTX" (T4 to
                           Blackwell; build_helpers/cuda_build.py, docs/BUILD.md)
    CUDA_HOME              default /usr/local/cuda when that folder exists
    CXX                    the C++ compiler (torch's default: c++); its OpenMP flags are probed
                           (build_helpers/openmp_flags.py; docs/BUILD.md, "OpenMP")
    DEBUG=1                -O0 -g;  MAX_JOBS  parallel compile jobs (ninja)
    PAGED_ATTN_SANITIZE=1  AddressSanitizer + UndefinedBehaviorSanitizer on the C++ code (CPU-only
                           build in build/temp-sanitize; scripts/ci/sanitize.sh runs the tests on it)
    PAGED_ATTN_PTXAS_VERBOSE=1   print nvcc's register / spill report per kernel
    PAGED_ATTN_CUDA_BASELINE=1   the baseline CUDA kernel for sm_80+ too (below sm_80 it is always
                                 built); PAGED_ATTN_CUDA_LINEINFO=1  -lineinfo (for profiling)
"""

import glob
import importlib.util
import os
import subprocess
import sys

import setuptools
from setuptools import Command, setup

# pyproject.toml's SPDX license string needs setuptools >= 77; a --no-build-isolation build uses
# whatever setuptools the environment has, so say it here rather than fail on the metadata.
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(f"paged_attention_ext needs setuptools >= 77 to build (found "
             f"{setuptools.__version__}): pip install -U 'setuptools>=77'")

ROOT = os.path.dirname(os.path.abspath(__file__))

# A default that makes a CUDA build work on a machine without a GPU (docs/BUILD.md): torch
# otherwise guesses CUDA_HOME=/usr/local and fails to find libcudart. (The arch list: see
# cuda_arch_flags below; torch alone raises IndexError when it is unset and no GPU is visible.)
if "CUDA_HOME" not in os.environ and os.path.isdir("/usr/local/cuda"):
    os.environ["CUDA_HOME"] = "/usr/local/cuda"

try:
    import torch  # noqa: E402  (after the environment defaults above)
except ImportError:
    sys.exit("paged_attention_ext builds against the torch you already have, and this python has "
             "none. Install torch first (e.g. pip install torch), then build with "
             "`pip install --no-build-isolation -e .`: plain `pip install .` builds in an isolated "
             "environment without torch (docs/BUILD.md).")
from torch.utils import cpp_extension  # noqa: E402


SANITIZE = os.environ.get("PAGED_ATTN_SANITIZE") == "1"


def want_cuda() -> bool:
    mode = os.environ.get("PAGED_ATTN_BUILD_CUDA", "auto").lower()
    if SANITIZE:
        return False  # the sanitizers cover the host C++ code
    if mode in ("0", "no", "false", "off"):
        return False
    available = torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None
    if mode in ("1", "yes", "true", "on"):
        if not available:
            sys.exit("PAGED_ATTN_BUILD_CUDA=1 but torch is not a CUDA build or nvcc/CUDA_HOME "
                     "was not found")
        return True
    return available


def _build_helper(name: str):
    """build_helpers/<name>.py, loaded by path (importing the package would load a possibly stale
    _C)."""
    path = os.path.join(ROOT, "build_helpers", name + ".py")
    spec = importlib.util.spec_from_file_location("_paged_attn_" + name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def cuda_arch_flags() -> list:
    """nvcc's -gencode flags for the resolved arch list (cuda_build.resolve_build: an explicit
    TORCH_CUDA_ARCH_LIST, else the visible GPUs + PTX of the newest, else the default list), plus
    -DPAGED_ATTN_CUDA_ARCHS naming the same images (csrc/cuda/build_info.cu: the run-time check
    in ops_cuda.cpp and build_info()). The
    flags are torch's own translation of the list; passing them explicitly stops torch from
    adding its own (and from failing when no GPU is visible)."""
    archs, why, flags, targets = _build_helper("cuda_build").resolve_build(
        os.environ.get("TORCH_CUDA_ARCH_LIST"))
    if not targets:
        sys.exit(f"paged_attention_ext: TORCH_CUDA_ARCH_LIST={archs!r} gave no -gencode flags")
    print(f"paged_attention_ext: CUDA archs {archs} ({why}) -> {', '.join(targets)}",
          file=sys.stderr)
    # NOTE: colons, not commas: nvcc splits -D values at commas.
    return flags + [f"-DPAGED_ATTN_CUDA_ARCHS={':'.join(targets)}"]


def sources(pattern: str) -> list:
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def generated_cuda_sources() -> list:
    """The attention instantiation files, per (query dtype, cache kind) pair of
    csrc/cuda/dispatch.cuh its launchers' file and one file per head-size group of kernels
    (csrc/cuda/attention_dims.h), written into build/generated/cuda by
    csrc/cuda/generate_instantiations.py (loaded by path: it is a script, not a package)."""
    path = os.path.join(ROOT, "csrc", "cuda", "generate_instantiations.py")
    spec = importlib.util.spec_from_file_location("_paged_attn_generate_instantiations", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    paths = module.generate(os.path.join(ROOT, "build", "generated", "cuda"))
    return [os.path.relpath(p, ROOT) for p in paths]


def generated_schemas_dir() -> str:
    """build/generated/: the op schemas and kv_cache_dtype names of paged_attention_ext/schemas.py
    as C++ includes for csrc/ops.cpp and csrc/torch_glue/validate.cpp (schemas.py loaded by path:
    the package may not import)."""
    path = os.path.join(ROOT, "paged_attention_ext", "schemas.py")
    spec = importlib.util.spec_from_file_location("_paged_attn_schemas", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out_dir = os.path.join(ROOT, "build", "generated")
    module.write_cpp_includes(out_dir)
    return out_dir


def extension():
    debug = os.environ.get("DEBUG", "0") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    sanitize = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                "-fno-sanitize-recover=all"] if SANITIZE else []
    if SANITIZE:
        # -O0: no access optimized away, and the AVX-512 file compiles in 12 s under the
        # sanitizers where -O1 -g took 183 s; -g1: the line tables the reports print.
        opt = ["-O0", "-g1"]
    cxx_sources = sources("csrc/*.cpp") + sources("csrc/torch_glue/*.cpp") + sources(
        "csrc/cpu/*.cpp")
    # OpenMP: at::parallel_for's OpenMP body is inline in ATen headers, so it must be compiled
    # with OpenMP here or every "parallel" region runs on one thread.
    omp = _build_helper("openmp_flags").openmp_flags(os.environ.get("CXX", "c++"))
    if omp is None:
        print("paged_attention_ext: WARNING: the C++ compiler "
              f"({os.environ.get('CXX', 'c++')}) compiles no OpenMP program: building without "
              "OpenMP, so every CPU kernel call runs on ONE thread. Install an OpenMP runtime "
              "for it (e.g. libomp-dev for clang) or build with GCC (docs/BUILD.md).",
              file=sys.stderr)
        omp = ([], [])
    cxx_flags = opt + sanitize + omp[0]
    # The shared libstdc++ before the compiler's own (build_helpers/libstdcxx_flags.py says why).
    link_flags = sanitize + omp[1] + _build_helper("libstdcxx_flags").libstdcxx_link_flags(
        os.environ.get("CXX", "c++"))
    kwargs = dict(
        name="paged_attention_ext._C",
        extra_link_args=link_flags,
        include_dirs=[os.path.join(ROOT, "csrc"), generated_schemas_dir()],
        py_limited_api=True,
    )
    if want_cuda():
        cuda_build = _build_helper("cuda_build")
        code_flags, defines = cuda_build.device_code_flags(
            os.environ, cuda_build.nvcc_has_compress_mode(
                os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc")))
        # PAGED_ATTN_WITH_CUDA: module.cpp's build_info() reports the CUDA part (cuda/build_info.h).
        cxx_flags = cxx_flags + ["-DPAGED_ATTN_WITH_CUDA"] + defines
        # nvcc has no -g0 (host debug info is off by default there).
        nvcc_flags = [f for f in opt if f != "-g0"] + ["--expt-relaxed-constexpr"]
        nvcc_flags += code_flags + defines + cuda_arch_flags()
        if os.environ.get("PAGED_ATTN_PTXAS_VERBOSE") == "1":
            nvcc_flags.append("-Xptxas=-v")
        return cpp_extension.CUDAExtension(
            # csrc/cuda/*.cpp: the torch glue of the kernels, host compiler (docs/CUDA.md "Files").
            sources=cxx_sources + sources("csrc/cuda/*.cpp") + sources("csrc/cuda/*.cu")
            + generated_cuda_sources(),
            extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
            **kwargs,
        )
    return cpp_extension.CppExtension(
        sources=cxx_sources, extra_compile_args={"cxx": cxx_flags}, **kwargs)


class BuildExtension(cpp_extension.BuildExtension):
    """torch's BuildExtension with a pinned build folder, so `pip install -e .` (which otherwise
    builds in a fresh temp folder) and repeated builds reuse object files."""

    def finalize_options(self):
        super().finalize_options()
        self.build_temp = os.path.join(ROOT, "build", "temp-sanitize" if SANITIZE else "temp")


class Develop(Command):
    """`python setup.py develop`: setuptools >= 80 turns develop into an isolated
    `pip install -e .`, whose build environment lacks torch. Install against this torch instead."""

    description = "editable install against the torch already installed"
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        # The package's other dependencies (rich) are installed with it; torch is pinned to the
        # installed version so pip never replaces it. A torch without pip metadata (built from
        # source) cannot be pinned: then nothing but this package is installed.
        from importlib import metadata
        try:
            extra = ["torch==" + metadata.version("torch")]
        except metadata.PackageNotFoundError:
            extra = ["--no-deps"]
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                               "-e", ROOT] + extra)


def ext_modules() -> list:
    """The extension, except on Windows: its build uses GCC / clang flags and builtins, and MSVC
    has neither, so there the package installs without it and its PyTorch implementation serves
    the ops (never tried on Windows; docs/BUILD.md)."""
    if sys.platform == "win32":
        print("paged_attention_ext: WARNING: the compiled extension is not built on Windows; the "
              "ops run on the package's PyTorch implementation (docs/BUILD.md)", file=sys.stderr)
        return []
    return [extension()]


setup(
    ext_modules=ext_modules(),
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True), "develop": Develop},
    options={"bdist_wheel": {"py_limited_api": "cp39"}},
)
