"""The CPU kernel variants built WITHOUT torch (tests/cross/driver.cpp + csrc/cpu) on the hardware or
emulator they target: the host build runs every x86 variant this CPU executes (amx,
avx512-bf16, avx512, avx2-fma, scalar), the aarch64 build runs neon and scalar under qemu-aarch64, built by GCC
and by clang. scripts/ci/cross_test.sh builds and runs the driver on the cases of
tests/support/cross_cases.py (against the oracle); this file checks every variant passed all.
"""

import os
import re
import shutil
import subprocess

import pytest

from support.cross_cases import CASES, ROOT, write_cases

# Builds of the torch-free driver for the host and for aarch64 (qemu): not in the default test
# command (`bash scripts/test.sh --all` and CI run them).
pytestmark = pytest.mark.slow


# ---- the tests: scripts/ci/cross_test.sh builds the driver and runs it on the cases ----

LINE = re.compile(r"^(\S+): (?:(\d+) cases passed, (\d+) failed|skipped)", re.M)


@pytest.fixture(scope="module")
def case_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross_cases")
    write_cases(str(folder))
    return str(folder)


def run_cross(target, case_dir, build_dir):
    """Runs scripts/ci/cross_test.sh for one target; returns {variant: (passed, failed) or None}."""
    env = dict(os.environ, PAGED_ATTN_CROSS_BUILD=str(build_dir), PAGED_ATTN_CROSS_INSTALL="0")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "ci", "cross_test.sh"), target, case_dir],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    print(r.stdout, r.stderr)  # shown by pytest on failure
    assert r.returncode == 0, f"cross_test.sh {target} failed (rc {r.returncode}):\n" \
                              f"{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return {m[1]: (int(m[2]), int(m[3])) if m[2] else None for m in LINE.finditer(r.stdout)}


def assert_all_passed(results, names):
    for name in names:
        assert results.get(name) == (len(CASES), 0), f"{name}: {results.get(name)} of {results}"


def test_host_variants(case_dir, tmp_path):
    results = run_cross("--host", case_dir, tmp_path)
    ran = [name for name, r in results.items() if r is not None]
    assert "scalar" in ran, results
    assert_all_passed(results, ran)
    # the torch build's CPU check agrees: every variant it can run here, the driver ran
    import paged_attention_ext
    runnable = [n for n, ok, _ in paged_attention_ext.cpu_kernel_variants() if ok]
    assert set(runnable) <= set(ran), (runnable, results)


def test_aarch64_variants_under_qemu(case_dir, tmp_path):
    import platform
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("host is aarch64: test_host_variants runs neon natively")
    missing = [t for t in ("aarch64-linux-gnu-g++", "qemu-aarch64") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install g++-aarch64-linux-gnu "
                    "qemu-user, or PAGED_ATTN_CROSS_INSTALL=1 bash scripts/ci/cross_test.sh as root)")
    assert_all_passed(run_cross("--arm", case_dir, tmp_path), ["neon", "scalar"])


def test_aarch64_variants_built_by_clang_under_qemu(case_dir, tmp_path):
    """The same, compiled by clang (Apple silicon's compiler family) instead of GCC."""
    import platform
    if platform.machine() in ("aarch64", "arm64"):
        pytest.skip("host is aarch64: scripts/ci/test_clang.sh builds with clang natively")
    missing = [t for t in ("clang++", "aarch64-linux-gnu-g++", "qemu-aarch64")
               if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (apt-get install clang "
                    "g++-aarch64-linux-gnu qemu-user)")
    assert_all_passed(run_cross("--arm-clang", case_dir, tmp_path), ["neon", "scalar"])
