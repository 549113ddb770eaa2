"""gpulab.parallel.pipeline.bubble: the bubble formula, the bubble measured on an ideal timeline, and a
timeline replayed with free hand-offs against schedules built by hand (known delays, known imbalance)."""

from __future__ import annotations

import pytest

from gpulab.parallel import StageEvent, bubble_fraction, measured_bubble
from gpulab.parallel.pipeline import handoff_delays, replay


def test_bubble_fraction():
    assert bubble_fraction(1, 5) == 0
    assert bubble_fraction(2, 1) == pytest.approx(0.5)
    assert bubble_fraction(2, 8) == pytest.approx(1 / 9)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    for bad in [(0, 2), (2, 0), (2.0, 3), (True, 3)]:
        with pytest.raises(ValueError):
            bubble_fraction(*bad)


@pytest.mark.parametrize("stages,micro", [(2, 1), (2, 8), (3, 5), (4, 16)])
def test_measured_bubble_of_an_ideal_timeline_is_the_formula(stages, micro):
    ideal = [StageEvent(s, j, "forward", float(s + j), float(s + j + 1)) for s in range(stages) for j in range(micro)]
    assert measured_bubble(ideal) == pytest.approx(bubble_fraction(stages, micro))
    back = [StageEvent(s, j, "backward", 100.0 + (stages - 1 - s) + j, 101.0 + (stages - 1 - s) + j)
            for s in range(stages) for j in range(micro)]
    assert measured_bubble(ideal + back) == pytest.approx(bubble_fraction(stages, micro))
    with pytest.raises(ValueError):
        measured_bubble([])


def _gpipe(durations: dict[int, float], micro: int, delay: float = 0.0, phase: str = "forward") -> list[StageEvent]:
    """A two-stage pass as the schedule runs it: stage s takes durations[s] per micro-batch, and each
    hand-off from the first stage of the pass to the second costs ``delay``."""
    first, second = (0, 1) if phase == "forward" else (1, 0)
    events, free = [], {first: 0.0, second: 0.0}
    for j in range(micro):
        a = StageEvent(first, j, phase, free[first], free[first] + durations[first])
        start = max(a.end + delay, free[second])
        b = StageEvent(second, j, phase, start, start + durations[second])
        free[first], free[second] = a.end, b.end
        events += [a, b]
    return events


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_replay_removes_the_hand_off_delays_and_keeps_the_imbalance(phase):
    assert measured_bubble(replay(_gpipe({0: 1.0, 1: 1.0}, 6, phase=phase))) == pytest.approx(bubble_fraction(2, 6))
    # the second stage of the pass takes 0.5 per micro-batch, so it waits for every hand-off: each
    # delay of 0.25 shows, and the replay (free hand-offs) keeps only the imbalance: the pass lasts
    # M + 0.5, the stages are busy 1.5 M of 2 (M + 0.5)
    slow_handoffs = _gpipe({0: 1.0, 1: 0.5} if phase == "forward" else {1: 1.0, 0: 0.5}, 6, delay=0.25, phase=phase)
    assert handoff_delays(slow_handoffs) == pytest.approx([0.25] * 6)
    imbalance = 1 - 1.5 * 6 / (2 * (6 + 0.5))
    assert measured_bubble(slow_handoffs) > imbalance + 0.01
    assert measured_bubble(replay(slow_handoffs)) == pytest.approx(imbalance)
    assert handoff_delays(replay(slow_handoffs)) == pytest.approx([0.0] * 6)


def test_replay_keeps_each_phase_where_it_started_and_every_event():
    fwd = _gpipe({0: 1.0, 1: 1.0}, 3, delay=0.5)
    bwd = [StageEvent(e.stage, e.micro_batch, "backward", e.start + 100, e.end + 100)
           for e in _gpipe({0: 2.0, 1: 2.0}, 3, delay=0.5, phase="backward")]
    out = replay(fwd + bwd)
    assert sorted((e.phase, e.stage, e.micro_batch) for e in out) == sorted(
        (e.phase, e.stage, e.micro_batch) for e in fwd + bwd)
    assert min(e.start for e in out if e.phase == "backward") == 100.0
    assert all(e.duration == pytest.approx(o.duration) for e, o in zip(
        sorted(out, key=lambda e: (e.phase, e.stage, e.micro_batch)),
        sorted(fwd + bwd, key=lambda e: (e.phase, e.stage, e.micro_batch))))
    with pytest.raises(ValueError):
        replay([])
