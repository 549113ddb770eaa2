"""gpulab.accel.base: ``spin`` and ``wait_until`` hold the host for the time asked (lower bounds only:
a loaded machine can make them later, never earlier), and the Accelerator interface's defaults."""

from __future__ import annotations

import time

import pytest

from gpulab.accel import HostAccelerator, SimAccelerator
from gpulab.accel.base import Accelerator, spin, wait_until


def test_spin_keeps_the_host_for_the_time_asked_and_uses_the_cpu() -> None:
    w0, c0 = time.perf_counter(), time.process_time()
    spin(0.03)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    assert wall >= 0.03 and cpu > 0  # a busy loop, unlike time.sleep
    t0 = time.perf_counter()
    spin(0.0)
    spin(-1.0)
    assert time.perf_counter() - t0 < 0.5


def test_wait_until_returns_at_the_deadline_with_the_seconds_waited() -> None:
    t0 = time.perf_counter()
    waited = wait_until(t0 + 0.03)
    t1 = time.perf_counter()
    assert t1 >= t0 + 0.03 and 0.03 - 1e-3 <= waited <= t1 - t0 + 1e-6
    assert wait_until(time.perf_counter() - 1.0) < 0.01  # a deadline in the past: no wait


class _Events(Accelerator):
    """An accelerator whose events are plain times, for the default arithmetic."""

    kind, name = "test", "test:0"

    def synchronize(self) -> None:
        self.synced = True

    def event_time(self, event: float) -> float:
        return event


def test_the_interface_defaults() -> None:
    acc = _Events()
    assert acc.busy_between(1.0, 3.5) == 2.5 and acc.copy_between(1.0, 3.5) == 2.5
    assert acc.busy_between(3.0, 1.0) == 0.0  # never negative
    assert acc.waited() is None and not acc.simulated and repr(acc) == "<_Events test:0>"
    acc.begin()
    assert acc.synced  # begin() drains the queue first
    for method, args in (("compute", (0.1,)), ("copy", ({},)), ("record", ())):
        with pytest.raises(NotImplementedError):
            getattr(Accelerator(), method)(*args)
    assert SimAccelerator().simulated and not HostAccelerator().simulated
