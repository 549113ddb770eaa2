"""gpulab.profiling.torch_trace: profile_loop recorded by torch.profiler.

The trace file is valid Chrome-trace JSON holding gpulab's labels once per recorded step; the
schedule keeps exactly its active steps; torch.profiler and profile_loop agree about the same run;
the readers of ``key_averages()`` give known answers on known events; bad paths fail before the
loop runs; ``python -m gpulab profile --trace``.
"""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import record_function

from gpulab.accel import HostAccelerator, SimAccelerator
from gpulab.profiling import profile_loop
from gpulab.profiling.loop import main
from gpulab.profiling.torch_trace import COMPUTE, COPY, DATA_WAIT, LABELS, TorchTrace, label_shares, top_ops


class SleepyLoader:
    """``n`` batches, each arriving after ``wait_s`` of sleep; counts how often it was iterated."""

    def __init__(self, n: int, wait_s: float = 0.0) -> None:
        self.n, self.wait_s, self.iterated = n, wait_s, 0

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        self.iterated += 1
        for _ in range(self.n):
            time.sleep(self.wait_s)
            yield torch.ones(4, 4)


def _annotations(path) -> Counter:
    trace = json.loads(path.read_text())  # valid JSON, or this raises
    return Counter(e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation")


def test_the_trace_file_is_json_with_every_label_once_per_recorded_step(tmp_path) -> None:
    path = tmp_path / "loop.json"
    trace = TorchTrace(path, wait=1, warmup=1, active=3)
    prof = profile_loop(SleepyLoader(5), lambda b: b @ b, HostAccelerator(), trace=trace, disable=True)
    assert trace.written == path and prof.num_steps == 3  # warmup_steps defaults to the trace's skip
    names = _annotations(path)
    assert {n: names[n] for n in LABELS} == {DATA_WAIT: 3, COPY: 3, COMPUTE: 3}
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#2", "ProfilerStep#3", "ProfilerStep#4"]
    trace_json = json.loads(path.read_text())
    assert any(e.get("name") == "aten::mm" for e in trace_json["traceEvents"]), "the step's own op is in the trace"
    assert not trace.cuda


def test_the_schedule_keeps_exactly_its_active_steps(tmp_path) -> None:
    calls = iter(range(100))

    def step_fn(batch):
        with record_function(f"mine/step{next(calls)}"):  # which step ran, visible in the trace
            return batch + 1

    trace = TorchTrace(tmp_path / "t.json", wait=2, warmup=1, active=2)
    profile_loop(SleepyLoader(7), step_fn, HostAccelerator(), trace=trace, warmup_steps=0, disable=True)
    assert list(trace.recorded_steps) == [3, 4]
    names = _annotations(tmp_path / "t.json")
    assert sorted(n for n in names if n.startswith("mine/")) == ["mine/step3", "mine/step4"]
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == ["ProfilerStep#3", "ProfilerStep#4"]
    counts = {e.key: e.count for e in trace.key_averages()}
    assert counts[COMPUTE] == 2 and counts["mine/step3"] == 1 and "mine/step5" not in counts


def test_torch_profiler_and_profile_loop_agree_about_the_same_run() -> None:
    def step_fn(batch):
        time.sleep(0.02)  # the host is the device: 20 ms of compute
        return batch.sum()

    trace = TorchTrace(None, wait=1, warmup=1, active=4)
    prof = profile_loop(SleepyLoader(6, wait_s=0.03), step_fn, HostAccelerator(), trace=trace, disable=True)
    shares = label_shares(trace.key_averages())
    assert abs(shares[DATA_WAIT] - prof.fractions["data"]) < 0.05, (shares, prof.fractions)
    assert abs(shares[COMPUTE] - prof.busy_fraction) < 0.05, (shares, prof.busy_fraction)
    assert 0.45 < shares[DATA_WAIT] < 0.75 and 0.25 < shares[COMPUTE] < 0.55  # 30 ms of 50, 20 of 50


def test_labels_reach_a_profiler_the_caller_runs() -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        profile_loop(SleepyLoader(3), lambda b: b * 2, SimAccelerator(), disable=True)
    counts = {e.key: e.count for e in p.key_averages()}
    assert all(counts.get(name) == 3 for name in LABELS), counts


def test_a_trace_needs_enough_steps() -> None:
    with pytest.raises(ValueError, match="needs 6 steps"):
        profile_loop(SleepyLoader(5), lambda b: b, HostAccelerator(), trace=TorchTrace(None, wait=1, warmup=2, active=3))


@pytest.mark.parametrize("where, error, words", [
    ("missing/t.json", FileNotFoundError, "mkdir -p"),
    ("", IsADirectoryError, "is a folder"),
])
def test_a_bad_trace_path_fails_before_the_loop_runs(tmp_path, where, error, words) -> None:
    loader = SleepyLoader(5)
    with pytest.raises(error, match=words):
        profile_loop(loader, lambda b: b, HostAccelerator(), trace=tmp_path / where)
    assert loader.iterated == 0, "nothing ran: no measurement lost to a typo"


@pytest.mark.parametrize("kwargs", [dict(active=0), dict(wait=-1), dict(warmup=1.5)])
def test_a_bad_schedule_is_refused(kwargs) -> None:
    with pytest.raises(ValueError, match="must be an int"):
        TorchTrace(None, **kwargs)


def _ev(key: str, self_us: float, total_us: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(key=key, self_cpu_time_total=self_us, cpu_time_total=self_us if total_us is None else total_us)


EVENTS = [_ev("ProfilerStep*", 50, 1000), _ev("forward", 10, 600), _ev("aten::add", 100), _ev("aten::mm", 300),
          _ev("backward", 5, 300), _ev("aten::convolution", 300), _ev("aten::relu", 20)]


def test_top_ops_are_aten_ops_by_self_time_in_ms() -> None:
    assert top_ops(EVENTS, 2) == [("aten::mm", 0.3), ("aten::convolution", 0.3)]  # ties keep the order
    assert [name for name, _ in top_ops(EVENTS, 10)] == ["aten::mm", "aten::convolution", "aten::add", "aten::relu"]
    with pytest.raises(ValueError, match="positive"):
        top_ops(EVENTS, 0)


def test_label_shares_divide_by_the_recorded_steps() -> None:
    assert label_shares(EVENTS, ["forward", "backward"]) == {"forward": 0.6, "backward": 0.3}
    with pytest.raises(ValueError, match="optimizer"):
        label_shares(EVENTS, ["forward", "optimizer"])
    with pytest.raises(ValueError, match="ProfilerStep"):
        label_shares(EVENTS[1:], ["forward"])


def _run_cli(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(args))
        except SystemExit as exit_:  # argparse's p.error
            rc = exit_.code
    return rc, out.getvalue() + err.getvalue()


def test_cli_writes_a_trace_of_the_demo_loop(tmp_path) -> None:
    path = tmp_path / "demo.json"
    rc, text = _run_cli("--steps", "5", "--batch-size", "2", "--sample-ms", "0.5", "--compute-ms", "1",
                        "--device", "sim", "--trace", str(path))
    assert rc == 0, text
    assert f"written to {path}" in text and "ui.perfetto.dev" in text
    names = _annotations(path)
    assert names[DATA_WAIT] == names[COMPUTE] == 3
    assert sorted(n for n in names if n.startswith("ProfilerStep#")) == [f"ProfilerStep#{k}" for k in (2, 3, 4)]


@pytest.mark.parametrize("args, words", [
    (["--trace", "/no/such/folder/t.json"], "does not exist"),
    (["--trace", "t.json", "--steps", "2"], "--steps >= 3"),
])
def test_cli_trace_errors_are_clear(args, words) -> None:
    rc, text = _run_cli(*args)
    assert rc == 2 and words in text, text


@pytest.mark.gpu
def test_cuda_kernels_are_recorded_on_a_gpu(tmp_path) -> None:
    from gpulab.accel.cuda import CudaAccelerator

    acc = CudaAccelerator("cuda:0")
    trace = TorchTrace(tmp_path / "gpu.json", wait=1, warmup=1, active=2)
    profile_loop(SleepyLoader(4), lambda b: b @ b, acc, trace=trace, disable=True)
    events = json.loads((tmp_path / "gpu.json").read_text())["traceEvents"]
    assert trace.cuda and any(e.get("cat") == "kernel" for e in events)
