"""gpulab.profiling.result: a LoopProfile built by hand from known per-step times gives the fractions,
throughput, bound, timeline and JSON numbers worked out by hand.

The made-up loop: 4 steps of 100 ms; each waits 60 ms for data, copies for 10 ms, runs the step
function for 10 ms (launching 20 ms of device work), and 20 ms go elsewhere (the loop itself).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpulab.profiling import LoopProfile, bottleneck


def _profile(mode: str = "simulated", batch_size: int | None = 8) -> LoopProfile:
    starts = np.arange(4) * 0.1
    # on the host device step_fn itself does the 20 ms of compute, so its span ends at 100 ms
    step_end = 0.10 if mode == "host" else 0.08
    host_times = np.stack([starts, starts + 0.06, starts + 0.07, starts + step_end], axis=1)
    return LoopProfile(
        mode=mode, device="sim:0", step_s=np.full(4, 0.1), data_s=np.full(4, 0.06), copy_s=np.full(4, 0.01),
        sync_s=np.zeros(4), host_s=np.full(4, 0.01), compute_s=np.full(4, 0.02), host_times=host_times,
        device_intervals=[(s + 0.08, s + 0.10) for s in starts], wall_s=0.4, num_workers=0, cpu_count=8,
        batch_size=batch_size)


def test_fractions_throughput_and_bound_are_the_hand_figures() -> None:
    prof = _profile()
    assert prof.num_steps == 4 and prof.busy_fraction == pytest.approx(0.2)
    assert prof.fractions == pytest.approx({"data": 0.6, "copy": 0.1, "sync": 0.0, "host": 0.1, "other": 0.2,
                                            "compute": 0.2})
    assert prof.steps_per_s == pytest.approx(10.0) and prof.throughput == pytest.approx(80.0)
    assert _profile(batch_size=None).throughput == pytest.approx(10.0)  # steps/s without a batch size
    assert prof.bound == "data" == bottleneck.classify(0.2, prof.fractions)
    assert prof.verdict == bottleneck.verdict(0.2, prof.fractions, 0, 8, device_work_seen=True)
    assert prof.verdict.startswith("data-bound")


def test_on_the_host_the_compute_is_not_other_time() -> None:
    prof = _profile(mode="host")
    assert prof.fractions["other"] == pytest.approx(0.0)  # the 20 ms per step were the host computing, not other


def test_timeline_lanes_come_from_the_host_marks() -> None:
    lanes = _profile().timeline()
    assert list(lanes) == ["host: data wait", "host: copy", "host: step_fn", "device: compute"]
    assert lanes["host: data wait"][1] == pytest.approx((0.1, 0.16))
    assert lanes["host: copy"][2] == pytest.approx((0.26, 0.27))
    assert lanes["host: step_fn"][3] == pytest.approx((0.37, 0.38))
    assert lanes["device: compute"][0] == pytest.approx((0.08, 0.10))


def test_to_dict_is_json_and_holds_the_same_numbers() -> None:
    prof = _profile()
    d = json.loads(json.dumps(prof.to_dict()))
    assert d["num_steps"] == 4 and d["bound"] == "data" and d["batch_size"] == 8 and d["cpu_count"] == 8
    assert d["busy_fraction"] == pytest.approx(0.2) and d["throughput"] == pytest.approx(80.0)
    assert d["fractions"] == pytest.approx(prof.fractions) and d["verdict"] == prof.verdict
    assert "steps=4" in repr(prof) and "bound='data'" in repr(prof)
