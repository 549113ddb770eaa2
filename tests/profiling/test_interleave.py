"""gpulab.profiling.interleave: the one interleaved timer. Its arithmetic is that of the recorded
numbers, it rotates who goes first, and on a fake clock (each variant advances it by a known amount)
every figure it reports is known exactly. No test depends on machine speed.
"""

from __future__ import annotations

import types

import pytest

from gpulab.profiling import interleave
from gpulab.profiling.interleave import SpeedComparison, Timings, compare_speed, time_interleaved


class FakeClock:
    """``perf_counter`` and ``process_time`` that move only when a variant says so."""

    def __init__(self) -> None:
        self.wall = self.cpu = 100.0

    def advance(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu

    def install(self, monkeypatch) -> None:
        fake_time = types.SimpleNamespace(perf_counter=lambda: self.wall, process_time=lambda: self.cpu)
        monkeypatch.setattr(interleave, "time", fake_time)


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    c = FakeClock()
    c.install(monkeypatch)
    return c


def test_timings_arithmetic_is_that_of_the_recorded_numbers():
    t = Timings(wall={"a": [2.0, 4.0, 3.0], "b": [1.0, 1.0, 2.0]}, cpu={"a": [2.0, 4.0, 3.0], "b": [2.0, 2.0, 4.0]})
    assert t.median("a") == 3.0 and t.median("b") == 1.0
    assert t.speedup("a", "b") == 3.0
    assert t.cores("a") == 1.0 and t.cores("b") == 2.0
    assert "3000.0 ms" in t.table() and "2.00 cores" in t.table()


def test_time_interleaved_rotates_the_order_and_checks_its_arguments():
    calls = []
    timings = time_interleaved({n: (lambda n=n: calls.append(n)) for n in "abc"}, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert all(len(timings.wall[n]) == 3 and len(timings.cpu[n]) == 3 for n in "abc")
    with pytest.raises(ValueError, match="repeats >= 1"):
        time_interleaved({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="at least one variant"):
        time_interleaved({})


def test_each_call_is_timed_on_the_clock(clock) -> None:
    # "a" takes 0.3 s on one core; "b" takes 0.1 s using two cores (0.2 s of CPU time)
    timings = time_interleaved({"a": lambda: clock.advance(0.3, 0.3), "b": lambda: clock.advance(0.1, 0.2)},
                               repeats=4, warmup=2)
    assert timings.wall["a"] == pytest.approx([0.3] * 4) and timings.wall["b"] == pytest.approx([0.1] * 4)
    assert timings.cpu["b"] == pytest.approx([0.2] * 4)
    assert timings.speedup("a", "b") == pytest.approx(3.0)
    assert timings.cores("a") == pytest.approx(1.0) and timings.cores("b") == pytest.approx(2.0)


def test_compare_speed_on_a_fake_clock(clock) -> None:
    calls = {"baseline": 0, "candidate": 0}

    def work(name: str, seconds: float):
        def run() -> None:
            calls[name] += 1
            clock.advance(seconds, seconds)
        return run

    cmp = compare_speed(work("baseline", 0.5), work("candidate", 0.125), repeats=3, warmup=2)
    assert isinstance(cmp, SpeedComparison)
    assert (cmp.baseline_s, cmp.candidate_s) == pytest.approx((0.5, 0.125))
    assert cmp.speedup == pytest.approx(4.0) and "speedup 4.00x" in str(cmp)
    assert calls == {"baseline": 5, "candidate": 5}  # 2 warm-up calls + 3 timed ones each
    with pytest.raises(ValueError, match="repeats >= 1"):
        compare_speed(work("baseline", 0.5), work("candidate", 0.125), repeats=0)


def test_a_median_ignores_one_slow_outlier(clock) -> None:
    costs = iter([0.1, 0.1, 5.0, 0.1, 0.1])  # one call hit a busy moment
    timings = time_interleaved({"a": lambda: clock.advance(next(costs), 0.0)}, repeats=5, warmup=0)
    assert timings.median("a") == pytest.approx(0.1)
    assert Timings(wall={"x": [1.0, 3.0]}, cpu={"x": [1.0, 1.0]}).median("x") == 2.0


def test_time_interleaved_calls_before_each_untimed_before_every_call(monkeypatch):
    from gpulab.profiling import interleave

    clock = [0.0]  # a fake clock: the barrier takes 100 s, a variant 1 s
    monkeypatch.setattr(interleave, "time", types.SimpleNamespace(perf_counter=lambda: clock[0],
                                                                  process_time=lambda: clock[0]))

    def variant(name):
        calls.append(name)
        clock[0] += 1.0

    def barrier():
        calls.append("|")
        clock[0] += 100.0

    calls = []
    timings = time_interleaved({n: (lambda n=n: variant(n)) for n in "ab"}, repeats=2, warmup=1, before_each=barrier)
    assert calls == ["|", "a", "|", "b", "|", "a", "|", "b", "|", "b", "|", "a"]
    assert timings.wall == {"a": [1.0, 1.0], "b": [1.0, 1.0]}, "the barrier's time is not the variant's"


def test_time_interleaved_times_queued_gpu_work_not_its_launch(monkeypatch) -> None:
    """A variant that only launches 30 ms of kernels used to time at about 0 s."""
    from fake_queue import FakeQueue

    queue = FakeQueue(monkeypatch)
    timings = time_interleaved({"gpu": lambda: queue.launch(0.03), "idle": lambda: None}, repeats=2, warmup=0)
    assert min(timings.wall["gpu"]) >= 0.03 and max(timings.wall["idle"]) < 0.03
    assert len(queue.syncs) == 2 * 2 * 2 * 2  # before and after each of 4 calls, on both devices in use


def test_a_measured_check_here_or_for_the_grader_waits_for_queued_gpu_work(monkeypatch) -> None:
    from fake_queue import FakeQueue

    from gpulab.evidence import wire
    from gpulab.grading import measured

    queue = FakeQueue(monkeypatch)
    m, _ = measured.measure_here(lambda seed: queue.launch(0.03), 0)
    assert m.wall_s >= 0.03
    ident = measured.register_measured(lambda seed: queue.launch(0.03, device=1))
    monkeypatch.setattr(wire, "emit", lambda record: None)
    measured.run_measured(ident, 1)
    assert queue.pending[1] == 0.0  # done before the reply that stops the grader's clock
