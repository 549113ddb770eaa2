"""profile_loop recovers known injected waits; bad input gets clear errors; the verdict's advice.

The injected-wait tests run on a *virtual clock*: ``perf_counter`` and ``sleep`` in
``gpulab.accel.clock``, ``gpulab.accel`` and ``gpulab.profiling`` are replaced by a clock that only
moves when something sleeps (or spins). Every host operation then takes no time, every wait takes
exactly what was injected, and the expected fractions are known analytically whatever the load
on the machine. One smoke test runs the same kind of loop on the real clock.
"""

from __future__ import annotations

import json
import time

import matplotlib
import pytest
import torch
from torch.utils.data import DataLoader

import gpulab.accel
import gpulab.accel.base
import gpulab.accel.clock
import gpulab.accel.host
import gpulab.accel.sim
import gpulab.profiling
import gpulab.profiling.loop
from gpulab.accel import Accelerator, HostAccelerator, SimAccelerator
from gpulab.accel.cuda import CudaAccelerator
from gpulab.profiling import bottleneck, profile_loop
from gpulab.profiling.loop import main
from gpulab.profiling.workloads import BusyDataset, demo_loader, demo_step

matplotlib.use("Agg")


TOL = 0.05


class VirtualClock:
    """``perf_counter`` / ``sleep`` on virtual time; each reading advances it by 1 us so that a
    busy loop (``spin``) ends."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        self.now += 1e-6
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch) -> VirtualClock:
    c = VirtualClock()
    monkeypatch.setattr(gpulab.accel.clock, "time", c)
    for module in (gpulab.accel.base, gpulab.accel.sim, gpulab.accel.host):
        monkeypatch.setattr(module, "time", c)
    monkeypatch.setattr(gpulab.profiling.loop, "perf_counter", c.perf_counter)
    return c


class SleepyLoader:
    """``num_batches`` batches; each takes ``wait_s`` of host time to arrive (no len())."""

    def __init__(self, num_batches: int, wait_s: float, batch: torch.Tensor | None = None, sleep=time.sleep) -> None:
        self.num_batches, self.wait_s, self.sleep = num_batches, wait_s, sleep
        self.batch = batch if batch is not None else torch.zeros(8, 4, dtype=torch.uint8)

    def __iter__(self):
        for _ in range(self.num_batches):
            self.sleep(self.wait_s)
            yield self.batch


def _step(accel, compute_s: float, sync: bool = False):
    def step_fn(batch):
        loss = accel.compute(compute_s, batch)
        if sync:
            loss.item()  # a host-device sync every step
    return step_fn


def _recovers(prof, expected: dict[str, float], bound: str):
    got = {k: (prof.busy_fraction if k == "busy" else prof.fractions[k]) for k in expected}
    bad = {k: round(v, 4) for k, v in got.items() if abs(v - expected[k]) > TOL}
    assert not bad and prof.bound == bound, f"expected {bound}-bound with {expected} +- {TOL}; got {prof.bound}, {got}"
    return prof


def test_data_bound_loop_recovers_fractions(clock) -> None:
    acc = SimAccelerator()
    # the device computes 10 ms while the host waits 40 ms for each batch
    loader = SleepyLoader(12, 0.040, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.010), acc, num_steps=12, disable=True),
                     {"busy": 120 / 490, "data": 480 / 490}, "data")  # + the last 10 ms of compute
    assert prof.verdict.startswith("data-bound")
    assert "num_workers" in prof.verdict  # a plain iterable: advice to use a DataLoader with workers


def test_sync_bound_loop_recovers_fractions(clock) -> None:
    acc = SimAccelerator()
    # per step: 20 ms data (device idle) + 40 ms compute the host waits for = 60 ms
    loader = SleepyLoader(10, 0.020, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.040, sync=True), acc, num_steps=10, disable=True),
                     {"data": 1 / 3, "sync": 2 / 3, "busy": 2 / 3}, "sync")
    assert ".item()" in prof.verdict
    assert prof.step_s == pytest.approx([0.060] * 10, abs=1e-3)


def test_removing_the_sync_makes_the_same_loop_compute_bound(clock) -> None:
    acc = SimAccelerator()
    # without a sync (and with copies that do not wait for the queue) the host runs ahead: it
    # prepares batch i+1 while the device computes batch i, so only the first 20 ms are idle;
    # the host's 10 x 20 ms of data wait fill half of the 420 ms, the rest is the final drain
    loader = SleepyLoader(10, 0.020, sleep=clock.sleep)
    _recovers(profile_loop(loader, _step(acc, 0.040), acc, num_steps=10, non_blocking=True, disable=True),
              {"busy": 400 / 420, "data": 200 / 420, "sync": 0.0}, "compute")


def test_a_blocking_copy_waits_for_the_queue_and_counts_as_sync(clock) -> None:
    acc = SimAccelerator()
    # steps 1..9 find 20 ms of the previous step's compute still queued when they copy
    loader = SleepyLoader(10, 0.020, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.040), acc, num_steps=10, disable=True),
                     {"busy": 400 / 420, "data": 200 / 420, "sync": 180 / 420}, "compute")
    assert prof.sync_s[1:] == pytest.approx([0.020] * 9, abs=1e-3) and prof.copy_s.max() < 1e-3


def test_copy_bound_loop_recovers_fractions(clock) -> None:
    acc = SimAccelerator(h2d_gb_per_s=0.2)
    batch = torch.zeros(8_000_000, dtype=torch.uint8)  # 8 MB at 0.2 GB/s: a 40 ms blocking copy
    loader = SleepyLoader(8, 0.020, batch, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.020), acc, num_steps=8, disable=True),
                     {"copy": 320 / 480, "data": 160 / 480, "busy": 160 / 480}, "copy")
    assert "uint8" in prof.verdict


class UncountedSim(SimAccelerator):
    """The simulated device read as a CUDA one is: no count of the host's waits, and one busy
    interval per step from its events (Accelerator's defaults), on the virtual clock."""

    def waited(self) -> None:
        return None

    def busy_intervals(self, steps, t_start, t_end):
        return Accelerator.busy_intervals(self, steps, t_start, t_end)


@pytest.mark.parametrize("sync, expected, bound", [
    (True, {"data": 1 / 3, "sync": 2 / 3, "busy": 2 / 3}, "sync"),  # as test_sync_bound_loop_recovers_fractions
    (False, {"busy": 400 / 420, "data": 200 / 420, "sync": 0.0}, "compute"),  # the host runs ahead
])
def test_without_a_count_of_waits_the_sync_is_inferred_from_events(clock, sync, expected, bound) -> None:
    acc = UncountedSim()
    loader = SleepyLoader(10, 0.020, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.040, sync=sync), acc, num_steps=10, non_blocking=True,
                                  disable=True), expected, bound)
    # copy, sync and host work split the host's time from the batch's arrival to step_fn's return
    copy_and_step = prof.host_times[:, 3] - prof.host_times[:, 1]
    assert prof.copy_s + prof.sync_s + prof.host_s == pytest.approx(copy_and_step, abs=1e-9)


def test_host_clock_mode_counts_step_time_as_compute(clock) -> None:
    acc = HostAccelerator()
    loader = SleepyLoader(8, 0.020, sleep=clock.sleep)
    prof = _recovers(profile_loop(loader, _step(acc, 0.030), "cpu", num_steps=8, disable=True),
                     {"busy": 0.6, "data": 0.4}, "data")
    assert prof.mode == "host" and prof.fractions["sync"] == 0.0


def test_real_clock_smoke_sync_bound() -> None:
    """The same measurement on the real clock; loose bounds, since a shared machine stalls sleepers."""
    acc = SimAccelerator()
    prof = profile_loop(SleepyLoader(8, 0.020), _step(acc, 0.040, sync=True), acc, num_steps=8, disable=True)
    assert prof.bound == "sync" and prof.fractions["sync"] > 0.4 and 0.3 < prof.busy_fraction < 0.75


def test_dataloader_workers_batch_size_and_timeline() -> None:
    acc = SimAccelerator()
    loader = demo_loader(num_batches=6, batch_size=4, sample_cost_s=0.001)
    prof = profile_loop(loader, demo_step(acc, 0.002), acc, disable=True)
    assert prof.num_steps == 6 and prof.num_workers == 0 and prof.batch_size == 4
    assert prof.step_s.sum() == pytest.approx(prof.wall_s)
    lanes = prof.timeline()
    assert len(lanes["device: compute"]) == 6 and all(e - s == pytest.approx(0.002) for s, e in lanes["device: compute"])
    assert bottleneck.busy_fraction(lanes["device: compute"], 0, prof.wall_s) == pytest.approx(prof.busy_fraction)
    assert prof.throughput == pytest.approx(24 / prof.wall_s)
    fig = prof.plot()
    assert len(fig.axes) == 2
    assert "verdict" in prof.summary() and json.dumps(prof.to_dict())


def test_epochs_reiterate_the_loader_and_warmup_is_left_out() -> None:
    acc = SimAccelerator()
    prof = profile_loop([torch.ones(2)] * 3, _step(acc, 0.001), acc, epochs=2, warmup_steps=1, disable=True)
    assert prof.num_steps == 5 and prof.epochs == 2


def test_warmup_backlog_does_not_leak_into_the_window(clock) -> None:
    acc = SimAccelerator()
    # the host (5 ms per batch) runs ahead of the device (20 ms per step): after 10 warm-up steps
    # 150 ms of work is still queued; the window must not count it against the next 10 steps
    loader = SleepyLoader(20, 0.005, sleep=clock.sleep)
    prof = profile_loop(loader, _step(acc, 0.020), acc, num_steps=20, warmup_steps=10, non_blocking=True, disable=True)
    assert prof.num_steps == 10
    assert prof.wall_s == pytest.approx(0.005 + 10 * 0.020, abs=1e-3)
    assert prof.busy_fraction == pytest.approx(0.200 / 0.205, abs=1e-3)


def test_num_steps_larger_than_the_loader_is_refused_up_front() -> None:
    loader = DataLoader(BusyDataset(8, 0.0), batch_size=4)
    with pytest.raises(ValueError, match=r"num_steps=5 but the loader gives only 2 batches"):
        profile_loop(loader, lambda b: None, "sim", num_steps=5, disable=True)


def test_a_loader_that_runs_out_early_is_named() -> None:
    with pytest.raises(ValueError, match=r"stopped after 3 batches but num_steps=5"):
        profile_loop(SleepyLoader(3, 0.0), lambda b: None, "sim", num_steps=5, disable=True)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_num_steps_must_be_a_positive_int(bad) -> None:
    with pytest.raises(ValueError, match="num_steps must be a positive int"):
        profile_loop([1, 2], lambda b: None, "sim", num_steps=bad, disable=True)


def test_no_len_and_no_num_steps() -> None:
    with pytest.raises(ValueError, match="pass num_steps"):
        profile_loop(SleepyLoader(2, 0.0), lambda b: None, "sim", disable=True)


def test_a_step_function_that_raises_shows_the_step_number() -> None:
    def step_fn(batch):
        if batch == 3:
            raise KeyError("label")

    with pytest.raises(KeyError) as info:
        profile_loop([0, 1, 2, 3, 4], step_fn, "sim", disable=True)
    assert any("step_fn raised at step 3" in note for note in info.value.__notes__)


def test_a_loader_that_raises_shows_the_batch_number() -> None:
    def broken():
        yield torch.ones(1)
        raise OSError("disk gone")

    with pytest.raises(OSError) as info:
        profile_loop(broken(), lambda b: None, "sim", num_steps=2, disable=True)
    assert any("fetching batch 1" in note for note in info.value.__notes__)


def test_step_fn_using_another_accelerator_is_reported() -> None:
    mine, other = SimAccelerator(), SimAccelerator()
    prof = profile_loop([1, 2], _step(other, 0.001), mine, disable=True)
    assert prof.verdict.startswith("no device work seen")


def test_cli_prints_json() -> None:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["--steps", "4", "--batch-size", "2", "--sample-ms", "1", "--compute-ms", "2", "--json"]) == 0
    rep = json.loads(out.getvalue())
    assert rep["num_steps"] == 4 and rep["mode"] in ("simulated", "cuda") and "verdict" in rep


@pytest.mark.gpu
def test_cuda_events_time_a_known_kernel() -> None:
    acc = CudaAccelerator("cuda:0")
    prof = profile_loop(SleepyLoader(8, 0.020), _step(acc, 0.040, sync=True), acc, num_steps=8, disable=True)
    for key, expected in (("sync", 2 / 3), ("data", 1 / 3)):
        assert abs(prof.fractions[key] - expected) <= TOL, (key, prof.fractions)
    assert abs(prof.busy_fraction - 2 / 3) <= TOL and prof.bound == "sync"
