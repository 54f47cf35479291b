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

import host_cpp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOST_PROGRAM = textwrap.dedent(r"""
    #include <cstdio>
    #include <cstdlib>
    #include <string>

    #include "cuda/kernel_choice.h"

    using namespace paged_attn::cuda;

    // stdin: lines "SETTING CODE_ARCH" (SETTING "-" for unset); stdout: "KERNEL|ERROR|RULE".
    int main() {
      char setting[64];
      int code_arch;
      while (std::scanf("%63s %d", setting, &code_arch) == 2) {
        if (std::string(setting) == "-") unsetenv("PAGED_ATTN_CUDA_KERNEL");
        else setenv("PAGED_ATTN_CUDA_KERNEL", setting, 1);
        reload_attention_kernel_setting();
        std::string error;
        const AttentionKernel kernel = choose_attention_kernel(3, code_arch, &error);
        std::printf("%s|%s|%s\n", attention_kernel_name(kernel), error.c_str(),
                    attention_kernel_setting().c_str());
      }
      return 0;
    }
""")


@pytest.fixture(scope="module")
def choose(tmp_path_factory):
    """choose([(setting, code_arch)]) -> [(kernel, error, rule text)]."""
    exe = host_cpp.build(tmp_path_factory.mktemp("kernel_choice"), "kernel_choice_host",
                         HOST_PROGRAM + '#include "cuda/kernel_choice.cu"\n', std="c++17",
                         flags=("-O1", "-Wall", "-Werror"))

    def run(cases):
        text = "".join(f"{setting or '-'} {arch}\n" for setting, arch in cases)
        out = subprocess.run([exe], input=text, capture_output=True, text=True, timeout=60,
                             check=True).stdout.splitlines()
        assert len(out) == len(cases)
        return [tuple(line.split("|", 2)) for line in out]

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


def test_baseline_runs_on_every_arch(choose):
    got = choose([("baseline", arch) for arch in OLD + NEW])
    assert all(kernel == "baseline" and error == "" for kernel, error, _ in got)


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
