"""The CUDA kernels' shared-memory race check: the host simulation (tests/support/cuda_sim.py)
built with ThreadSanitizer, where cuda_sim.h's race model makes every access of a block's threads
to shared memory that no __syncthreads / __syncwarp / cp.async wait orders a reported race; and
the checks that it reports what it should (a barrier that orders nothing, accesses no barrier
orders). Apart from tests/test_cuda_host_sim.py so that the two builds run on two workers."""

import os
import re
import subprocess

import pytest

from support import cross_cases as cross
from support import cuda_sim as sim
from support.cuda_sim import CASES, KERNELS, RACE_CASES, TSAN_ENV

# A ThreadSanitizer build of the simulation: minutes of compiling, not in the default test command.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")  # built once per xdist worker, however tests interleave
def race_selftest(tmp_path_factory):
    exe = sim.race_checked_build(tmp_path_factory.mktemp("cuda_sim_race_selftest"), "sim_selftest")

    def run(what, env=None):
        return subprocess.run([exe, what], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **TSAN_ENV, **(env or {})})
    return run


@pytest.mark.parametrize("what", ["race", "shuffle", "cross_warp"])
def test_the_race_model_reports_accesses_no_barrier_orders(race_selftest, what):
    """A read of another thread's shared-memory write with no barrier between (race), with only
    a shuffle between (a shuffle is no memory fence), or across warps with only __syncwarp
    between: ThreadSanitizer reports it, whatever order the simulation ran the threads in (in
    thread order, `race` and `shuffle` even read the right values)."""
    ran = race_selftest(what)
    assert ran.returncode == 66, ran
    assert "WARNING: ThreadSanitizer: data race" in ran.stderr, ran.stderr
    assert "neighbour_read" in ran.stderr and "::smem" in ran.stderr, ran.stderr  # the array


@pytest.mark.parametrize("what", ["barrier", "warp_fence", "async", "smem_fresh"])
def test_the_race_model_accepts_what_barriers_order(race_selftest, what):
    """The same reads after __syncthreads, within a warp after __syncwarp, a cp.async read
    after its wait by the thread that issued it, and blocks reusing shared memory: no report."""
    ran = race_selftest(what)
    assert ran.returncode == 0 and "ThreadSanitizer" not in ran.stderr, ran
    assert ran.stdout.strip() in (f"{what}: 0 wrong", "async: ok",
                                  "smem_fresh: block 1 read NaN"), ran.stdout


@pytest.mark.parametrize("what, barrier", [("barrier", "syncthreads"), ("warp_fence", "syncwarp")])
def test_an_unordered_barrier_is_a_reported_race(race_selftest, what, barrier):
    """CUDA_SIM_UNORDERED=<barrier> (the kernels' check below): the barrier still parks the
    threads, so the values are right, but orders nothing, so the same reads are races; a value
    it does not know is a usage error."""
    ran = race_selftest(what, {"CUDA_SIM_UNORDERED": barrier})
    assert ran.stdout.strip() == f"{what}: 0 wrong", ran
    assert ran.returncode == 66 and "WARNING: ThreadSanitizer: data race" in ran.stderr, ran
    bad = race_selftest(what, {"CUDA_SIM_UNORDERED": "fence"})
    assert bad.returncode == 2 and "want syncwarp or syncthreads" in bad.stderr, bad


@pytest.fixture(scope="session")  # built once per xdist worker, however tests interleave
def race_driver(tmp_path_factory):
    """The driver built with ThreadSanitizer (a compile of about a minute)."""
    return sim.race_checked_build(tmp_path_factory.mktemp("cuda_sim_race_build"), "driver")


def test_no_data_race_in_any_kernel(race_driver, tmp_path):
    """Every kernel choice and mode on RACE_CASES with the simulation built with ThreadSanitizer:
    no two threads of a block touch the same byte (one of them writing) without a __syncthreads
    or, within a warp, a __syncwarp between, and every answer matches the oracle (about 7x the
    plain simulation's time, hence a subset here and the rest @slow)."""
    sim.assert_all_passed(sim.run_driver(race_driver, tmp_path, RACE_CASES, env=TSAN_ENV), RACE_CASES)


@pytest.mark.slow
def test_no_data_race_in_any_kernel_on_the_other_cases(race_driver, tmp_path):
    others = [c for c in CASES if c not in RACE_CASES]
    sim.assert_all_passed(sim.run_driver(race_driver, tmp_path, others, env=TSAN_ENV), others)


# the file whose code a missing barrier makes race, per kernel choice
KERNEL_SOURCE = {"baseline": "csrc/cuda/attention_kernel.cuh",
                 "pipelined": "csrc/cuda/attention_kernel_pipelined.cuh",
                 "mma": "csrc/cuda/attention_kernel_pipelined.cuh"}


@pytest.mark.slow
@pytest.mark.parametrize("barrier", ["syncwarp", "syncthreads"])
def test_a_barrier_that_orders_nothing_is_reported(race_driver, tmp_path, barrier):
    """What makes the race-free run above mean something: with CUDA_SIM_UNORDERED every
    __syncwarp (or __syncthreads) of the kernels still parks the threads, so every answer stays
    right, but orders no memory, as if it were missing on a GPU; ThreadSanitizer then reports a
    race in each kernel choice's own code."""
    case_dir = str(tmp_path / "case")
    cross.write_cases(case_dir, [CASES[15]])  # NHD, GQA 8, bf16: every kernel, v2 / v1 / split
    for kernel in KERNELS:
        run = subprocess.run([race_driver, case_dir, kernel], capture_output=True,
                             text=True, timeout=600,
                             env={**os.environ, **TSAN_ENV, "CUDA_SIM_UNORDERED": barrier})
        assert "0 failed" in run.stdout and "FAIL" not in run.stdout, run.stdout  # same values
        assert run.returncode == 66, (kernel, run.returncode, run.stderr[-3000:])
        races = re.findall(r"^SUMMARY: ThreadSanitizer: data race (\S+):\d+", run.stderr, re.M)
        assert any(f.endswith(KERNEL_SOURCE[kernel]) for f in races), (kernel, races)
