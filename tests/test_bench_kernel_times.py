"""`bench --kernel-times` (paged_attention_ext/tools/bench/kernel_times.py): kernel names
shortened, a profile cut into calls at the flush's and spin's kernels, per-call sums, spans
and per-kernel medians; the rows and tables that carry them. The profiler itself records CUDA
kernels only on a GPU (scripts/gpu/device_check.sh's bench_kernels steps); here it is fed events."""

import json

import pytest

from paged_attention_ext.tools import cli
from paged_attention_ext.tools.bench import kernel_times, report, runner
from paged_attention_ext.tools.bench.kernel_times import DeviceEvent

ATTENTION = ("void paged_attn::cuda::paged_attention_pipelined_kernel<__nv_bfloat16, 0, 4, 4, "
             "32, 4, 1>(paged_attn::PagedAttentionParams)")
REDUCE = ("void paged_attn::cuda::paged_attention_v2_reduce_kernel<__nv_bfloat16, 32, 4, 256>"
          "(paged_attn::PagedAttentionParams)")
FLUSH = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
         "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::"
         "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, "
         "4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
         "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::"
         "{lambda(float, float)#1}>, unsigned int, float, 4, 4>)")
SPIN = "at::cuda::(anonymous namespace)::spin_kernel(long)"


@pytest.mark.parametrize("name, short", [
    (ATTENTION, "paged_attention_pipelined_kernel"),
    (REDUCE, "paged_attention_v2_reduce_kernel"),
    (FLUSH, "reduce_kernel"),
    (SPIN, "spin_kernel"),
    ("Memset (Device)", "Memset"),
    ("flash_fwd_splitkv_kernel", "flash_fwd_splitkv_kernel"),
])
def test_short_names(name, short):
    assert kernel_times.short_name(name) == short


def _profile(calls_us):
    """Device events of calls given as [(name, start, end), ...] lists, each after a flush and
    a spin, in shuffled order (the profiler does not promise start order)."""
    events, t = [], 0.0
    for call in calls_us:
        events += [DeviceEvent(FLUSH, t, t + 30.0), DeviceEvent(SPIN, t + 30.0, t + 280.0)]
        events += [DeviceEvent(name, t + 280.0 + a, t + 280.0 + b) for name, a, b in call]
        t += 1000.0
    return events[::-1]


def test_calls_are_cut_at_the_markers_and_summarised():
    markers = {"reduce_kernel", "spin_kernel"}
    calls = kernel_times.split_calls(_profile([
        [(ATTENTION, 0.0, 10.0), (REDUCE, 12.0, 15.0)],   # 13 us of kernels over 15 us
        [(ATTENTION, 0.0, 12.0), (REDUCE, 13.0, 16.0)],   # 15 over 16
        [(ATTENTION, 0.0, 9.0), (REDUCE, 11.0, 13.0)],    # 11 over 13
    ]), markers)
    assert [len(c) for c in calls] == [2, 2, 2]
    times = kernel_times.summarise(calls)
    assert times.kernel_ms == pytest.approx(0.013)
    assert times.span_ms == pytest.approx(0.015)
    assert times.kernels_per_call == 2
    assert times.by_kernel == pytest.approx({"paged_attention_pipelined_kernel": 0.010,
                                             "paged_attention_v2_reduce_kernel": 0.003})
    assert times.summary() == ("paged_attention_pipelined_kernel 0.010 + "
                               "paged_attention_v2_reduce_kernel 0.003 ms")


def test_a_profile_with_no_kernels_of_the_call():
    calls = kernel_times.split_calls(_profile([[], []]), {"reduce_kernel", "spin_kernel"})
    assert calls == []
    assert kernel_times.summarise(calls).summary() == "no kernels"


def _fake_profile_kernels(fn, flusher, spin, calls=kernel_times.CALLS):
    fn()
    return kernel_times.summarise([[DeviceEvent(ATTENTION, 0.0, 40.0),
                                    DeviceEvent(REDUCE, 41.0, 43.0)]])


def _bench_rows(tmp_path, monkeypatch, profile):
    """An in-process CPU bench with kernel_times on (the CLI allows it on CUDA only) and the
    profiler replaced: what the rows and the table get."""
    monkeypatch.setattr(kernel_times, "profile_kernels", profile)
    monkeypatch.setattr("paged_attention_ext.tools.bench.cuda_timing.TorchCudaGpu",
                        lambda: None)
    args = cli._parser().parse_args(
        ["bench", "--preset", "tiny", "--contenders", "ours-v2,oracle", "--bandwidth-mib", "32"])
    config = cli._bench_config(args)
    config.kernel_times = True
    result = runner.run_bench(config)
    data = report.to_dict(result, {"date": "d", "gpu": "a GPU", "torch": "t",
                                   "torch_threads": 1, "cpu_capability": "c",
                                   "omp_wait_policy": "PASSIVE", "op_backend": "C++ kernel"})
    data["config"]["device"] = "cuda"  # the table as a CUDA run prints it
    return data


def test_rows_and_tables_carry_the_kernel_times(tmp_path, monkeypatch):
    data = _bench_rows(tmp_path, monkeypatch, _fake_profile_kernels)
    ours = [r for r in data["results"] if r["contender"] == "ours-v2"]
    assert ours and all(r["kernel_times"]["kernel_ms"] == pytest.approx(0.042) for r in ours)
    assert all("kernel_times" not in r for r in data["results"] if r["contender"] == "oracle")
    json.dumps(data)  # the JSON file holds them
    lines = report.to_markdown(data).splitlines()
    header = next(line for line in lines if line.startswith("| shape"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    assert names == list(report.columns("cuda", kernel_times=True))
    row = next(line for line in lines if "ours-v2" in line).split("|")
    assert row[names.index(report.KERNEL_COLUMN) + 1].strip() == "0.042"
    assert "paged_attention_pipelined_kernel 0.040 + paged_attention_v2_reduce_kernel" in row[-2]


def test_a_failing_profiler_leaves_the_timing(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("CUPTI unavailable")

    data = _bench_rows(tmp_path, monkeypatch, broken)
    ours = [r for r in data["results"] if r["contender"] == "ours-v2"]
    assert ours and all(r["median_ms"] and r["kernel_times"] is None for r in ours)
    assert "kernel times: RuntimeError: CUPTI unavailable" in report.to_markdown(data)


def test_kernel_times_need_cuda(capsys):
    assert cli.main(["bench", "--device", "cpu", "--kernel-times", "--preset", "tiny"]) == 2
    assert "--kernel-times" in capsys.readouterr().err
