"""The benchmark's CUDA timing (paged_attention_ext/tools/bench/cuda_timing.py) on a simulated
GPU: the host's part of a call must stay out of the time, a head start too short for the host
must be noticed and lengthened, and a call that waits for the GPU must be reported as holding
host time. The simulation: one in-order stream; work enqueued at host time t starts at
max(t, when the GPU is free); an event completes when the GPU reaches it. Runs on any machine
(the real stream's spin and events only on a GPU: scripts/gpu/device_check.sh's bench step)."""

import pytest

import paged_attention_ext
from paged_attention_ext.tools.bench import cuda_timing, timing

ENQUEUE_MS = 0.004  # host time of one launch or event record in the simulation
FLUSH_MS = 0.03     # GPU time of the L2 flush


class SimGpu:
    def __init__(self):
        self.now = 0.0       # host clock, ms
        self.free_at = 0.0   # when the GPU finishes everything enqueued, ms
        self.spins = []      # head starts asked for, ms

    def clock(self) -> float:
        return self.now / 1e3

    def enqueue(self, gpu_ms: float) -> float:
        self.now += ENQUEUE_MS
        self.free_at = max(self.now, self.free_at) + gpu_ms
        return self.free_at

    def host(self, ms: float):
        self.now += ms

    def wait(self):
        self.now = max(self.now, self.free_at)

    def spin(self, ms: float):
        self.spins.append(ms)
        self.enqueue(ms)

    def flush(self):
        self.enqueue(FLUSH_MS)

    def event(self):
        return SimEvent(self)


class SimEvent:
    def __init__(self, gpu: SimGpu):
        self.gpu, self.at = gpu, None

    def record(self):
        self.at = self.gpu.enqueue(0.0)

    def query(self) -> bool:
        return self.at <= self.gpu.now

    def synchronize(self):
        self.gpu.now = max(self.gpu.now, self.at)

    def elapsed_time(self, end: "SimEvent") -> float:
        return end.at - self.at


def call(gpu: SimGpu, host_ms: float, kernels_ms: tuple, syncs: bool = False):
    """An op call: host work around each kernel launch (Python, checks), then, if `syncs`, a
    wait for the GPU (as a .item() does)."""
    def fn():
        for kernel_ms in kernels_ms:
            gpu.host(host_ms / (len(kernels_ms) + 1))
            gpu.enqueue(kernel_ms)
        gpu.host(host_ms / (len(kernels_ms) + 1))
        if syncs:
            gpu.wait()
    return fn


def naive_event_time(gpu: SimGpu, fn) -> float:
    """What the bench measured before the head start: flush, events around the call."""
    gpu.flush()
    begin, end = gpu.event(), gpu.event()
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def test_simulated_gpu_shows_the_problem():
    # the small-batch case: kernels of 8 + 2 us behind 0.1 ms of host time per call
    gpu = SimGpu()
    measured = naive_event_time(gpu, call(gpu, 0.1, (0.008, 0.002)))
    assert measured > 0.05  # mostly host time


def test_host_time_stays_out_of_the_gpu_time():
    gpu = SimGpu()
    timer = cuda_timing.GpuCallTimer(gpu, gpu.flush, gpu.clock)
    sample = timer(call(gpu, 0.1, (0.008, 0.002)))
    assert not sample.caught_up
    assert sample.gpu_ms == pytest.approx(0.010, abs=1e-9)  # the two kernels, nothing else
    assert sample.host_ms == pytest.approx(0.1 + 2 * ENQUEUE_MS)
    assert gpu.spins == [cuda_timing.INITIAL_HEAD_START_MS]


def test_a_short_head_start_is_found_and_lengthened():
    gpu = SimGpu()
    timer = cuda_timing.GpuCallTimer(gpu, gpu.flush, gpu.clock)
    slow_host = call(gpu, 2.0, (0.05,))  # 2 ms of host time: beyond the first head start
    sample = timer(slow_host)
    assert not sample.caught_up                       # the retry's interval is the GPU's
    assert sample.gpu_ms == pytest.approx(0.05, abs=1e-9)
    assert gpu.spins[0] == cuda_timing.INITIAL_HEAD_START_MS
    assert gpu.spins[1] >= cuda_timing.HEAD_START_GROWTH * 2.0  # grown past the host time
    again = timer(slow_host)                          # the longer head start is kept
    assert not again.caught_up and len(gpu.spins) == 3 and gpu.spins[2] == gpu.spins[1]


def test_a_call_that_waits_for_the_gpu_is_reported():
    gpu = SimGpu()
    plan = timing.TimingPlan(warmup=0, max_reps=5, min_reps=5, budget_s=0.0)
    result = timing.time_call(call(gpu, 0.1, (0.01,), syncs=True), "cuda", plan,
                              flusher=gpu.flush, clock=gpu.clock, gpu=gpu)
    assert result.reps == 5 and result.gpu_caught_up == 5
    assert len(gpu.spins) == 6  # one retry with a longer head start, then no more retries
    assert result.head_start_ms == gpu.spins[-1] > cuda_timing.INITIAL_HEAD_START_MS


def test_time_call_on_cuda_reports_gpu_and_host_medians():
    gpu = SimGpu()
    plan = timing.TimingPlan(warmup=1, max_reps=4, min_reps=4, budget_s=0.0)
    result = timing.time_call(call(gpu, 0.2, (0.3,)), "cuda", plan,
                              flusher=gpu.flush, clock=gpu.clock, gpu=gpu)
    assert result.reps == 4 and result.gpu_caught_up == 0
    assert result.median_ms == pytest.approx(0.3, abs=1e-9)
    assert result.host_median_ms == pytest.approx(0.2 + ENQUEUE_MS)
    assert result.as_dict()["host_median_ms"] == result.host_median_ms
    assert result.as_dict()["head_start_ms"] == cuda_timing.INITIAL_HEAD_START_MS  # enough


def test_cuda_tables_show_the_host_time(tmp_path):
    import json

    from paged_attention_ext.tools import cli
    from paged_attention_ext.tools.bench import report

    path = tmp_path / "b.json"
    assert cli.main(["bench", "--preset", "tiny", "--no-progress", "--bandwidth-mib", "32",
                     "--contenders", "ours-v2", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    cpu_table = report.to_markdown(data)
    assert report.HOST_COLUMN not in cpu_table and "ms = wall time" in cpu_table
    data["config"]["device"] = "cuda"  # as a CUDA run writes it: the host's median beside
    data["machine"]["cuda_settings"] = "kernel mma (PAGED_ATTN_CUDA_KERNEL=mma); split off"
    for row in data["results"]:
        row["timing"]["host_median_ms"] = 0.0421
    lines = report.to_markdown(data).splitlines()
    header = next(line for line in lines if line.startswith("| shape"))
    names = [cell.strip() for cell in header.strip("|").split("|")]
    assert names == list(report.columns("cuda"))
    assert names.index(report.HOST_COLUMN) == names.index("spread") + 1
    first = next(line for line in lines if "ours-v2" in line)
    assert first.split("|")[names.index(report.HOST_COLUMN) + 1].strip() == "0.042"
    assert any("host part kept out" in line for line in lines)
    # which CUDA kernel / split / reduce launch the table measured
    assert any("runs: " in line and line.endswith(
        "(kernel mma (PAGED_ATTN_CUDA_KERNEL=mma); split off)") for line in lines)


def test_cuda_settings_without_cuda_kernels():
    from paged_attention_ext.tools.bench import machine

    build = paged_attention_ext.build_info()
    if build and build["cuda"]:
        got = machine.cuda_settings()
        assert got == (f"kernel {build['cuda_attention_kernel']}; split {build['cuda_split']}; "
                       f"reduce PDL {build['cuda_pdl']}")
    else:
        assert machine.cuda_settings() == "no CUDA kernels compiled"


def test_spin_is_calibrated_once_per_device(monkeypatch):
    # torch.cuda's part the real stream uses, over the simulated GPU: _sleep spins at 1.5 GHz
    import types

    gpu = SimGpu()
    slept = []

    def sleep(cycles):
        slept.append(cycles)
        gpu.enqueue(cycles / 1.5e6)

    cuda = types.SimpleNamespace(_sleep=sleep, current_device=lambda: 0,
                                 Event=lambda enable_timing: SimEvent(gpu))
    monkeypatch.setattr(cuda_timing, "_cycles_per_ms", {})
    stream = cuda_timing.TorchCudaGpu(types.SimpleNamespace(cuda=cuda))
    stream.spin(0.5)
    calibration = slept[:-1]
    assert len(calibration) == 3 and slept[-1] == pytest.approx(0.5 * 1.5e6, rel=0.01)
    stream.spin(2.0)
    cuda_timing.TorchCudaGpu(types.SimpleNamespace(cuda=cuda)).spin(2.0)
    assert len(slept) == 6 and slept[-1] == slept[-2] == pytest.approx(2.0 * 1.5e6, rel=0.01)


def test_a_caught_up_call_is_named_in_the_row(monkeypatch, tmp_path):
    import json

    from paged_attention_ext.tools import cli
    from paged_attention_ext.tools.bench import runner

    def caught_up_timing(*args, **kwargs):
        return timing.Timing(1.0, 1.0, 1.0, 1.0, 1.0, 3, host_median_ms=0.5, gpu_caught_up=2)

    monkeypatch.setattr(runner, "time_call", caught_up_timing)
    path = tmp_path / "b.json"
    assert cli.main(["bench", "--preset", "tiny", "--no-progress", "--bandwidth-mib", "32",
                     "--contenders", "ours-v2", "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    assert rows and all("the GPU waited for the host in 2 of 3 timed calls" in r["note"]
                        for r in rows)
