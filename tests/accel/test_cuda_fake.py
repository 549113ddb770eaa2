"""gpulab.accel.cuda on a fake CUDA clock (no GPU here): the device's busy time is its kernels' own
time, not the span of a step, so idle gaps between kernels do not count as busy."""

from __future__ import annotations

import contextlib

import torch

from gpulab.accel.base import StepMarks
from gpulab.accel.cuda import CudaAccelerator


class FakeDevice:
    """A device clock in seconds: a kernel runs from when it is launched (or the device frees up)
    for its length; ``idle`` moves the launch point later (a host that launches late)."""

    def __init__(self) -> None:
        self.free_at = 0.0
        self.launch_at = 0.0

    def idle(self, seconds: float) -> None:
        self.launch_at = max(self.launch_at, self.free_at) + seconds

    def run(self, seconds: float) -> None:
        start = max(self.free_at, self.launch_at)
        self.free_at = self.launch_at = start + seconds


def _fake_accelerator(monkeypatch) -> tuple[CudaAccelerator, FakeDevice]:
    device = FakeDevice()

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.t = 0.0

        def record(self, stream=None) -> None:
            self.t = max(device.free_at, device.launch_at)

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, other) -> float:
            return (other.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: device.run(cycles / 1e9))
    accel = object.__new__(CudaAccelerator)  # no GPU to open: the clock is all this test needs
    accel.torch_device, accel.name = torch.device("cuda", 0), "cuda:0 (fake)"
    accel._cycles_per_s, accel._anchor, accel._anchor_t, accel._kernels = 1e9, None, 0.0, []
    return accel, device


def test_an_idle_gap_between_two_kernels_is_not_busy(monkeypatch) -> None:
    accel, device = _fake_accelerator(monkeypatch)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: None)  # compute's scalar "loss" on the device
    accel.begin()
    copy_end = accel.record()
    accel.compute(0.010)
    device.idle(0.030)  # the host launches the second kernel 30 ms after the first ended
    accel.compute(0.010)
    step_end = accel.record()
    assert abs(accel.busy_between(copy_end, step_end) - 0.020) < 1e-9  # the span would say 0.050
    marks = StepMarks(0.0, 0.0, 0.0, 0.05, None, None, copy_end, copy_end, step_end)
    got = accel.busy_intervals([marks], accel._anchor_t, accel._anchor_t + 0.05)
    assert [(round(s, 6), round(e, 6)) for s, e in got] == [(0.0, 0.01), (0.04, 0.05)]


def test_a_step_without_a_spin_kernel_falls_back_to_its_span(monkeypatch) -> None:
    accel, device = _fake_accelerator(monkeypatch)
    accel.begin()
    copy_end = accel.record()
    device.run(0.005)  # work queued by other torch code in step_fn: not bracketed
    step_end = accel.record()
    assert abs(accel.busy_between(copy_end, step_end) - 0.005) < 1e-9


def _step(accel, copied: float, returned: float, copy_end, step_end) -> StepMarks:
    t0 = accel._anchor_t
    return StepMarks(t0 + copied, t0 + copied, t0 + copied, t0 + returned, None, None, copy_end, copy_end, step_end)


def test_a_launch_bound_step_is_not_read_as_a_sync(monkeypatch) -> None:
    """Five 1 ms kernels, each launched 4 ms after the last one ended: the host is the bottleneck, and
    it returns as the last kernel ends. The base inference called all 21 ms a sync."""
    accel, device = _fake_accelerator(monkeypatch)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: None)
    accel.begin()
    copy_end = accel.record()
    for k in range(5):
        if k:
            device.idle(0.004)
        accel.compute(0.001)
    step_end = accel.record()
    wait = accel.step_wait(_step(accel, 0.0, 0.021, copy_end, step_end))
    assert wait <= 0.001 + 1e-9  # at most the last kernel
    assert abs(accel.busy_between(copy_end, step_end) - 0.005) < 1e-9


def test_a_step_that_waits_for_its_one_long_kernel_is_a_sync(monkeypatch) -> None:
    accel, device = _fake_accelerator(monkeypatch)
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: None)
    accel.begin()
    copy_end = accel.record()
    accel.compute(0.020)  # launched at once; then loss.item() waits for it
    step_end = accel.record()
    assert abs(accel.step_wait(_step(accel, 0.0, 0.0202, copy_end, step_end)) - 0.020) < 1e-6
