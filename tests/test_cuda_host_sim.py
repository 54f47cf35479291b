"""The CUDA kernels (csrc/cuda), run on the host in a simulation of the GPU, against the oracle:
the only place they run where no GPU is. The attention kernels below; the cache writes
(reshape_and_cache, reshape_and_cache_flash: tests/cuda_sim/cache_driver.cpp) at the end, bit for
bit against the oracle's caches on vLLM's layout and every token-major layout.

tests/cuda_sim/driver.cpp compiles the kernels' own source with the host compiler on top of
tests/cuda_sim/cuda_sim.h (every thread of a block a fiber, barriers and shuffles simulated,
mma.sync computed from the PTX ISA's fragment layouts) and launches them as ops_cuda.cpp does:
v2 (phase 1 over 512-token partitions, then the reduce kernel), v1 / decode in one pass, and the
v1 / decode split of core/split_plan.h (sized for a 4-SM GPU so rows get split), for each kernel
choice (baseline, pipelined, mma), on case files written by tests/support/cross_cases.py's
writer (the oracle's expected output; shuffled block tables with garbage past each row, NaN in
every cache slot no sequence uses, fp8 scales != 1, outputs and scratch pre-filled with NaN).

What a pass shows: the kernels' indexing, per-lane / per-warp / per-block logic, barrier order
(a barrier some threads skip deadlocks and fails), the split and reduce, and the tensor-core
path's use of the fragments, and the pipeline's cp.async waits and barriers (a copy lands only
when its group is waited for, its destination poisoned until then: a short wait fails, as does a
slot rewritten while a lane the schedule has not yet run still reads it;
test_a_pipeline_wait_one_short_is_caught shows it can), also with the threads run in an order
shuffled at every barrier (a read of another lane's write with no barrier between fails;
tests/cuda_sim/sim_selftest.cpp checks both models on tiny kernels), the 64-bit cache offsets
(blocks moved past element 2^31 of the caches), and data races (tests/test_cuda_race_check.py):
built with ThreadSanitizer, the
simulation reports two threads' conflicting accesses to one byte that no __syncthreads (or, in
a warp, __syncwarp) orders, whatever order it ran them in (every case; a barrier made to order
nothing is reported in every kernel). What it
cannot: the rest of the hardware (memory is sequentially consistent; mma.sync is the
documentation's reading), speed, and the shapes outside kSimDims / kSimTiles of
the driver (head sizes 64-128, head tiles 1, 4, 8). tests/test_conformance.py and
tests/test_cuda_kernels.py do those on a GPU.
"""

import os
import struct
import subprocess

import pytest
import torch

from paged_attention_ext import reference
from paged_attention_ext.core import key_chunk_elements
from paged_attention_ext.tools import conformance, testing
from paged_attention_ext.validation import parse_kv_cache_dtype
from support import cross_cases as cross
from support import cuda_sim as sim
from support.cuda_sim import BF16, CASES, F16, F32, KERNELS, MODES, TSAN_ENV

# Builds of the simulation driver: minutes of compiling, so not in the default test command
# (`bash scripts/test.sh --all` and CI run them).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")  # built once per xdist worker, however tests interleave
def sim_driver(tmp_path_factory):
    """The driver built once for this module's tests."""
    return sim.build(tmp_path_factory.mktemp("cuda_sim_build"), "driver")


@pytest.fixture(scope="session")  # built once per xdist worker, however tests interleave
def sim_run(sim_driver, tmp_path_factory):
    return sim.run_driver(sim_driver, tmp_path_factory.mktemp("cuda_sim"), CASES)


def test_every_kernel_matches_the_oracle_in_simulation(sim_run):
    sim.assert_all_passed(sim_run, CASES)


def test_the_split_and_the_tensor_cores_were_exercised(sim_run):
    """The split mode ran (the plan split) for most cases, and the mma choice ran the
    tensor-core kernel exactly where testing.on_tensor_cores says."""
    split = [key for key, (status, _) in sim_run.items() if key[2] == "split" and status == "ok"]
    assert len(split) >= len(KERNELS) * len(CASES) // 2, split
    for i, c in enumerate(CASES):
        dtype, _, nh, nkv = c[:4]
        want = "(tensor cores)" if testing.on_tensor_cores(dtype, nh, nkv) else ""
        for mode in MODES:
            status, note = sim_run[(cross.case_name(i, c), "mma", mode)]
            if status == "ok":
                assert note == want, (c, mode, note)


def test_a_pipeline_wait_one_short_is_caught(sim_driver, tmp_path):
    """The simulation's cp.async is in flight until its group is waited for (cuda_sim.h), so a
    pipeline that waits for one group too few reads its stages before they land and fails,
    in every mode that runs and on both cache forms, while the baseline (no cp.async) still
    passes: the copy model can fail, and it is what makes it fail."""
    cases = [CASES[1], CASES[15]]  # vLLM's layout (GQA 4, bf16, ALiBi), NHD (GQA 8)
    results = sim.run_driver(sim_driver, tmp_path, cases, env={"CUDA_SIM_WAIT_ONE_SHORT": "1"})
    ran = 0
    for i, c in enumerate(cases):
        for mode in MODES:  # the split mode is skipped where the plan does not split
            name = cross.case_name(i, c)
            baseline = results[(name, "baseline", mode)][0]
            assert baseline in ("ok", "SKIP"), (name, mode, results[(name, "baseline", mode)])
            if baseline == "ok":
                ran += 1
                for kernel in ("pipelined", "mma"):
                    assert results[(name, kernel, mode)][0] == "FAIL", (name, kernel, mode)
    assert ran >= 5, results


def test_every_kernel_passes_under_a_shuffled_schedule(sim_driver, tmp_path):
    """The same cases with the threads of each block run in a fresh random order at every round
    between barriers (CUDA_SIM_SCHEDULE): a kernel that relied on the simulation's thread order
    (a read of another lane's shared-memory write with no barrier between) fails here."""
    results = sim.run_driver(sim_driver, tmp_path, CASES,
                          env={"CUDA_SIM_SCHEDULE": "shuffle:20261203"})
    sim.assert_all_passed(results, CASES)


def test_caches_past_2_31_elements_in_simulation(sim_driver, tmp_path):
    """Every kernel with the cache blocks moved past element 2^31 of the caches (the driver's
    CUDA_SIM_FAR_BLOCKS: same data, block ids shifted, caches that reserve no memory): the
    cache offsets are 64-bit on every path (vLLM's layout with 16-bit and fp8 caches, NHD, the
    combined token-major layout with block size 5)."""
    cases = [CASES[1], CASES[8], CASES[15], CASES[17]]
    results = sim.run_driver(sim_driver, tmp_path, cases, env={"CUDA_SIM_FAR_BLOCKS": "1"})
    sim.assert_all_passed(results, cases)


@pytest.fixture(scope="session")  # built once per xdist worker, however tests interleave
def sim_selftest(tmp_path_factory):
    """tests/cuda_sim/sim_selftest.cpp: the simulation's own checks on tiny kernels."""
    exe = sim.build(tmp_path_factory.mktemp("cuda_sim_selftest"), "sim_selftest")

    def run(what, env=None):
        return subprocess.run([exe, what], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})
    return run


def test_the_simulation_shows_a_missing_barrier_only_under_a_shuffled_schedule(sim_selftest):
    """What the shuffled-schedule test above relies on: a read of another thread's write with no
    barrier between is right in thread order and wrong in a shuffled one."""
    in_order = sim_selftest("race")
    shuffled = sim_selftest("race", {"CUDA_SIM_SCHEDULE": "shuffle:20261203"})
    assert in_order.returncode == 0 and in_order.stdout.strip() == "race: 0 wrong", in_order
    assert shuffled.returncode == 0, shuffled
    assert int(shuffled.stdout.split()[1]) > 0, shuffled.stdout
    bad = sim_selftest("race", {"CUDA_SIM_SCHEDULE": "random"})
    assert bad.returncode == 2 and "want shuffle:<seed>" in bad.stderr, bad


def test_the_simulation_keeps_cp_async_in_flight_until_waited(sim_selftest):
    """copy16_async's destination is poisoned until wait_group retires the copy, then holds the
    source (zero past src-size); a thread that exits with a copy never waited for is an error."""
    ran = sim_selftest("async")
    assert ran.returncode == 0 and ran.stdout.strip() == "async: ok", ran
    exited = sim_selftest("async_exit")
    assert exited.returncode == 3, exited
    assert "cp.async copies never waited for" in exited.stderr, exited


def test_the_simulation_starts_every_block_with_nan_shared_memory(sim_selftest):
    """Static __shared__ objects are refilled with NaN before every block: a kernel that read
    what an earlier block left there (or relied on zero-initialised statics) would fail."""
    fresh = sim_selftest("smem_fresh")
    assert fresh.returncode == 0 and fresh.stdout.strip() == "smem_fresh: block 1 read NaN", fresh


def test_the_simulation_catches_a_write_past_dynamic_shared_memory(sim_selftest):
    """The guard bytes around a block's dynamic shared memory: one byte written past its end
    fails the launch (the kernels' rings and outputs live there)."""
    past = sim_selftest("smem_past")
    assert past.returncode == 3, past
    assert "a write outside the block's dynamic shared memory" in past.stderr, past


# Every head size and GQA tile the CUDA build compiles (the driver built with every shape: a
# compile of a few minutes, hence @slow).
ALL_SHAPE_CASES = [
    (F16, "auto", 4, 4, 32, 16, [1537, 3], True, None),  # head 32 (1 dim per lane), MHA
    (BF16, "auto", 4, 2, 32, 8, [600, 0], False, None),  # head 32, GQA 2 (tile 2)
    (F32, "auto", 6, 2, 192, 16, [513, 77], True, None),  # head 192 (6 dims per lane), GQA 3
    (BF16, "fp8_e4m3", 16, 2, 192, 16, [1100, 1], False, None),  # head 192, GQA 8, fp8
    (F16, "auto", 8, 1, 256, 16, [700, 33], False, None),  # head 256 (8 dims), GQA 8
    (BF16, "auto", 12, 2, 256, 5, [513, 9], True, "nhd"),  # head 256, GQA 6, block size 5
    (F32, "fp8_e5m2", 4, 2, 256, 16, [300, 1025], False, None),  # head 256, GQA 2
    (F16, "auto", 8, 4, 112, 16, [1537, 2], False, "hnd"),  # GQA 2 on a token-major cache
]


@pytest.mark.slow
def test_every_compiled_shape_matches_the_oracle_in_simulation(tmp_path):
    sim.assert_all_passed(sim.simulate(tmp_path, ALL_SHAPE_CASES, all_shapes=True), ALL_SHAPE_CASES)


# ---- reshape_and_cache / reshape_and_cache_flash (tests/cuda_sim/cache_driver.cpp) ----

CACHE_HEADER = ("scalar_kind", "cache_kind", "num_tokens", "num_kv_heads", "head_size",
                "block_size", "num_blocks", "kv_form", "x", "k_block_stride", "k_head_stride",
                "k_token_stride", "v_block_stride", "v_head_stride", "v_token_stride",
                "key_token_stride", "key_head_stride", "value_token_stride",
                "value_head_stride", "key_bytes", "value_bytes", "k_cache_bytes",
                "v_cache_bytes")
# (query dtype, kv_cache_dtype, layout: "vllm" or a testing.DECODE_LAYOUTS name)
CACHE_CASES = [
    (F32, "auto", "vllm"), (F16, "fp8_e4m3", "vllm"), (BF16, "fp8_e5m2", "vllm"),
    (BF16, "auto", "vllm"), (F16, "auto", "nhd"), (BF16, "fp8_e4m3", "hnd"),
    (F32, "fp8_e5m2", "combined"), (BF16, "auto", "mixed"), (F32, "auto", "padded"),
    (F16, "fp8_e4m3", "combined_hnd"),
]


def _cache_case(i, dtype, kv, layout):
    """(inputs for the op, the oracle's caches): key / value slices of a fused tensor (flash:
    more rows than slots, NaN in the extra rows), slots with padding (-1), caches holding random
    values (fp8: random bytes) that must stay where no slot writes, values large enough that fp8
    saturates."""
    g = torch.Generator().manual_seed(100 + i)
    token_major = layout != "vllm"
    num_tokens, kvh, nb = 29, 2, 9
    d, bs = (48, 5) if token_major else (64, 8)
    rows = num_tokens + (3 if token_major else 0)
    fused = torch.randn(rows, (1 + 2 * kvh) * d, generator=g) * 40
    fused[num_tokens:] = float("nan")
    fused = fused.to(dtype)
    key = fused[:, d:(1 + kvh) * d].view(rows, kvh, d)
    value = fused[:, (1 + kvh) * d:].view(rows, kvh, d)
    slots = torch.randperm(nb * bs, generator=g)[:num_tokens].to(torch.int64)
    slots[::6] = -1
    cache_dtype = dtype if kv == "auto" else torch.uint8
    def rand(*shape):
        if kv != "auto":
            return torch.randint(0, 256, shape, generator=g).to(torch.uint8)
        return torch.randn(*shape, generator=g).to(cache_dtype)

    if not token_major:
        x = key_chunk_elements(cache_dtype)
        kc, vc = rand(nb, kvh, d // x, bs, x), rand(nb, kvh, d, bs)
    else:
        kc, vc, _ = testing.nhd_cache_views(rand(nb, bs, kvh, d), rand(nb, bs, kvh, d), layout)
    op = "reshape_and_cache_flash" if token_major else "reshape_and_cache"
    k_scale, v_scale = (0.37, 1.9) if kv != "auto" else (1.0, 1.0)
    want_k, want_v = conformance.same_layout_copy(kc), conformance.same_layout_copy(vc)
    getattr(reference, op)(key, value, want_k, want_v, slots, kv, k_scale, v_scale)
    return (key, value, kc, vc, slots, kv, k_scale, v_scale, layout), (want_k, want_v)


def _write_cache_case(path, key, value, kc, vc, slots, kv, k_scale, v_scale, layout):
    token_major = layout != "vllm"
    ints = dict(
        scalar_kind=cross.SCALAR_KIND[key.dtype],
        cache_kind=cross.CACHE_KIND[parse_kv_cache_dtype("sim", kv)],
        num_tokens=slots.numel(), num_kv_heads=key.shape[1], head_size=key.shape[2],
        block_size=kc.shape[1] if token_major else vc.shape[3], num_blocks=kc.shape[0],
        kv_form=cross.KV_FORM["token_major" if token_major else "vllm"],
        x=0 if token_major else kc.shape[4],
        k_block_stride=kc.stride(0), k_head_stride=kc.stride(2 if token_major else 1),
        k_token_stride=kc.stride(1) if token_major else 0,
        v_block_stride=vc.stride(0), v_head_stride=vc.stride(2 if token_major else 1),
        v_token_stride=vc.stride(1) if token_major else 0,
        key_token_stride=key.stride(0), key_head_stride=key.stride(1),
        value_token_stride=value.stride(0), value_head_stride=value.stride(1))
    blobs = [cross.storage_bytes(t) for t in (key, value)]
    blobs.append(slots.contiguous().numpy().tobytes())
    blobs += [cross.storage_bytes(t) for t in (kc, vc)]
    ints.update(key_bytes=len(blobs[0]), value_bytes=len(blobs[1]), k_cache_bytes=len(blobs[3]),
                v_cache_bytes=len(blobs[4]))
    with open(path, "wb") as f:
        f.write(b"RCCASE1\0" + struct.pack(f"<{len(CACHE_HEADER)}q",
                                           *(ints[n] for n in CACHE_HEADER)))
        f.write(struct.pack("<2f", k_scale, v_scale))
        for blob in blobs:
            f.write(blob)


def _read_back(path, like):
    """The cache the driver wrote, seen through the same view as `like` (bytes from its first
    element)."""
    raw = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=like.dtype)
    return raw.as_strided(like.shape, like.stride(), 0)


@pytest.mark.parametrize("race_checked", [False, True], ids=["plain", "race_checked"])
def test_cache_writes_match_the_oracle_in_simulation(tmp_path, race_checked):
    """Race-checked: built with ThreadSanitizer (cuda_sim.h's race model), where no two threads
    may write one cache byte."""
    exe = (sim.race_checked_build if race_checked else sim.build)(tmp_path, "cache_driver")
    cases = []
    for i, (dtype, kv, layout) in enumerate(CACHE_CASES):
        args, want = _cache_case(i, dtype, kv, layout)
        path = str(tmp_path / f"{i:02d}-{str(dtype)[6:]}-{kv}-{layout}.rc")
        _write_cache_case(path, *args)
        cases.append((path, args, want))
    run = subprocess.run([exe, *(c[0] for c in cases)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, **TSAN_ENV})
    assert run.returncode == 0 and "ThreadSanitizer" not in run.stderr, run.stdout + run.stderr
    for path, args, (want_k, want_v) in cases:
        for suffix, want in ((".k.out", want_k), (".v.out", want_v)):
            got = _read_back(path + suffix, want)
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (
                f"{os.path.basename(path)}{suffix}: bytes differ from the oracle's")
