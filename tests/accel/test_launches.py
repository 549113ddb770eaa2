"""gpulab.accel.launches: the simulated launch timeline against hand-worked numbers; a graph replay launches once."""

from __future__ import annotations

import pytest

from gpulab.accel.launches import LaunchCosts, capture, simulate_eager

COSTS = LaunchCosts(launch_s=8e-6, graph_launch_s=10e-6, graph_gap_s=1e-6)


def test_tiny_kernels_wait_for_their_launches() -> None:
    tl = simulate_eager([2e-6] * 10, COSTS)
    assert tl.seconds == pytest.approx(10 * 8e-6 + 2e-6)  # the device runs each kernel right after its launch
    assert tl.busy_fraction == pytest.approx(20e-6 / 82e-6)
    assert tl.device[1][0] - tl.device[0][1] == pytest.approx(6e-6)  # idle between launches


def test_long_kernels_hide_the_launches() -> None:
    tl = simulate_eager([50e-6] * 10, COSTS)
    assert tl.seconds == pytest.approx(8e-6 + 10 * 50e-6) and tl.busy_fraction > 0.98


def test_a_replay_is_one_launch_then_back_to_back_kernels() -> None:
    graph = capture([2e-6] * 10)
    tl = graph.replay(COSTS, steps=3)
    assert len(tl.host) == 3 and len(tl.device) == 30
    assert tl.seconds == pytest.approx(10e-6 + 3 * (10 * 2e-6 + 9 * 1e-6))  # replays queue behind each other
    assert tl.seconds < simulate_eager([2e-6] * 10, COSTS, steps=3).seconds / 2


def test_bad_input() -> None:
    with pytest.raises(ValueError):
        LaunchCosts(launch_s=-1)
    with pytest.raises(ValueError):
        simulate_eager([1e-6], COSTS, steps=0)
    with pytest.raises(ValueError):
        capture([-1.0])
