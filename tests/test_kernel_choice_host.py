"""Which CUDA attention kernel a call runs (csrc/cuda/kernel_choice.cu), run on the host.

kernel_choice.cu is plain C++ (no CUDA call): a small program compiled with the host compiler
reads (PAGED_ATTN_CUDA_KERNEL, the arch the device's code was compiled for) pairs and prints the
choice and the error. The rule is checked from kernel_choice.h's contract: the pipelined and
tensor-core kernels only where the code that runs was compiled for sm_80 or newer. That is what
keeps a build whose only image for a newer GPU is compute_75 PTX (an arch list of "7.5+PTX")
on the baseline: that code has no cp.async, and its tensor-core path traps.
"""

import os
import subprocess
import textwrap

from support import host_cpp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOST_PROGRAM = textwrap.dedent(r"""
    #include <cstdio>
    #include <cstdlib>
    #include <string>

    #include "cuda/kernel_choice.h"

    using namespace paged_attn::cuda;

    void set(const char* name, const char* value) {  // "-": unset
      if (std::string(value) == "-") unsetenv(name);
      else setenv(name, value, 1);
    }

    // stdin: lines "SETTING CODE_ARCH SPLIT PDL" ("-" for unset); stdout: "KERNEL|ERROR|RULE|
    // SPLIT_BLOCKS_PER_SM:SPLIT_MIN_TILES|SPLIT_ERROR|SPLIT_TEXT|PDL|PDL_ERROR|PDL_TEXT".
    int main() {
      char setting[64], split[64], pdl[64];
      int code_arch;
      while (std::scanf("%63s %d %63s %63s", setting, &code_arch, split, pdl) == 4) {
        set("PAGED_ATTN_CUDA_KERNEL", setting);
        set("PAGED_ATTN_CUDA_SPLIT", split);
        set("PAGED_ATTN_CUDA_PDL", pdl);
        reload_attention_kernel_setting();
        std::string error, split_error, pdl_error;
        const AttentionKernel kernel = choose_attention_kernel(3, code_arch, &error);
        const SplitAim aim = split_aim(&split_error);
        const bool programmatic = programmatic_reduce_launch(code_arch, &pdl_error);
        std::printf("%s|%s|%s|%d:%d|%s|%s|%d|%s|%s\n", attention_kernel_name(kernel),
                    error.c_str(), attention_kernel_setting().c_str(), aim.blocks_per_sm,
                    aim.min_partition_tiles, split_error.c_str(), split_setting().c_str(),
                    programmatic ? 1 : 0, pdl_error.c_str(), pdl_setting().c_str());
      }
      return 0;
    }
""")


@pytest.fixture(scope="module", params=["default build", "PAGED_ATTN_CUDA_BASELINE"])
def choose(tmp_path_factory, request):
    """choose([(setting, code_arch[, split[, pdl]])]) -> [(kernel, error, rule text)]; with
    split=True: [((split blocks per SM, min partition tiles), split error, split text)]; with
    pdl=True: [(programmatic launch, pdl error, pdl text)]. Built twice: as a default build (the
    baseline kernel only in code below sm_80: csrc/cuda/kernel_families.h) and as one built with
    PAGED_ATTN_CUDA_BASELINE=1 (the baseline in every arch's code); choose.baseline_everywhere
    says which."""
    baseline_everywhere = request.param == "PAGED_ATTN_CUDA_BASELINE"
    exe = host_cpp.build(tmp_path_factory.mktemp("kernel_choice"), "kernel_choice_host",
                         HOST_PROGRAM + '#include "cuda/kernel_choice.cu"\n', std="c++17",
                         flags=("-O1", "-Wall", "-Werror")
                         + (("-DPAGED_ATTN_CUDA_BASELINE",) if baseline_everywhere else ()))

    def run(cases, split=False, pdl=False):
        text = "".join(" ".join([case[0] or "-", str(case[1])] +
                                [(list(case[2:]) + [None, None])[i] or "-" for i in (0, 1)]) + "\n"
                       for case in cases)
        out = subprocess.run([exe], input=text, capture_output=True, text=True, timeout=60,
                             check=True).stdout.splitlines()
        assert len(out) == len(cases)
        fields = [line.split("|") for line in out]
        assert all(len(f) == 9 for f in fields), out
        if split:
            return [(tuple(map(int, f[3].split(":"))), f[4], f[5]) for f in fields]
        if pdl:
            return [(f[6] == "1", f[7], f[8]) for f in fields]
        return [tuple(f[:3]) for f in fields]

    run.baseline_everywhere = baseline_everywhere
    return run


# code archs as cudaFuncAttributes::ptxVersion reports them: 75 for compute_75 code (sm_75, or
# PTX the driver compiled for a newer GPU), 80 / 86 / 90 / 100 / 120 for sm_80+ code
OLD, NEW = (70, 75), (80, 86, 89, 90, 100, 120)


@pytest.mark.parametrize("setting", [None, "", "auto"])
def test_auto_takes_tensor_cores_only_for_code_compiled_for_sm80(choose, setting):
    got = choose([(setting, arch) for arch in OLD + NEW])
    assert [kernel for kernel, _, _ in got] == ["baseline"] * len(OLD) + ["mma"] * len(NEW)
    assert all(error == "" for _, error, _ in got)
    assert all(rule.startswith("auto:") for _, _, rule in got)


def test_forced_baseline_runs_where_the_build_compiled_it(choose):
    got = choose([("baseline", arch) for arch in OLD + NEW])
    assert all(kernel == "baseline" for kernel, _, _ in got)
    for (_, error, _), arch in zip(got, OLD + NEW):
        if arch < 80 or choose.baseline_everywhere:
            assert error == "", (arch, error)
        else:  # its code for sm_80+ holds a trap in the baseline's place: refused, never launched
            for part in ("PAGED_ATTN_CUDA_KERNEL=baseline", "cuda:3", f"sm_{arch}",
                         "PAGED_ATTN_CUDA_BASELINE=1"):
                assert part in error, (part, error)


@pytest.mark.parametrize("setting", ["pipelined", "mma"])
def test_forced_pipelined_kernels_need_sm80_code(choose, setting):
    got = choose([(setting, arch) for arch in OLD + NEW])
    for (kernel, error, _), arch in zip(got, OLD + NEW):
        if arch >= 80:
            assert (kernel, error) == (setting, "")
        else:
            # the baseline is returned with an error the op raises: it names the setting, the
            # device, the code's arch and the way out
            assert kernel == "baseline"
            for part in (f"PAGED_ATTN_CUDA_KERNEL={setting}", "sm_80", "cuda:3",
                         f"sm_{arch}", "baseline", "TORCH_CUDA_ARCH_LIST"):
                assert part in error, (part, error)


def test_a_bad_setting_is_an_error_naming_it(choose):
    (kernel, error, rule), = choose([("tensorcores", 90)])
    assert kernel == "baseline"
    assert "PAGED_ATTN_CUDA_KERNEL='tensorcores'" in error and "mma" in error
    assert rule.startswith("error:")


# ---- the v1 / decode split's aim (PAGED_ATTN_CUDA_SPLIT, read with the kernel setting) ----
DEFAULT_SPLIT = (8, 2)  # core/split_plan.h kSplitBlocksPerSm, kMinPartitionTiles (test_split_plan)


@pytest.mark.parametrize("value", [None, "", "auto"])
def test_split_default_is_the_plan_default(choose, value):
    (aim, error, text), = choose([(None, 90, value)], split=True)
    assert (aim, error) == (DEFAULT_SPLIT, "")
    assert text == "auto: 8 blocks per SM, partitions of >= 2 tiles"


def test_split_off_and_numbers(choose):
    got = choose([(None, 90, "off"), (None, 90, "1"), (None, 90, "16"), (None, 90, "256"),
                  (None, 90, "16:1"), (None, 90, "4:64"), ("baseline", 75, "32")], split=True)
    assert [aim for aim, _, _ in got] == [(0, 2), (1, 2), (16, 2), (256, 2), (16, 1), (4, 64),
                                          (32, 2)]
    assert all(error == "" for _, error, _ in got)
    assert got[0][2] == "off (PAGED_ATTN_CUDA_SPLIT=off)"
    assert got[2][2] == "16 blocks per SM, partitions of >= 2 tiles (PAGED_ATTN_CUDA_SPLIT=16)"
    assert got[4][2] == "16 blocks per SM, partitions of >= 1 tile (PAGED_ATTN_CUDA_SPLIT=16:1)"
    # the kernel setting read at the same time is untouched by it
    assert choose([("baseline", 75, "32")]) == [("baseline", "", "baseline "
                                                 "(PAGED_ATTN_CUDA_KERNEL=baseline)")]


@pytest.mark.parametrize("value", ["0", "257", "-4", "4x", "many", "1e3", "99999", "+8", "_8",
                                   "8:", ":2", "8:0", "8:65", "8:2:1", "off:2", "auto:1"])
def test_a_bad_split_is_an_error_naming_it(choose, value):
    (aim, error, text), = choose([(None, 90, value)], split=True)
    assert aim == DEFAULT_SPLIT and f"PAGED_ATTN_CUDA_SPLIT='{value}'" in error
    assert "auto, off, B or B:T" in error and "1-256" in error and "1-64" in error
    assert text == "error: " + error
    # a bad split setting leaves the kernel choice alone (the split's error is raised by v1 /
    # decode before they plan)
    assert choose([(None, 90, value)]) == [
        ("mma", "", "auto: mma where the code that runs is compiled for sm_80+, else baseline")]


# ---- the split's reduce launched with programmatic dependent launch (PAGED_ATTN_CUDA_PDL) ----
@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_pdl_is_off_by_default(choose, value):
    got = choose([(None, arch, None, value) for arch in OLD + NEW], pdl=True)
    assert got == [(False, "", "off")] * len(OLD + NEW)


@pytest.mark.parametrize("value", ["1", "on"])
def test_pdl_on_only_for_code_compiled_for_sm90(choose, value):
    got = choose([(None, arch, None, value) for arch in OLD + NEW], pdl=True)
    # below sm_90 code the kernels have no griddepcontrol.wait: a programmatic launch there
    # would let the reduce read the scratch before phase 1 has written it
    assert [on for on, _, _ in got] == [arch >= 90 for arch in OLD + NEW]
    assert all(error == "" for _, error, _ in got)
    assert got[0][2] == ("on where the code that runs is compiled for sm_90+ "
                         f"(PAGED_ATTN_CUDA_PDL={value})")


@pytest.mark.parametrize("value", ["yes", "2", "true", "ON"])
def test_a_bad_pdl_setting_is_an_error_naming_it(choose, value):
    (on, error, text), = choose([(None, 90, None, value)], pdl=True)
    assert not on and f"PAGED_ATTN_CUDA_PDL='{value}'" in error and "1 or on" in error
    assert text == "error: " + error
