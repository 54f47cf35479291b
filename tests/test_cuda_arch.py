"""Which GPUs a CUDA build runs on: the decision logic, on the CPU (no GPU is needed or used).

paged_attention_ext/tools/cuda_arch.py (`info`) and csrc/core/cuda_arch.h (the check the CUDA ops
run before their first launch on a device) are fed the same table of fake compiled-image lists
and compute capabilities, and must both give the expected answer and the same error text. The
build's arch list (build_helpers/cuda_build.py) is checked through torch's own translation into
nvcc flags. When the extension was built with CUDA kernels, the image list compiled into the
run-time check must equal the images actually in the library.
"""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from support import build_helpers, fatbin
from paged_attention_ext.tools import backends, cuda_arch
from paged_attention_ext.tools.cuda_arch import (Target, match, mismatch_message, parse_target,
                                                 parse_targets)

cuda_build = build_helpers.load("cuda_build")
DEFAULT_ARCH_LIST = cuda_build.DEFAULT_ARCH_LIST
resolve_arch_list = cuda_build.resolve_arch_list
targets_from_gencode = cuda_build.targets_from_gencode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TARGETS = "sm_75,sm_80,sm_90,sm_100,sm_120,compute_120"

# (compiled images, GPU compute capability, the image the driver would use or None)
CASES = [
    # the old default: 8.0;9.0 without PTX (issue 17)
    ("sm_80,sm_90", (7, 5), None),
    ("sm_80,sm_90", (8, 0), "sm_80"),
    ("sm_80,sm_90", (8, 6), "sm_80"),
    ("sm_80,sm_90", (8, 9), "sm_80"),
    ("sm_80,sm_90", (9, 0), "sm_90"),
    ("sm_80,sm_90", (10, 0), None),
    ("sm_80,sm_90", (12, 0), None),
    # the new default
    (DEFAULT_TARGETS, (7, 0), None),
    (DEFAULT_TARGETS, (7, 5), "sm_75"),
    (DEFAULT_TARGETS, (8, 0), "sm_80"),
    (DEFAULT_TARGETS, (8, 6), "sm_80"),
    (DEFAULT_TARGETS, (8, 7), "sm_80"),
    (DEFAULT_TARGETS, (8, 9), "sm_80"),
    (DEFAULT_TARGETS, (9, 0), "sm_90"),
    (DEFAULT_TARGETS, (10, 0), "sm_100"),
    (DEFAULT_TARGETS, (10, 3), "sm_100"),
    (DEFAULT_TARGETS, (11, 0), None),
    (DEFAULT_TARGETS, (12, 0), "sm_120"),
    (DEFAULT_TARGETS, (12, 1), "sm_120"),
    (DEFAULT_TARGETS, (13, 0), "compute_120"),
    # PTX: any newer capability, never an older one; SASS preferred over PTX
    ("compute_80", (7, 5), None),
    ("compute_80", (12, 0), "compute_80"),
    ("sm_80,compute_80", (8, 6), "sm_80"),
    ("sm_75,compute_75,compute_90", (9, 0), "compute_90"),
    ("sm_75,compute_75,compute_90", (8, 9), "compute_75"),
    # arch-specific (a) and family (f) images
    ("sm_90a", (9, 0), "sm_90a"),
    ("sm_90a", (9, 1), None),
    ("sm_90a", (10, 0), None),
    ("compute_90a", (10, 0), None),
    ("sm_90,sm_90a", (9, 0), "sm_90a"),
    ("sm_100f", (10, 3), "sm_100f"),
    ("sm_100f", (12, 0), None),
    ("compute_100f", (10, 3), "compute_100f"),
    ("compute_100f", (11, 0), None),
    # nothing compiled
    ("", (9, 0), None),
]


# ---- the Python side ----

@pytest.mark.parametrize("targets,cap,expected", CASES)
def test_match_table(targets, cap, expected):
    m = match(cap, targets)
    assert m.runs == (expected is not None)
    assert m.target == expected
    if expected:
        assert m.how.startswith("PTX" if expected.startswith("compute_") else "SASS")


def test_parse_target_names_and_errors():
    assert parse_target("sm_75") == Target(7, 5)
    assert parse_target("compute_120") == Target(12, 0, "", True)
    assert parse_target("sm_90a") == Target(9, 0, "a")
    assert parse_target("compute_100f").name == "compute_100f"
    for bad in ("sm_8", "sm80", "gfx90a", "sm_90x", "compute_", ""):
        with pytest.raises(ValueError):
            parse_target(bad)
    assert [t.name for t in parse_targets("sm_90, sm_80 compute_90,sm_80")] == [
        "sm_80", "sm_90", "compute_90"]


def test_targets_from_gencode_forms():
    flags = ["-gencode=arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,"
             "compute_90]", "-gencode=arch=compute_120,code=compute_120", "-O3"]
    assert targets_from_gencode(flags) == ["sm_80", "sm_90", "compute_90", "compute_120"]
    assert targets_from_gencode(['-gencode=arch=compute_90a,code="sm_90a"']) == ["sm_90a"]
    assert targets_from_gencode(["-O3"]) == []


def test_resolve_explicit_list_always_wins():
    assert resolve_arch_list("8.0;9.0", [(7, 5)], (12, 0)) == ("8.0;9.0", "TORCH_CUDA_ARCH_LIST")
    assert resolve_arch_list(" 7.5 ", [], None)[0] == "7.5"


def test_resolve_visible_gpus_get_their_arch_and_ptx_of_the_newest():
    assert resolve_arch_list(None, [(8, 6), (7, 5), (8, 6)], (12, 0))[0] == "7.5;8.6+PTX"
    assert resolve_arch_list("native", [(9, 0)], (12, 0))[0] == "9.0+PTX"
    assert resolve_arch_list("", [(9, 0)], None)[0] == "9.0+PTX"
    # a GPU newer than the toolchain: built for the newest it knows (as torch does)
    assert resolve_arch_list(None, [(12, 1)], (12, 0))[0] == "12.0+PTX"


def test_resolve_without_gpu_is_the_default():
    archs, why = resolve_arch_list(None, [], (12, 0))
    assert archs == DEFAULT_ARCH_LIST and "no GPU visible" in why


def _torch_gencode(arch_list, monkeypatch):
    torch_ext = pytest.importorskip("torch.utils.cpp_extension")
    if not hasattr(torch_ext, "_get_cuda_arch_flags"):
        pytest.skip("this torch has no _get_cuda_arch_flags")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", arch_list)
    return torch_ext._get_cuda_arch_flags()


def test_default_list_covers_t4_to_blackwell(monkeypatch):
    """Issue 17's bar: a default build (no GPU visible) holds SASS or usable PTX for sm_75, sm_80,
    sm_86, sm_89, sm_90, sm_100 and sm_120, through torch's real translation into nvcc flags."""
    targets = targets_from_gencode(_torch_gencode(DEFAULT_ARCH_LIST, monkeypatch))
    assert targets == DEFAULT_TARGETS.split(",")
    for cap in [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)]:
        assert match(cap, targets).runs, cap
    assert match((13, 0), targets).how.startswith("PTX")  # forward compatibility


def test_old_default_list_missed_t4_and_blackwell(monkeypatch):
    targets = targets_from_gencode(_torch_gencode("8.0;9.0", monkeypatch))
    assert [cap for cap in [(7, 5), (8, 0), (9, 0), (10, 0), (12, 0)]
            if not match(cap, targets).runs] == [(7, 5), (10, 0), (12, 0)]


def test_mismatch_message_names_everything():
    msg = mismatch_message((7, 5), "sm_80,sm_90", "cuda:0 (Tesla T4)")
    for part in ("cuda:0 (Tesla T4)", "7.5", "sm_75", "sm_80, sm_90",
                 "TORCH_CUDA_ARCH_LIST=7.5 pip install --no-build-isolation -e .",
                 "PAGED_ATTN_DISABLE_EXTENSION=1"):
        assert part in msg, part


def test_cmake_helper_prints_the_resolved_list():
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST="7.5;12.0+PTX")
    proc = subprocess.run([sys.executable, build_helpers.path("cuda_build"), "resolve"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["7.5;12.0+PTX", "sm_75:sm_120:compute_120"]


# ---- the C++ side: csrc/core/cuda_arch.h, compiled as a host program ----

HOST_PROGRAM = textwrap.dedent(r"""
    #include <iostream>
    #include <sstream>
    #include <string>

    #include "core/cuda_arch.h"

    // stdin: one case per line, "major minor targets" (targets may be "-": none).
    // stdout per case: "<runs> <image or -> <parse ok>" then the mismatch message.
    int main() {
      using namespace paged_attn::arch;
      std::string line;
      while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        int major, minor;
        std::string list;
        in >> major >> minor >> list;
        if (list == "-") list.clear();
        std::vector<Target> targets;
        const bool ok = parse_targets(list, targets);
        const Match m = match(major, minor, targets);
        std::cout << m.runs << " " << (m.runs ? targets[m.index].name() : "-") << " " << ok
                  << "\n" << mismatch_message(major, minor, targets, "cuda:0 (fake)") << "\n";
      }
      return 0;
    }
""")


@pytest.fixture(scope="module")
def host_check(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    tmp = tmp_path_factory.mktemp("cuda_arch")
    src, exe = tmp / "check.cpp", tmp / "check"
    src.write_text(HOST_PROGRAM)
    subprocess.run([cxx, "-std=c++17", "-O1", "-Wall", "-Werror", "-I", os.path.join(ROOT, "csrc"),
                    str(src), "-o", str(exe)], check=True, capture_output=True, timeout=300)

    def run(cases):
        stdin = "".join(f"{cap[0]} {cap[1]} {targets.replace(',', ':') or '-'}\n"
                        for targets, cap in cases)
        out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True,
                             check=True, timeout=60).stdout.splitlines()
        return [(out[2 * i].split(), out[2 * i + 1]) for i in range(len(cases))]

    return run


def test_cpp_twin_agrees_with_the_table_and_the_python_text(host_check):
    results = host_check([(t, cap) for t, cap, _ in CASES])
    for (targets, cap, expected), ((runs, image, parsed), message) in zip(CASES, results):
        assert parsed == "1", targets
        assert (runs == "1", None if image == "-" else image) == (expected is not None,
                                                                   expected), (targets, cap)
        assert message == mismatch_message(cap, targets, "cuda:0 (fake)"), (targets, cap)


def test_cpp_twin_reports_a_bad_name_but_keeps_the_good_ones(host_check):
    [((runs, image, parsed), _)] = host_check([("sm_80:bogus:compute_90", (9, 0))])
    # sm_80 SASS cannot run on 9.0; the PTX can
    assert (runs, image, parsed) == ("1", "compute_90", "0")


# ---- the build: the list compiled into the run-time check is the library's real images ----

def test_compiled_check_list_matches_the_library_images():
    """The list the run-time check holds (and build_info() reports) is the library's real images,
    read from its fatbinaries."""
    import paged_attention_ext as pa

    if not pa.extension_loaded():
        pytest.skip("the extension is not built")
    with open(pa._C.__file__, "rb") as f:
        blob = f.read()
    images = fatbin.fatbin_archs(blob)
    assert pa.build_info()["cuda_archs"] == [t.name for t in parse_targets(images)]
    if not images:
        pytest.skip("the extension was built without CUDA kernels")
    expected = ":".join(t.name for t in parse_targets(images)).encode()
    assert b"\0" + expected + b"\0" in blob, (expected, images)


# ---- `info`: the visible GPUs and whether our kernels run there (fake devices) ----

def _detection(archs, gpus):
    det = backends.Detection(torch_version="x", torch_cuda="13.0", cuda_available=bool(gpus),
                             cpu_capability="AVX2", extension_loaded=True, extension_error="",
                             extension_path="", ops_registered=True, cuda_archs=list(archs))
    det.gpus = [backends.GpuInfo(i, name, cap, match(cap, archs) if archs else None)
                for i, (name, cap) in enumerate(gpus)]
    return det


def _lines(det, compiled=True):
    return dict(backends._describe_gpus(det, compiled))


def test_info_without_gpu_lists_archs_and_the_gpus_they_cover():
    lines = _lines(_detection(DEFAULT_TARGETS.split(","), []))
    assert lines["CUDA devices"] == "none visible"
    assert lines["CUDA archs"] == "sm_75, sm_80, sm_90, sm_100, sm_120, compute_120"
    for gpu in ("T4, RTX 20 (sm_75)", "A10, A40, RTX 30 (sm_86 -> sm_80)",
                "L4, L40S, RTX 40 (sm_89 -> sm_80)", "B200, GB200 (sm_100)",
                "RTX 50, RTX PRO 6000 (sm_120)"):
        assert gpu in lines["runs on"], gpu
    assert lines["does not run on"] == "Jetson Thor (sm_110)"
    old = _lines(_detection(["sm_80", "sm_90"], []))
    assert [g.split("(")[-1].rstrip(")") for g in old["does not run on"].split("; ")] == [
        "sm_75", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]
    future = _lines(_detection(["sm_90", "compute_90"], []))
    assert "B200, GB200 (sm_100 -> compute_90 JIT)" in future["runs on"]


def test_info_per_gpu_verdicts():
    det = _detection(["sm_80", "sm_90"], [("Tesla T4", (7, 5)), ("NVIDIA A10", (8, 6)),
                                          ("NVIDIA RTX 5090", (12, 0))])
    lines = _lines(det)
    assert "CANNOT run" in lines["cuda:0"] and "TORCH_CUDA_ARCH_LIST=7.5" in lines["cuda:0"]
    assert lines["cuda:1"].endswith("our kernels run (sm_80 SASS)")
    assert "sm_120" in lines["cuda:2"] and "CANNOT run" in lines["cuda:2"]
    ptx = _lines(_detection(["sm_80", "compute_80"], [("Future GPU", (13, 0))]))
    assert "compute_80 PTX" in ptx["cuda:0"]
    not_built = _lines(_detection([], [("Tesla T4", (7, 5))]), compiled=False)
    assert not_built["CUDA archs"].startswith("none: this _C was built without the CUDA kernels")
    assert cuda_arch.BUILD_CUDA_COMMAND in not_built["CUDA archs"]  # and how to build them
    assert "PyTorch fallback" in not_built["cuda:0"]


def test_info_command_names_the_devices_and_the_compiled_archs():
    import torch

    proc = subprocess.run([sys.executable, "-m", "paged_attention_ext", "info"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="400"))
    assert proc.returncode == 0, proc.stderr
    det = backends.detect()
    if not torch.cuda.is_available():
        assert "none visible" in proc.stdout
    for g in det.gpus:
        assert f"cuda:{g.index}" in proc.stdout
    assert (", ".join(det.cuda_archs) if det.cuda_archs else "none: ") in proc.stdout


# ---- on a GPU (scripts/gpu/device_check.sh): the check itself, whichever way it goes there ----

@pytest.mark.cuda
def test_first_call_on_each_gpu_runs_or_refuses_before_any_launch():
    """Where the build covers the GPU, the first call passes the check and the kernel runs; where
    it does not, the call raises the arch error (naming the GPU's arch, the compiled images and
    the rebuild command) and no CUDA error is left behind (nothing was launched)."""
    import torch

    import paged_attention_ext as pa

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if not backends.compiled_kernel("reshape_and_cache", "CUDA"):
        pytest.skip("the extension has no CUDA kernels")
    for g in backends.detect().gpus:
        dev = f"cuda:{g.index}"
        key = torch.randn(3, 2, 32, device=dev)
        key_cache, value_cache = pa.allocate_kv_cache(2, 2, 32, 16, torch.float32, dev)
        slots = torch.tensor([0, 5, 17], device=dev)
        for attempt in range(2):  # the second call takes the cached answer
            if g.match is None or g.match.runs:
                torch.ops.paged_attn.reshape_and_cache(key, key, key_cache, value_cache, slots,
                                                       "auto", 1.0, 1.0)
                torch.cuda.synchronize(dev)
                assert torch.equal(key_cache[1, :, :, 1, :].reshape(2, 32), key[2])
            else:
                with pytest.raises(RuntimeError) as info:
                    torch.ops.paged_attn.reshape_and_cache(key, key, key_cache, value_cache,
                                                           slots, "auto", 1.0, 1.0)
                text = str(info.value)
                for part in (cuda_arch.capability_name(g.capability),
                             ", ".join(backends.detect().cuda_archs),
                             cuda_arch.rebuild_command(g.capability)):
                    assert part in text, part
                torch.cuda.synchronize(dev)  # raises if a launch had failed
                assert not key_cache.any()
