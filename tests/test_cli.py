"""The command users run: `python -m paged_attention_ext info|check|bench` (and cli.main).

Runs in well under a minute: one subprocess each for info and bench (the bench re-execs itself to
set OMP_WAIT_POLICY), the rest in-process on the `tiny` preset.
"""

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest
import torch

import paged_attention_ext
from paged_attention_ext import reference, schemas
from paged_attention_ext.tools import backends, cli, selfcheck
from paged_attention_ext.tools.backends import Backend
from paged_attention_ext.tools.bench import contenders, presets, runner, timing
from paged_attention_ext.tools.bench.workload import make_workload

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_module(*args, env_extra=None, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "paged_attention_ext", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


# ---- info ----

def test_info_subprocess_names_backends():
    proc = _run_module("info")
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout
    assert "CPU backend" in proc.stdout and "CUDA backend" in proc.stdout
    expected_cpu = ("compiled kernel" if backends.compiled_kernel("v2", "CPU")
                    else "PyTorch fallback")
    assert expected_cpu in proc.stdout
    assert torch.backends.cpu.get_cpu_capability() in proc.stdout


def test_info_in_process(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    for op in backends.OPS:
        assert f"paged_attn::{op}" in out


def test_kernel_info_tells_this_build_from_python():
    """C++ exactly where build_info() says _C registered the op under that key; the package's
    Python fakes (Meta) and fallback (CompositeExplicitAutograd) are Python."""
    build = paged_attention_ext.build_info()
    for op in ("v2", "v2.scale_tensor", "decode"):
        for key in ("CPU", "CUDA"):
            ours = build is not None and op in build["registered_kernels"].get(key, [])
            info = backends.kernel_info(op, key)
            assert (info.registered and info.origin == "C++") == ours, (op, key, info)
        assert backends.kernel_info(op, "Meta") == backends.KeyInfo(True, "Python")
        assert backends.kernel_info(op, "CompositeExplicitAutograd").origin == "Python"
    assert not backends.kernel_info("no_such_op", "CPU").registered
    # a build that registered nothing: every kernel is someone else's
    assert backends.kernel_info("v2", "Meta", {"registered_kernels": {}}).origin == "Python"


# ---- check ----

def test_check_in_process_passes(capsys):
    assert cli.main(["check", "--cases", "2", "--seed", "1234"]) == 0
    out = capsys.readouterr().out
    assert "seed 1234" in out and "OK:" in out


class _WrongOps:
    """v2 right but out off by a little in one head; v1 drops the last token; cache writes
    nothing. Each must be caught."""

    @staticmethod
    def v1(out, query, key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens,
           *rest):
        shorter = (seq_lens - 1).clamp(min=0)
        reference.paged_attention_v1(out, query, key_cache, value_cache, num_kv_heads, scale,
                                     block_tables, shorter, *rest)

    @staticmethod
    def v2(out, *args):
        reference.paged_attention_v2(out, *args)
        out[:, -1] += 1e-2

    @staticmethod
    def reshape_and_cache(*args):
        pass

    @staticmethod
    def decode(out, query, key_cache, value_cache, block_tables, seq_lens, *rest):
        # reads one KV head too few: wrong for every GQA group but the first
        reference.decode(out, query, key_cache, value_cache.roll(1, dims=2), block_tables,
                         seq_lens, *rest)

    @staticmethod
    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest):
        reference.reshape_and_cache_flash(value, key, key_cache, value_cache, slot_mapping, *rest)


def test_check_fails_on_a_wrong_backend(monkeypatch, capsys):
    wrong = Backend("wrong", "cpu", _WrongOps, "test double")
    monkeypatch.setattr(selfcheck, "active_backends", lambda: [wrong])
    assert cli.main(["check", "--cases", "1", "--seed", "7"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    for op in schemas.OP_NAMES:  # every op's wrong implementation is caught
        assert any(re.search(rf"\b{op}\b", line) and "FAIL:" in line
                   for line in out.splitlines()), (op, out)


def test_check_covers_every_op():
    assert [op for op, _ in selfcheck.CHECKS] == list(schemas.OP_NAMES)


def test_check_fails_when_an_op_raises(monkeypatch, capsys):
    class Raising:
        def v1(*a):
            raise RuntimeError("boom")
        v2 = reshape_and_cache = decode = reshape_and_cache_flash = v1

    monkeypatch.setattr(selfcheck, "active_backends",
                        lambda: [Backend("raising", "cpu", Raising, "")])
    assert cli.main(["check", "--cases", "1", "--seed", "3"]) == 1
    assert "RuntimeError: boom" in capsys.readouterr().out


def test_check_with_no_backend_fails(monkeypatch):
    monkeypatch.setattr(selfcheck, "active_backends", lambda: [])
    assert cli.main(["check", "--cases", "1"]) == 1


# ---- bench ----

def _assert_positive_finite(value):
    assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, value


def test_bench_subprocess_json_and_plot(tmp_path):
    json_path, png_path = tmp_path / "bench.json", tmp_path / "bench.png"
    proc = _run_module("bench", "--preset", "tiny", "--no-progress", "--json", str(json_path),
                       "--plot", str(png_path), "--bandwidth-mib", "64")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(json_path.read_text())
    assert data["machine"]["omp_wait_policy"] == "PASSIVE"  # set by the re-exec
    assert data["machine"]["cpu_threads_rule"] == (  # what that policy makes our kernel do
        "one per 4096 KiB of K/V (idle OpenMP threads sleep: OMP_WAIT_POLICY=passive)"
        if paged_attention_ext.extension_loaded()
        else "no compiled kernel")
    assert data["config"]["mode"] == "quick"
    _assert_positive_finite(data["bandwidth"]["read_gbps"])
    _assert_positive_finite(data["bandwidth"]["copy_gbps"])
    assert data["bandwidth"]["buffer_bytes"] == 64 << 20
    samples = data["bandwidth"]["samples"]  # before and after the kernels; the best is used
    assert len(samples) == 2
    assert data["bandwidth"]["read_gbps"] == max(s["read_gbps"] for s in samples)
    shapes = presets.preset_shapes(["tiny"], full=False, device="cpu")
    names = contenders.default_contenders("cpu")
    assert len(data["results"]) == len(shapes) * len(names)
    for row in data["results"]:
        s = row["shape"]
        # K and V of every token once + q + out, fp32.
        assert row["bytes"] == 4 * (2 * s["batch"] * s["ctx"] * s["kv_heads"] * s["head"]
                                    + 2 * s["batch"] * s["heads"] * s["head"])
        assert row["correct"] is True
        for key in ("median_ms", "gbps", "pct_of_read_bw", "speedup", "vs_oracle"):
            _assert_positive_finite(row[key])
        assert row["timing"]["reps"] >= 3
        assert row["timing"]["min_ms"] <= row["median_ms"] <= row["timing"]["max_ms"]
        assert row["gbps"] == pytest.approx(row["bytes"] / row["median_ms"] / 1e6)
        assert row["pct_of_read_bw"] == pytest.approx(
            100 * row["gbps"] / data["bandwidth"]["read_gbps"])
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gather-sdpa" in proc.stdout and "fallback" in proc.stdout  # the table
    by_name = {r["contender"]: r for r in data["results"] if r["label"] == shapes[0].label}
    assert by_name["oracle"]["vs_oracle"] == pytest.approx(1.0)
    assert by_name["fallback"]["vs_oracle"] == pytest.approx(
        by_name["oracle"]["median_ms"] / by_name["fallback"]["median_ms"])


def test_bench_custom_shape_fp8_bf16(tmp_path, capsys):
    json_path = tmp_path / "b.json"
    argv = ["bench", "--shape", "batch=2,heads=6,kv_heads=2,head=32,ctx=40/530,block=8",
            "--dtype", "bfloat16", "--kv-cache-dtype", "fp8_e5m2", "--no-progress",
            "--contenders", "ours-v2,ours-v1,gather-sdpa,sdpa-dense", "--json", str(json_path),
            "--bandwidth-mib", "32"]
    assert cli.main(argv) == 0
    rows = json.loads(json_path.read_text())["results"]
    assert [r["shape"]["ctx"] for r in rows] == [40] * 4 + [530] * 4
    for row in rows:
        assert row["correct"] is True, row
        s = row["shape"]
        assert row["bytes"] == (2 * s["batch"] * s["ctx"] * s["kv_heads"] * s["head"]  # fp8: 1 B
                                + 2 * 2 * s["batch"] * s["heads"] * s["head"])        # bf16 q, out


def test_bench_wrong_contender_exits_nonzero(monkeypatch, capsys):
    right = contenders.CONTENDERS["ours-v2"]

    def prepare_wrong(work):
        run = right.prepare(work)
        return lambda: run() * 1.01

    wrong = contenders.Contender("ours-v2", True, prepare_wrong, "scaled output")
    monkeypatch.setitem(contenders.CONTENDERS, "ours-v2", wrong)
    code = cli.main(["bench", "--preset", "tiny", "--no-progress", "--contenders", "ours-v2",
                     "--bandwidth-mib", "32"])
    captured = capsys.readouterr()
    assert code == 1
    assert "FAIL" in captured.out and "INCORRECT" in captured.err


def test_bench_contender_that_raises_is_a_failure(monkeypatch, capsys, tmp_path):
    def prepare_raising(work):
        def run():
            raise RuntimeError("unsupported head size")
        return run

    monkeypatch.setitem(contenders.CONTENDERS, "gather-sdpa",
                        contenders.Contender("gather-sdpa", False, prepare_raising, "raises"))
    json_path = tmp_path / "b.json"
    code = cli.main(["bench", "--preset", "tiny", "--no-progress", "--bandwidth-mib", "32",
                     "--contenders", "ours-v2,gather-sdpa", "--json", str(json_path)])
    assert code == 1
    rows = json.loads(json_path.read_text())["results"]
    raised = [r for r in rows if r["contender"] == "gather-sdpa"]
    assert raised and all(r["correct"] is False and "unsupported head size" in r["note"]
                          for r in raised)
    assert all(r["correct"] is True for r in rows if r["contender"] == "ours-v2")


def test_bench_usage_errors(capsys):
    assert cli.main(["bench", "--shape", "heads=6,kv_heads=4"]) == 2
    assert cli.main(["bench", "--preset", "tiny", "--contenders", "nope"]) == 2
    assert cli.main(["bench", "--shape", "head=36", "--dtype", "bfloat16"]) == 2  # x = 8
    err = capsys.readouterr().err
    assert "divisible" in err and "nope" in err and "multiple of x = 8" in err
    with pytest.raises(SystemExit):
        cli.main(["bench", "--quick", "--full"])
    with pytest.raises(SystemExit):  # zero cases would check nothing and call it a failure
        cli.main(["check", "--cases", "0"])
    assert "--cases: must be at least 1, got 0" in capsys.readouterr().err
    # A number that is not one names its option.
    assert cli.main(["bench", "--shape", "ctx=abc"]) == 2
    assert cli.main(["bench", "--blocksparse", "local=x,vert=8"]) == 2
    err = capsys.readouterr().err
    assert "--shape ctx: 'abc' is not a whole number" in err
    assert "--blocksparse local: 'x' is not a whole number" in err
    # An output path that cannot be written: refused before the run, not after it.
    for option in ("--json", "--markdown", "--plot"):
        assert cli.main(["bench", "--preset", "tiny", option, "/no/such/folder/out.x"]) == 2
        assert "cannot write /no/such/folder/out.x" in capsys.readouterr().err


def test_cuda_regime_presets_parse():
    """The regimes of docs/CUDA.md's performance model, one shape each, quick == full."""
    shapes = {n: presets.preset_shapes([n], full=False, device="cuda")
              for n in presets.CUDA_REGIMES}
    assert all(len(v) == 1 for v in shapes.values())
    assert all(presets.preset_shapes([n], full=True, device="cuda") == shapes[n]
               for n in presets.CUDA_REGIMES)
    dims = {n: (s.batch, s.heads, s.kv_heads, s.head, s.ctx) for n, (s,) in shapes.items()}
    assert dims == {"big-batch": (64, 32, 8, 128, 4096), "small-batch": (8, 32, 8, 128, 1024),
                    "gqa8": (32, 64, 8, 128, 4096), "tp8-kv1": (128, 8, 1, 128, 4096),
                    "long": (1, 32, 8, 128, 100_000)}
    assert set(presets.CUDA_ONLY) <= set(presets.PRESET_NAMES)
    assert set(presets.CUDA_DEFAULT) >= set(presets.CPU_DEFAULT)


@pytest.mark.parametrize("name", presets.CUDA_ONLY)
def test_cuda_only_preset_refused_on_cpu(name, capsys):
    with pytest.raises(ValueError, match="--device cuda only"):
        presets.preset_shapes(["tiny", name], full=False, device="cpu")
    # the CLI turns it into a usage error (exit 2) before building anything
    assert cli.main(["bench", "--device", "cpu", "--preset", name, "--no-progress"]) == 2
    assert f"preset {name!r} is for --device cuda only" in capsys.readouterr().err


def test_cpu_presets_are_allowed_on_cpu():
    assert presets.preset_shapes(presets.CPU_DEFAULT + ("small-batch", "tiny"), full=False,
                                 device="cpu")


def test_dense_sdpa_names_its_backend():
    work = make_workload(presets.parse_shape("batch=2,heads=4,kv_heads=2,head=32,ctx=40")[0],
                         torch.float32, "auto", "cpu")
    run = contenders.CONTENDERS["sdpa-dense"].prepare(work)
    assert run.note == "SDPA backend: torch's choice"  # flash is only forced on CUDA
    rows = runner.run_bench(runner.BenchConfig(
        device="cpu", dtype=torch.float32, kv_cache_dtype="auto",
        shapes=presets.parse_shape("batch=2,heads=4,kv_heads=2,head=32,ctx=40"),
        contenders=("sdpa-dense",), bandwidth_bytes=1 << 20)).rows
    assert rows[0]["correct"] is True and rows[0]["note"] == "SDPA backend: torch's choice"


def test_parse_shape():
    shapes = presets.parse_shape("batch=3,heads=8,kv_heads=2,head=64,ctx=1k/4k/100k,block=32")
    assert [s.ctx for s in shapes] == [1024, 4096, 100_000]
    assert {(s.batch, s.heads, s.kv_heads, s.head, s.block) for s in shapes} == {(3, 8, 2, 64, 32)}
    assert presets.parse_shape("ctx=300")[0].heads == 32  # Llama-3-8B defaults
    with pytest.raises(ValueError, match="key=value"):
        presets.parse_shape("batch=2,depth=3")
    with pytest.raises(ValueError, match="positive"):
        presets.parse_shape("batch=0")


def test_workload_tables_are_shuffled_and_distinct():
    work = make_workload(presets.parse_shape("batch=4,heads=4,kv_heads=2,head=32,ctx=200")[0],
                         torch.float32, "auto", "cpu", seed=5)
    ids = work.block_tables.flatten()
    assert ids.unique().numel() == ids.numel()  # no block shared between sequences
    assert not torch.equal(ids.sort().values, ids)  # not laid out in order
    assert int(ids.max()) < work.key_cache.shape[0]


def test_time_call_measures_wall_time():
    plan = timing.TimingPlan(warmup=1, max_reps=5, min_reps=3, budget_s=0.0)
    result = timing.time_call(lambda: time.sleep(0.004), "cpu", plan, flusher=lambda: None)
    assert result.reps == 3
    assert 4.0 <= result.median_ms < 200.0
    assert result.min_ms <= result.q1_ms <= result.median_ms <= result.q3_ms <= result.max_ms


def test_time_call_with_cpu_time_leaves_sleep_out():
    # process_time counts CPU time only: a sleeping call costs next to nothing (the clock is used)
    plan = timing.TimingPlan(warmup=0, max_reps=3, min_reps=3, budget_s=0.0)
    result = timing.time_call(lambda: time.sleep(0.02), "cpu", plan, timing.no_flush,
                              clock=time.process_time)
    assert result.reps == 3 and result.median_ms < 10.0


def test_fallback_v1_contender_matches_the_oracle(tmp_path):
    json_path = tmp_path / "b.json"
    assert cli.main(["bench", "--preset", "tiny", "--no-progress", "--bandwidth-mib", "32",
                     "--contenders", "fallback-v1", "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())["results"]
    assert rows and all(r["contender"] == "fallback-v1" and r["correct"] is True for r in rows)


@pytest.mark.parametrize("script", ["bench_cpu.py", "bench_fallback.py"])
def test_bench_scripts_load_the_harness(script):
    """The scripts are thin callers of tools/bench: their imports must follow it."""
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "bench", script), "--help"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "usage" in proc.stdout


def test_speedups_use_vllms_pick():
    rows = [{"contender": "ours-v1", "median_ms": 2.0}, {"contender": "ours-v2", "median_ms": 4.0},
            {"contender": "oracle", "median_ms": 10.0}, {"contender": "gather-sdpa",
                                                         "median_ms": None}]
    runner._add_speedups(rows, "v1")
    assert [r["speedup"] for r in rows] == [1.0, 2.0, 5.0, None]
    assert rows[0]["speedup_ref"] == "ours-v1"


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_bench_kv_layouts_read_the_same_bytes(tmp_path, kv_cache_dtype):
    """--kv-layout nhd / hnd race decode (ours, fallback, oracle) on the same shapes and bytes as
    v1 / v2 on vLLM's layout, every contender checked against the oracle."""
    rows_by_layout = {}
    for layout in ("vllm", "nhd", "hnd"):
        json_path = tmp_path / f"{layout}.json"
        argv = ["bench", "--shape", "batch=2,heads=6,kv_heads=2,head=48,ctx=37/600,block=8",
                "--kv-layout", layout, "--kv-cache-dtype", kv_cache_dtype, "--no-progress",
                "--json", str(json_path), "--bandwidth-mib", "16"]
        assert cli.main(argv) == 0
        data = json.loads(json_path.read_text())
        assert data["config"]["kv_layout"] == layout
        rows_by_layout[layout] = data["results"]
        names = {r["contender"] for r in data["results"]}
        assert names == set(contenders.default_contenders("cpu", layout))
        assert ("ours-decode" in names) == (layout != "vllm")
        assert not names & {"ours-v1", "ours-v2"} or layout == "vllm"
        for row in data["results"]:
            assert row["correct"] is True, row
        ours = [r for r in data["results"] if r["contender"] == "ours-decode"]
        assert all(r["speedup"] == pytest.approx(1.0) for r in ours)
    bytes_of = {layout: sorted({(r["label"], r["bytes"]) for r in rows})
                for layout, rows in rows_by_layout.items()}
    assert bytes_of["nhd"] == bytes_of["hnd"] == bytes_of["vllm"]


def test_workload_hnd_is_a_transposed_view():
    shape = presets.parse_shape("batch=2,heads=4,kv_heads=2,head=32,ctx=50,block=16")[0]
    work = make_workload(shape, torch.float32, "auto", "cpu", seed=1, kv_layout="hnd")
    num_blocks = work.key_cache.shape[0]
    assert work.key_cache.shape == (num_blocks, 16, 2, 32)  # NHD order, as decode takes it
    assert work.key_cache.stride() == (16 * 2 * 32, 32, 16 * 32, 1)  # stored [blocks, h, bs, d]
    with pytest.raises(ValueError, match="kv_layout"):
        make_workload(shape, torch.float32, "auto", "cpu", kv_layout="nchw")


def test_bench_blocksparse_counts_only_the_blocks_read(tmp_path):
    """--blocksparse: v1 / v2 / fallback / oracle compute it (checked against the oracle), the
    dense contenders say they cannot, and the bytes are those of the attended blocks only."""
    shape = "batch=2,heads=8,kv_heads=2,head=32,ctx=700,block=16"
    results = {}
    spec = "local=2,vert=4,block=32,step=0"
    for name, extra in (("dense", []), ("sparse", ["--blocksparse", spec])):
        json_path = tmp_path / f"{name}.json"
        argv = ["bench", "--shape", shape, "--no-progress", "--json", str(json_path),
                "--bandwidth-mib", "16",
                "--contenders", "ours-v2,ours-v1,fallback,oracle,gather-sdpa", *extra]
        assert cli.main(argv) == 0
        results[name] = json.loads(json_path.read_text())
    sparse = {r["contender"]: r for r in results["sparse"]["results"]}
    dense = {r["contender"]: r for r in results["dense"]["results"]}
    assert results["sparse"]["config"]["blocksparse"]["vert_stride"] == 4
    for name in ("ours-v2", "ours-v1", "fallback", "oracle"):
        assert sparse[name]["correct"] is True, sparse[name]
    assert sparse["gather-sdpa"]["note"] == "does not compute blocksparse attention"
    assert sparse["gather-sdpa"]["median_ms"] is None
    assert 0 < sparse["ours-v2"]["bytes"] < dense["ours-v2"]["bytes"]
    assert "gather-sdpa" not in contenders.default_contenders("cpu", "vllm", blocksparse=True)


def test_workload_blocksparse_bytes_match_the_definition():
    # 2 query heads per KV head, sliding step 1: each KV head reads the union of its heads'
    # blocks, counted here independently from vLLM's rule written out per block
    shape = presets.parse_shape("batch=1,heads=4,kv_heads=2,head=32,ctx=200,block=16")[0]
    work = make_workload(shape, torch.float32, "auto", "cpu", blocksparse=(0, 1, 4, 32, 1))
    q_blk = (200 - 1) // 32
    read = 0
    for kv_head in range(2):
        for b in range((200 + 15) // 16):
            k_blk = b * 16 // 32
            attended = any(q_blk - k_blk < 1 or (k_blk + h + 1) % 4 == 0
                           for h in (2 * kv_head, 2 * kv_head + 1))
            read += attended * min(16, 200 - 16 * b)
    assert work.kv_tokens_read() == read < 2 * 200


@pytest.mark.parametrize("spec,match", [("local=2,vert=1", "vert must be > 1"),
                                        ("local=2,width=3", "bad item"),
                                        ("vert=4,block=0", "blocksparse_block_size")])
def test_bench_blocksparse_bad_spec(spec, match):
    args = cli._parser().parse_args(["bench", "--blocksparse", spec])
    with pytest.raises(ValueError, match=match):
        cli._bench_config(args)
