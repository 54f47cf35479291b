"""How many threads a CPU attention call wakes (csrc/cpu/threads_per_call.h): one per
min_kv_bytes_per_thread of K / V, 256 KiB when idle OpenMP threads spin and 4 MiB when they
sleep, as the OpenMP variables say (read once per process: each case runs in its own), or what
PAGED_ATTN_CPU_KV_BYTES_PER_THREAD forces (read on every call). And whatever the threads, the
compiled kernel's results are bit for bit the same: every work item is computed alone, and the
merge of a row's partitions runs in one order."""

import json
import os
import subprocess
import sys

import pytest
import torch

import paged_attention_ext as pa
from paged_attention_ext.tools import testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORCE = "PAGED_ATTN_CPU_KV_BYTES_PER_THREAD"
OPENMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
SPIN, SLEEP = 256 << 10, 4 << 20

pytestmark = pytest.mark.skipif(not pa.extension_loaded(), reason=pa.extension_status())


def _threading_in_a_process_with(env_vars):
    env = {k: v for k, v in os.environ.items() if k not in OPENMP_VARIABLES + (FORCE,)}
    env.update(env_vars)
    proc = subprocess.run(
        [sys.executable, "-c",
         "import json, paged_attention_ext as pa; print(json.dumps(pa.cpu_threading()))"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env_vars,idle,setting,min_bytes", [
    ({}, "spin", "default", SPIN),
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "sleep", "OMP_WAIT_POLICY=passive", SLEEP),
    ({"OMP_WAIT_POLICY": "active"}, "spin", "OMP_WAIT_POLICY=active", SPIN),
    ({"GOMP_SPINCOUNT": "0"}, "sleep", "GOMP_SPINCOUNT=0", SLEEP),
    # libgomp: an explicit spin count wins over the policy
    ({"GOMP_SPINCOUNT": "10k", "OMP_WAIT_POLICY": "passive"}, "spin", "GOMP_SPINCOUNT=10k", SPIN),
    ({"KMP_BLOCKTIME": "0"}, "sleep", "KMP_BLOCKTIME=0", SLEEP),
    ({FORCE: "65536", "OMP_WAIT_POLICY": "passive"}, "sleep", "OMP_WAIT_POLICY=passive", 65536),
])
def test_policy_and_minimum_from_the_environment(env_vars, idle, setting, min_bytes):
    got = _threading_in_a_process_with(env_vars)
    assert got == {"idle_threads": idle, "setting": setting, "min_kv_bytes_per_thread": min_bytes,
                   "forced": FORCE in env_vars}


@pytest.mark.parametrize("value", ["0", "-4096", "12x", "", " 1"])
def test_a_bad_forced_minimum_is_a_value_error(monkeypatch, value):
    monkeypatch.setenv(FORCE, value)
    message = f"{FORCE}={value} is not a positive number of bytes"
    with pytest.raises(ValueError, match=f"^{message}$"):
        pa.cpu_threading()
    inputs = testing.make_attention_inputs(1, 4, 1, 64, 16, [20], seed=3)
    with pytest.raises(ValueError, match=f"^paged_attn.v1: {message}$"):
        testing.call_v1(torch.ops.paged_attn.v1, inputs, testing.alloc_v1_outputs(inputs))


@pytest.fixture
def two_torch_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("layout", ["vllm", "hnd"])
def test_one_thread_and_a_thread_per_work_item_agree_bitwise(monkeypatch, two_torch_threads,
                                                             layout):
    # 5 MiB of K / V in 3 rows of 1-3 partitions: a thread per work item (minimum 1 byte) against
    # all of them on one thread (a minimum beyond the call).
    legacy = testing.make_attention_inputs(3, 16, 4, 128, 16, [1500, 70, 1025],
                                           dtype=torch.bfloat16, seed=31)

    def run(min_bytes):
        monkeypatch.setenv(FORCE, str(min_bytes))
        if layout == "vllm":
            return tuple(testing.call_v2(torch.ops.paged_attn.v2, legacy,
                                         testing.alloc_v2_outputs(legacy)))
        inputs = testing.decode_inputs_from(legacy, layout)
        out = torch.full_like(inputs.query, float("nan"))
        return (testing.call_decode(torch.ops.paged_attn.decode, inputs, out),)

    one, many = run(1 << 50), run(1)
    for a, b in zip(one, many):
        assert torch.equal(torch.nan_to_num(a, nan=7.0), torch.nan_to_num(b, nan=7.0))
    testing.assert_out_matches(many[0], testing.call_v1(pa.reference.paged_attention_v1, legacy,
                                                        testing.alloc_v1_outputs(legacy)),
                               torch.bfloat16)
