"""The CUDA host simulation's shared parts (tests/cuda_sim/*.cpp, cuda_sim.h): the cases, a driver
built plain or under ThreadSanitizer, a run of it over case files (tests/support/cross_cases.py
writes them) and its results. tests/test_cuda_host_sim.py and tests/test_cuda_race_check.py use
them."""

import functools
import os
import re
import shutil
import subprocess
import tempfile

import pytest
import torch

from paged_attention_ext.validation import Blocksparse
from support import cross_cases as cross
from support import host_cpp

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
# test_cpu_kernel_cross.CASES' form; head sizes 64-128 (the driver's compiled shapes), every GQA
# tile, both cache forms, blocksparse
CASES = [
    (F32, "auto", 8, 8, 128, 16, [1, 511, 512, 513, 0, 1537], False, None),  # MHA, odd lengths
    (BF16, "auto", 32, 8, 128, 16, [1537, 77, 0, 513], True, None),  # GQA 4, ALiBi
    (F16, "auto", 12, 4, 64, 8, [513, 1, 1537], False, None),  # GQA 3: a tile of 4, one idle
    (BF16, "auto", 24, 2, 64, 32, [700, 0, 33], True, None),  # GQA 12: passes of 8 and 4
    (F16, "auto", 16, 1, 128, 16, [1025, 9], False, None),  # MQA 16
    (BF16, "auto", 16, 2, 96, 12, [97, 300], False, None),  # block size 12: per-token V path
    (F16, "auto", 8, 1, 80, 1, [5, 40], True, None),  # block size 1, head 80
    (BF16, "auto", 8, 2, 120, 16, [600, 3], False, None),  # head 120: a partial 16-dim slice
    (F16, "fp8_e4m3", 8, 1, 128, 16, [1, 512, 1537], False, None),  # fp8, GQA 8
    (BF16, "fp8_e5m2", 12, 4, 112, 5, [513, 77], True, None),  # e5m2, block size 5, GQA 3
    (F32, "fp8", 8, 2, 64, 16, [300, 1025], True, None),  # fp32 query, fp8 cache
    (F16, "auto", 4, 1, 128, 16, [0, 0], False, None),  # every row empty: zeros
    (BF16, "auto", 8, 1, 64, 16, [70000, 3], False, None),  # v2: 137 partitions, > one reduce chunk
    (F32, "auto", 8, 2, 64, 16, [1, 600, 1025], False, "head_padding"),  # outer strides
    (BF16, "fp8_e4m3", 8, 2, 64, 16, [1, 600, 1025], False, "blocks_interleaved"),
    # token-major caches (decode)
    (BF16, "auto", 16, 2, 128, 16, [1537, 1, 600], False, "nhd"),  # GQA 8
    (F16, "auto", 8, 2, 120, 16, [700, 33], True, "hnd"),  # head 120, ALiBi
    (BF16, "fp8_e4m3", 8, 1, 80, 5, [511, 1030], False, "combined"),  # fp8, block size 5
    (F16, "auto", 12, 4, 64, 7, [513, 5], False, "mixed"),  # K != V strides, block size 7
    (BF16, "auto", 8, 2, 96, 16, [1, 600], False, "combined_hnd"),
    (F32, "auto", 8, 2, 64, 1, [300, 77], True, "padded"),  # 16-byte-unaligned token rows
    # blocksparse: NaN in every (cache block, KV head) no query head attends
    (F32, "auto", 8, 2, 64, 16, [1100, 300], True, None, Blocksparse(1, 3, 8, 64, 2)),
    (BF16, "fp8_e5m2", 16, 2, 128, 8, [700, 77], False, None, Blocksparse(1, 1, 3, 12, -1)),
    (F16, "auto", 8, 2, 96, 16, [1537, 5], False, None, Blocksparse(0, 2, 4, 16, 0)),
    # every fp8 byte through V and K (testing.every_fp8_byte_inputs), both cache forms
    cross.every_byte_case("fp8_e4m3", "value"),
    cross.every_byte_case("fp8_e4m3", "key", "nhd"),
    cross.every_byte_case("fp8_e5m2", "key"),
    cross.every_byte_case("fp8_e5m2", "value", "hnd"),
]
KERNELS = ("baseline", "pipelined", "mma")  # the kernel choices (csrc/cuda/kernel_choice.h)
MODES = ("v2", "v1", "split")
LINE = re.compile(r"^(ok  |FAIL|SKIP) (\S+) \[(\w+) (\w+)\](.*)$", re.M)


def cuda_include_dir():
    """A folder holding the CUDA toolkit's headers (cuda_fp16.h), or None."""
    nvcc = shutil.which("nvcc")
    candidates = [os.path.join(os.environ.get("CUDA_HOME", ""), "include"),
                  "/usr/local/cuda/include"]
    if nvcc:
        candidates.append(os.path.join(os.path.dirname(os.path.dirname(nvcc)), "include"))
    return next((d for d in candidates if os.path.isfile(os.path.join(d, "cuda_fp16.h"))), None)


def build(tmp, driver, *defines, extra_flags=()):
    """tests/cuda_sim/<driver>.cpp built over the simulation; skips without CUDA headers."""
    cuda_include = cuda_include_dir()
    if cuda_include is None:
        pytest.skip("no CUDA toolkit headers (cuda_fp16.h) in $CUDA_HOME/include, "
                    "/usr/local/cuda/include or next to nvcc: the kernels need them to compile")
    source = open(os.path.join(host_cpp.TESTS, "cuda_sim", driver + ".cpp")).read()
    flags = ("-O1", "-U_FORTIFY_SOURCE", "-DPAGED_ATTN_CUDA_HOST_SIM",
             *(f"-D{d}" for d in defines), *extra_flags)
    return host_cpp.build(tmp, driver, source, flags=flags,
                          includes=(host_cpp.TESTS, os.path.join(host_cpp.TESTS, "cuda_sim"),
                                    cuda_include))


def run_driver(exe, tmp, cases, kernels=KERNELS, env=None):
    """{(case, kernel, mode): (status, note)} of one run of the built driver over `cases`."""
    case_dir = tmp / "cases"
    cross.write_cases(str(case_dir), cases)
    run = subprocess.run([exe, str(case_dir), *kernels], capture_output=True, text=True,
                         timeout=1800, env=None if env is None else {**os.environ, **env})
    print(run.stdout[-20000:], run.stderr[-4000:])  # shown on failure
    race = run.stderr.find("WARNING: ThreadSanitizer")
    assert race < 0, f"a data race (rc {run.returncode}):\n{run.stderr[race:race + 6000]}"
    assert run.returncode in (0, 1), f"simulation error (rc {run.returncode}): {run.stderr}"
    return {(m[2], m[3], m[4]): (m[1].strip(), m[5].strip()) for m in LINE.finditer(run.stdout)}


def simulate(tmp, cases, all_shapes=False):
    """{(case, kernel, mode): (status, note)} of one driver run over `cases` and KERNELS."""
    exe = build(tmp, "driver", *(("PAGED_ATTN_SIM_ALL_SHAPES",) if all_shapes else ()))
    return run_driver(exe, tmp, cases)


def assert_all_passed(results, cases):
    names = [cross.case_name(i, c) for i, c in enumerate(cases)]
    missing = [(n, k, m) for n in names for k in KERNELS for m in MODES
               if (n, k, m) not in results]
    assert not missing, f"no result for {missing[:5]}"
    failed = {key: note for key, (status, note) in results.items() if status == "FAIL"}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())


# ThreadSanitizer builds (cuda_sim.h's `race` model)

RACE_FLAGS = ("-fsanitize=thread", "-g")
TSAN_ENV = {"TSAN_OPTIONS": "exitcode=66"}  # a report makes the exit status 66
# every kernel choice and mode on: MHA f32 with odd lengths (v2 over 4 partitions), GQA 4 bf16
# (tensor cores), fp8 GQA 8, NHD GQA 8, the combined token-major layout with block size 5, fp8
# blocksparse
RACE_CASES = [CASES[i] for i in (0, 1, 8, 15, 17, 22)]


@functools.lru_cache(maxsize=None)
def tsan_missing():
    """Why the C++ compiler cannot build and run a -fsanitize=thread program (no libtsan), or
    None when it can: probed once per session."""
    cxx = host_cpp.compiler()
    with tempfile.TemporaryDirectory() as probe:
        exe = os.path.join(probe, "a.out")
        built = cxx is not None and subprocess.run(
            [cxx, *RACE_FLAGS, "-x", "c++", "-", "-o", exe],
            input="int main() { return 0; }", capture_output=True, text=True).returncode == 0
        if built and subprocess.run([exe], capture_output=True).returncode == 0:
            return None
    return f"{cxx or 'no C++ compiler'} cannot build and run a -fsanitize=thread program"


def race_checked_build(tmp, driver):
    """build() with ThreadSanitizer; skips where the compiler cannot build or run with it (no
    libtsan), unless CUDA_SIM_REQUIRE_TSAN=1 (CI) makes that a failure."""
    why = tsan_missing()
    if why is not None:
        if os.environ.get("CUDA_SIM_REQUIRE_TSAN") == "1":
            pytest.fail(why + " (CUDA_SIM_REQUIRE_TSAN=1)")
        pytest.skip(why)
    return build(tmp, driver, extra_flags=RACE_FLAGS)
