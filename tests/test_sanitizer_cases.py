"""The compute-sanitizer step of scripts/gpu/device_check.sh and its program,
paged_attention_ext/tools/sanitizer_cases.py, checked where no GPU is needed: the program's
command line (--help, --list, --quick, --cases, --kernels), its clear exit without CUDA, its
cases as inputs (every one runs, and passes, on the CPU, and a wrong op fails it),
and the script (bash -n; the sanitizer steps' command lines and their SKIPPED rows, with stand-in
nvidia-smi / python / compute-sanitizer; the step limits within the budget). Whether the CUDA
kernels pass under compute-sanitizer is for device_check.sh on a GPU to say.
"""

import glob
import os
import re
import subprocess
import sys
import tarfile
import textwrap
from types import SimpleNamespace

import pytest
import torch

from paged_attention_ext.tools import backends, sanitizer_cases, testing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu", "device_check.sh")
MODULE = "paged_attention_ext.tools.sanitizer_cases"


def _program(*args):
    return subprocess.run([sys.executable, "-m", MODULE, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


# ---- the program's command line ----

def test_help_names_every_option():
    proc = _program("--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--kernels", "--quick", "--cases", "--list"):
        assert option in proc.stdout


def test_list_names_every_case_and_the_kernels():
    proc = _program("--list")
    assert proc.returncode == 0, proc.stderr
    listed = [line.split()[0] for line in proc.stdout.splitlines()[1:]]
    assert listed == list(sanitizer_cases.CASE_NAMES)
    kernels = sanitizer_cases.kernel_names()
    first = proc.stdout.splitlines()[0]
    assert first == "kernels: " + (", ".join(kernels) or
                                   "none (this build of _C has no CUDA kernels)")


def test_quick_and_cases_select_cases():
    quick = [c.name for c in sanitizer_cases.CASES if c.quick]
    assert 0 < len(quick) < len(sanitizer_cases.CASES)
    proc = _program("--quick", "--list")
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == quick
    two = sanitizer_cases.CASE_NAMES[-1] + "," + sanitizer_cases.CASE_NAMES[0]
    proc = _program("--cases", two, "--list")
    assert [line.split()[0] for line in proc.stdout.splitlines()[1:]] == [
        sanitizer_cases.CASE_NAMES[0], sanitizer_cases.CASE_NAMES[-1]]


def test_unknown_case_is_a_usage_error():
    proc = _program("--cases", "no-such-case", "--list")
    assert proc.returncode == 2
    assert "unknown case(s) no-such-case" in proc.stderr and "Traceback" not in proc.stderr


def test_default_kernels_are_the_extensions_launch_counters(monkeypatch):
    """The kernel names come from _C.cuda_attention_launches() (here a stand-in with a kernel
    this file does not know), never from a list of its own."""
    counters = {"baseline": 0, "pipelined": 0, "some-new-kernel": 0}
    monkeypatch.setattr(testing, "cuda_attention_launches", lambda reload=False: counters)
    parser = sanitizer_cases._parser()
    _, kernels = sanitizer_cases.select(parser.parse_args([]), parser)
    assert kernels == list(counters)
    _, kernels = sanitizer_cases.select(parser.parse_args(["--kernels", "some-new-kernel"]),
                                        parser)
    assert kernels == ["some-new-kernel"]
    with pytest.raises(SystemExit) as exit_info:
        sanitizer_cases.select(parser.parse_args(["--kernels", "turbo"]), parser)
    assert exit_info.value.code == 2


def test_launch_counter_check_names_the_kernel_that_ran():
    before = {"baseline": 2, "pipelined": 5, "mma": 1}
    after = {"baseline": 2, "pipelined": 7, "mma": 1}
    testing.require_launches_of("pipelined", before, after)
    testing.require_launches_of("mma", before, after)  # mma's fallback for other shapes
    for choice, expected in (("baseline", False), ("mma", True)):
        with pytest.raises(AssertionError, match=f"PAGED_ATTN_CUDA_KERNEL={choice}, but"):
            testing.require_launches_of(choice, before, after, tensor_cores_expected=expected)
    testing.require_launches_of("mma", before, {**after, "mma": 2}, tensor_cores_expected=True)
    with pytest.raises(AssertionError):  # nothing ran
        testing.require_launches_of("baseline", before, before)


def test_without_cuda_exits_with_a_clear_message():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the program runs its cases here instead "
                    "(scripts/gpu/device_check.sh runs it)")
    proc = _program()
    assert proc.returncode == 2
    # the last line: import warnings (a _C built without OpenMP) may come before it
    assert proc.stderr.splitlines()[-1].startswith("sanitizer_cases: no CUDA device")
    assert "Traceback" not in proc.stderr


# ---- the cases as inputs: run on the CPU ----

def _cpu_ops():
    """The first active CPU backend's ops: the C++ CPU kernel, else the PyTorch fallback."""
    return backends.backend(backends.backend_names("cpu")[0]).ops


def _run_case(ops, case):
    """The program's check of `case` on the CPU (AssertionError on a mismatch)."""
    if isinstance(case, sanitizer_cases.AttentionCase):
        inputs = sanitizer_cases.make_inputs(case, "cpu")
        expected = sanitizer_cases.expected_outputs(case, inputs)
        sanitizer_cases.check_attention(ops, case, inputs, expected)
    else:
        sanitizer_cases.check_cache_write(ops, case, "cpu")


@pytest.mark.parametrize("case", sanitizer_cases.CASES, ids=sanitizer_cases.CASE_NAMES)
def test_case_passes_on_the_cpu(case):
    """Every case is a valid input whose check passes on a correct implementation (the CPU
    kernel, or the PyTorch fallback where none is compiled): a failure on the GPU is then the
    GPU's."""
    _run_case(_cpu_ops(), case)


def _first_element_wrong(fn, op_name):
    """fn, then its output's first element overwritten (out; key_cache for a cache write)."""
    def wrong(*args):
        fn(*args)
        written = args[2] if op_name.startswith("reshape") else args[0]
        first = (0,) * written.dim()
        if written.dtype == torch.uint8:  # an fp8 cache
            written[first] ^= 0x55
        else:
            written[first] = 100.0  # outputs are convex combinations of N(0, 1) values
    return wrong


@pytest.mark.parametrize("op_name", ["v2", "v1", "decode", "reshape_and_cache",
                                     "reshape_and_cache_flash"])
def test_a_wrong_op_fails_every_case_using_it(op_name):
    """The checks can fail: with one op wrong, every case that runs it fails, the others pass."""
    ops = _cpu_ops()
    wrong = SimpleNamespace(**{name: getattr(ops, name) for name in backends.OPS})
    setattr(wrong, op_name, _first_element_wrong(getattr(ops, op_name), op_name))
    uses = {"v2": lambda c: isinstance(c, sanitizer_cases.AttentionCase) and c.layout is None,
            "v1": lambda c: isinstance(c, sanitizer_cases.AttentionCase) and c.layout is None,
            "decode": lambda c: isinstance(c, sanitizer_cases.AttentionCase) and c.layout,
            "reshape_and_cache": lambda c: (isinstance(c, sanitizer_cases.CacheWriteCase)
                                            and c.layout is None),
            "reshape_and_cache_flash": lambda c: (isinstance(c, sanitizer_cases.CacheWriteCase)
                                                  and c.layout is not None)}[op_name]
    failing = set()
    for case in sanitizer_cases.CASES:
        try:
            _run_case(wrong, case)
        except AssertionError:
            failing.add(case.name)
    assert failing == {c.name for c in sanitizer_cases.CASES if uses(c)}


def test_cases_cover_the_kernel_paths():
    attention = [c for c in sanitizer_cases.CASES if isinstance(c, sanitizer_cases.AttentionCase)]
    writes = [c for c in sanitizer_cases.CASES if isinstance(c, sanitizer_cases.CacheWriteCase)]
    ratios = {c.shape[0] // c.shape[1] for c in attention}
    assert {1, 8} <= ratios and any(r > 8 for r in ratios)  # one tile, a full tile, two passes
    assert {c.layout for c in attention} >= {None, "nhd", "hnd"}
    assert {c.dtype for c in attention} >= {torch.float32, torch.float16, torch.bfloat16}
    assert any(c.alibi for c in attention)
    assert any(c.blocksparse != testing.DENSE for c in attention)
    assert {c.kv_cache_dtype for c in attention} >= {"auto", "fp8_e4m3", "fp8_e5m2"}
    assert any(max(c.seq_lens) > 512 for c in attention if c.layout is None)  # v2's reduce
    assert any(0 in c.seq_lens for c in attention)
    assert {c.layout is None for c in writes} == {True, False}  # both cache writes


# ---- scripts/gpu/device_check.sh ----

def test_device_check_parses():
    proc = subprocess.run(["bash", "-n", SCRIPT], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _step_limits():
    """{step name: limit} of the run_step / sanitizer_step lines before the benchmarks."""
    text = open(SCRIPT).read()
    body = text[:text.index("# ---- 6. the benchmark")]
    return {name: int(limit) for name, limit in
            re.findall(r"^\s*(?:run_step|sanitizer_step) (\w+) (\d+) ", body, re.MULTILINE)}


def test_step_limits_fit_the_budget():
    """Steps 2-5 fit the default budget together with the GPU probe (the benchmarks get what is
    left); the header says their total."""
    text = open(SCRIPT).read()
    limits = _step_limits()
    # unpack_prebuilt runs instead of build (PREBUILT): the total counts the longer of the two
    assert limits.pop("unpack_prebuilt") <= limits["build"]
    assert {"build", "tests_cuda", "check", "sanitizer_memcheck", "sanitizer_racecheck",
            "sanitizer_synccheck"} == set(limits)
    budget = int(re.search(r'BUDGET="\$\{CHECK_BUDGET:-(\d+)\}"', text).group(1))
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)", text, re.MULTILINE).group(1))
    total = sum(limits.values())
    assert total <= budget - kill_after - 5  # 5 s: the GPU probe
    assert f"add up to {total} s" in text


STAND_INS = {
    "nvidia-smi": """\
        #!/usr/bin/env bash
        echo "GPU 0: stand-in GPU"
        """,
    # the GPU probe (-c) answers sm_90; everything else logs its arguments and the allocator
    # setting and succeeds
    "python": """\
        #!/usr/bin/env bash
        if [[ "$1" == "-c" ]]; then echo 9.0; exit 0; fi
        echo "program: $* caching=${PYTORCH_NO_CUDA_MEMORY_CACHING:-on}"
        echo "split=${PAGED_ATTN_CUDA_SPLIT:-}"
        echo "pdl=${PAGED_ATTN_CUDA_PDL:-}"
        """,
    # the same, with a setuptools older than 77 (the check's -c exits 1) and a pip that logs
    "python-old-setuptools": """\
        #!/usr/bin/env bash
        if [[ "$1" == "-c" && "$2" == *"< 77"* ]]; then exit 1; fi
        if [[ "$1" == "-c" ]]; then echo 9.0; exit 0; fi
        if [[ "$1 $2" == "-m pip" ]]; then echo "pip: $*"; exit 0; fi
        echo "program: $* caching=${PYTORCH_NO_CUDA_MEMORY_CACHING:-on} path=${PYTHONPATH:-}"
        """,
    "compute-sanitizer": """\
        #!/usr/bin/env bash
        echo "sanitizer: $*"
        while [[ $# -gt 0 && "$1" != */python ]]; do shift; done
        exec "$@"
        """,
    # logs its arguments (the profiled program is not run)
    "ncu": """\
        #!/usr/bin/env bash
        echo "ncu: $*"
        """,
}


def _run_device_check(tmp_path, tools, python="python", out_arg=True, script=SCRIPT,
                      **extra_env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in tools:
        path = bin_dir / name
        path.write_text(textwrap.dedent(STAND_INS[name]))
        path.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               PYTHON=str(bin_dir / python), CUDA_HOME=str(tmp_path / "no-cuda"), **extra_env)
    out = tmp_path / "out"
    out.mkdir()
    env.pop("OUT", None)
    if not out_arg:  # the way a lent GPU machine runs it: OUT set, no argument
        env["OUT"] = str(out)
    proc = subprocess.run(["bash", script, *([str(out)] if out_arg else [])], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    rows = {}
    for line in (out / "results.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4:
            rows[cells[0]] = cells[1]
    return proc, out, rows


def test_device_check_runs_the_program_under_each_tool(tmp_path):
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python", "compute-sanitizer",
                                                   "ncu"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {
        "sanitizer_memcheck": ("--tool memcheck", "--leak-check no"),
        "sanitizer_racecheck": ("--tool racecheck",),
        "sanitizer_synccheck": ("--tool synccheck",),
    }
    for step, options in expected.items():
        assert rows[step] == "ok"
        log = (out / f"{step}.log").read_text()
        sanitizer_line, program_line = log.splitlines()[:2]
        assert "--error-exitcode 1" in sanitizer_line
        assert all(option in sanitizer_line for option in options), sanitizer_line
        assert program_line.startswith(f"program: -m {MODULE}")
        assert program_line.endswith("caching=1")
        assert ("--quick" in program_line) == (step == "sanitizer_racecheck")
    for name, layout, contender, preset in (("profile_vllm", "vllm", "ours-v1", "big-batch"),
                                            ("profile_nhd", "nhd", "ours-decode", "big-batch"),
                                            ("profile_small_vllm", "vllm", "ours-v1",
                                             "small-batch")):
        assert rows[name] == "ok"
        profile, report = (out / f"{name}.log").read_text().splitlines()[:2]
        assert "--set full" in profile and "--clock-control none" in profile
        assert f"--kv-layout {layout} --contenders {contender}" in profile
        assert f"--preset {preset} " in profile and "--launch-count 1" in profile
        assert report.startswith("ncu: --import") and f"{name}.ncu-rep" in report


def _ncu_installed():
    return any(os.path.exists(p) for p in ["/usr/local/cuda/bin/ncu",
                                           *glob.glob("/opt/nvidia/nsight-compute/*/ncu")])


def test_device_check_without_ncu_fails_the_profile_rows(tmp_path):
    if _ncu_installed():
        pytest.skip("ncu is installed where the script looks whatever PATH says")
    proc, _, rows = _run_device_check(tmp_path, ["nvidia-smi", "python", "compute-sanitizer"])
    assert rows["profile_vllm"] == rows["profile_nhd"] == rows["profile_small_vllm"] == (
        "SKIPPED (no ncu)")
    assert proc.returncode == 3  # the three count as failed


def test_device_check_bundles_its_files_when_writing_to_OUT(tmp_path):
    # A lent GPU machine sends back at most 8 files from $OUT: results.md and one tarball.
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python", "compute-sanitizer",
                                                   "ncu"], out_arg=False, CHECK_STEPS="check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["device_check.tgz", "results.md"]
    assert rows["check"] == "ok"
    with tarfile.open(out / "device_check.tgz") as bundle:
        names = {os.path.basename(n) for n in bundle.getnames()}
    assert {"results.md", "gpu.log", "check.log"} <= names


def test_device_check_without_compute_sanitizer_fails_those_rows(tmp_path):
    if os.path.exists("/usr/local/cuda/bin/compute-sanitizer"):
        pytest.skip("compute-sanitizer is installed in /usr/local/cuda/bin, where the script "
                    "looks whatever PATH says")
    proc, _, rows = _run_device_check(tmp_path, ["nvidia-smi", "python", "ncu"])
    sanitizer_rows = {k: v for k, v in rows.items() if k.startswith("sanitizer_")}
    assert sanitizer_rows == {name: "SKIPPED (no compute-sanitizer)" for name in
                              ("sanitizer_memcheck", "sanitizer_racecheck", "sanitizer_synccheck")}
    assert proc.returncode == 3  # the three count as failed; every other stand-in step passed


def test_device_check_runs_only_the_selected_steps(tmp_path):
    proc, _, rows = _run_device_check(tmp_path, ["nvidia-smi", "python"], CHECK_STEPS="bench")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("build", "tests", "check", "sanitizer"):
        assert rows[step] == "not selected"
    bench = {k: v for k, v in rows.items() if k.startswith("bench_")}
    assert set(bench) >= {"bench_vllm", "bench_vllm_pipelined", "bench_vllm_baseline",
                          "bench_nhd", "bench_nhd_pipelined", "bench_nhd_baseline",
                          "bench_kernels_vllm", "bench_kernels_nhd", "bench_split_off",
                          "bench_split_4", "bench_split_8_1", "bench_vllm_pdl"}
    assert set(bench.values()) == {"ok"}
    # the stand-in python logs its arguments and the split / PDL settings: only the kernel-time
    # steps profile, only the sweep's steps set another split, each its own, on v1 alone, and
    # only bench_vllm_pdl launches the reduce programmatically
    for step in bench:
        log = (tmp_path / "out" / f"{step}.log").read_text()
        assert ("--kernel-times" in log) == step.startswith("bench_kernels_"), (step, log)
        split = re.search(r"^split=(.*)$", log, re.MULTILINE).group(1)
        if step.startswith("bench_split_"):
            assert split.replace(":", "_") == step[len("bench_split_"):], (step, split)
            assert "--contenders ours-v1 " in log and "--kv-layout vllm" in log, log
        else:
            assert split == "", (step, split)
        pdl = re.search(r"^pdl=(.*)$", log, re.MULTILINE).group(1)
        assert pdl == ("1" if step == "bench_vllm_pdl" else ""), (step, pdl)


def test_device_check_stops_on_old_setuptools_without_a_wheel(tmp_path):
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python-old-setuptools"],
                                        python="python-old-setuptools",
                                        WHEELS=str(tmp_path / "no-wheels"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no setuptools >= 77" in proc.stderr
    assert rows["gpu"].startswith("setuptools < 77")
    assert not (out / "build.log").exists()  # stopped before building


def test_device_check_takes_a_carried_setuptools_wheel(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "setuptools-99.0.0-py3-none-any.whl").write_text("stand-in")
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python-old-setuptools"],
                                        python="python-old-setuptools", WHEELS=str(wheels),
                                        CHECK_STEPS="build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "setuptools from setuptools-99.0.0-py3-none-any.whl" in (out / "gpu.log").read_text()
    assert rows["build"] == "ok"
    assert "path=/tmp/pa-setuptools" in (out / "build.log").read_text()  # the build sees it


def _checkout_with_prebuilt(tmp_path, torch_version="9.0", arch="9.0"):
    """A throwaway git checkout holding device_check.sh, a committed csrc/ and a prebuilt folder
    (scripts/gpu/prebuild_cuda.sh's form) whose stamp names that csrc/ tree: (script, prebuilt dir).
    The stand-in python answers 9.0 to every -c: the torch version the check compares with."""
    import gzip
    import shutil

    repo = tmp_path / "checkout"
    (repo / "scripts" / "gpu").mkdir(parents=True)
    (repo / "csrc").mkdir()
    (repo / "paged_attention_ext").mkdir()
    shutil.copy(SCRIPT, repo / "scripts" / "gpu" / "device_check.sh")
    (repo / "csrc" / "kernel.cu").write_text("// the kernels\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "checkout"]):
        subprocess.run(git + args, check=True, capture_output=True)
    tree = subprocess.run(git + ["rev-parse", "HEAD:csrc"], check=True, capture_output=True,
                          text=True).stdout.strip()
    prebuilt = tmp_path / "prebuilt"
    prebuilt.mkdir()
    with gzip.open(prebuilt / "_C.abi3.so.gz", "wb") as f:
        f.write(b"stand-in extension")
    (prebuilt / "stamp").write_text(f"csrc_tree {tree}\ntorch {torch_version}\narch {arch}\n")
    return repo, str(repo / "scripts" / "gpu" / "device_check.sh"), prebuilt


def test_device_check_unpacks_a_prebuilt_extension_that_fits(tmp_path):
    repo, script, prebuilt = _checkout_with_prebuilt(tmp_path)
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python"], script=script,
                                        PREBUILT=str(prebuilt), CHECK_STEPS="build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows["unpack_prebuilt"] == "ok" and "build" not in rows
    assert (repo / "paged_attention_ext" / "_C.abi3.so").read_bytes() == b"stand-in extension"


@pytest.mark.parametrize("change,reason", [
    ("torch", "its stamp lacks 'torch 9.0'"),
    ("arch", "its stamp lacks 'arch 9.0'"),
    ("csrc", "csrc/ differs from HEAD's"),
])
def test_device_check_builds_when_the_prebuilt_one_does_not_fit(tmp_path, change, reason):
    repo, script, prebuilt = _checkout_with_prebuilt(
        tmp_path, torch_version="2.11.0+cu130" if change == "torch" else "9.0",
        arch="8.0" if change == "arch" else "9.0")
    if change == "csrc":
        (repo / "csrc" / "kernel.cu").write_text("// edited after the prebuild\n")
    proc, out, rows = _run_device_check(tmp_path, ["nvidia-smi", "python"], script=script,
                                        PREBUILT=str(prebuilt), CHECK_STEPS="build")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows["build"] == "ok" and "unpack_prebuilt" not in rows
    assert "setup.py build_ext --inplace" in (out / "build.log").read_text()
    assert f"PREBUILT={prebuilt} not used: {reason}; building" in (out / "gpu.log").read_text()
    assert not (repo / "paged_attention_ext" / "_C.abi3.so").exists()
