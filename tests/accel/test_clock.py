"""SimulatedAccelerator: submit is asynchronous, synchronize waits, utilisation is the busy share."""

from __future__ import annotations

import threading
import time

import pytest

from gpulab.accel.clock import SimulatedAccelerator


def test_submit_returns_at_once_and_synchronize_waits() -> None:
    acc = SimulatedAccelerator()
    t0 = time.perf_counter()
    ev = acc.submit(0.2)
    assert time.perf_counter() - t0 < 0.05  # the host did not wait
    assert not acc.query() and not ev.query()
    waited = acc.synchronize()
    assert waited > 0.1
    assert time.perf_counter() - t0 >= 0.2 - 1e-3
    assert acc.query() and ev.query()


def test_work_queues_back_to_back() -> None:
    acc = SimulatedAccelerator()
    first = acc.submit(0.05)
    second = acc.submit(0.05)
    assert second.time == pytest.approx(first.time + 0.05)
    assert first.elapsed_time(second) == pytest.approx(0.05)


def test_busy_time_counts_only_what_has_run() -> None:
    acc = SimulatedAccelerator()
    acc.submit(10.0)  # queued far into the future
    time.sleep(0.05)
    assert 0.04 <= acc.busy_time() <= 0.2
    assert acc.utilization() > 0.8


def test_utilization_of_a_half_busy_loop() -> None:
    acc = SimulatedAccelerator()
    t0 = time.perf_counter()
    for _ in range(5):
        acc.submit(0.02)  # device: 20 ms
        acc.synchronize()
        time.sleep(0.02)  # host-only work: device idle
    elapsed = time.perf_counter() - t0
    # all work was synchronised, so exactly 5 x 20 ms ran; the window is what the host measured
    # (sleep overshoot on a loaded machine lengthens the window, never the busy time)
    assert acc.busy_time() == pytest.approx(0.1, abs=1e-6)
    assert acc.utilization() == pytest.approx(0.1 / elapsed, rel=0.05)
    tl = acc.timeline()
    assert len(tl) == 5 and all(e - s == pytest.approx(0.02) for s, e in tl)


def test_speed_scales_cost_and_reset_forgets() -> None:
    acc = SimulatedAccelerator(speed=2.0)
    ev = acc.submit(0.1)
    assert ev.time - time.perf_counter() <= 0.051
    acc.reset()
    assert acc.busy_time() == 0.0 and acc.timeline() == []


def test_threads_share_one_queue() -> None:
    acc = SimulatedAccelerator()
    start = time.perf_counter()
    threads = [threading.Thread(target=acc.submit, args=(0.03,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    acc.synchronize()
    assert time.perf_counter() - start >= 0.12 - 1e-3


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_bad_cost(bad) -> None:
    with pytest.raises(ValueError, match="cost_s"):
        SimulatedAccelerator().submit(bad)


def test_bad_speed() -> None:
    with pytest.raises(ValueError, match="speed"):
        SimulatedAccelerator(speed=0)
