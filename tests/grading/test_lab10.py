"""Lab 10's graders: seeded inputs that exercise the rules (promotions, stops, packed shares), values
from a right answer that the judge finds equal to the reference's, and wrong answers it tells apart.
No Ray runtime is started here (tests/hpo does that); the timed probe is run by the notebook."""

from __future__ import annotations

import math
import random

import pytest

ray = pytest.importorskip("ray", reason="lab 10 needs the search extra: pip install -e '.[search]'")

from ray.tune.schedulers import ASHAScheduler, FIFOScheduler  # noqa: E402

from gpulab.evidence.codec import encode  # noqa: E402
from gpulab.grading import lab10, lab10_asha  # noqa: E402
from gpulab.verdict import check as judge  # noqa: E402


def _verdict(kind: str, actual, expected, **params) -> str | None:
    spec = {"kind": kind, "what": "case", **params}
    return judge.verdict(spec, judge.decode(encode(actual)), judge.decode(encode(expected)))


def _rule(rungs, reduction_factor):
    """successive_halving as the lab's solution writes it."""
    if not reduction_factor > 1:
        raise ValueError(reduction_factor)
    out = []
    for k, rung in enumerate(rungs):
        if k == len(rungs) - 1:
            out.append([])
            break
        ranked = sorted(rung, key=lambda t: -rung[t] if rung[t] == rung[t] else math.inf)
        out.append([t for t in ranked[: math.floor(len(rung) / reduction_factor)] if t not in rungs[k + 1]])
    return out


def test_references_are_the_exercises() -> None:
    assert lab10.REFERENCES == (lab10.successive_halving, lab10.PromotionASHA, lab10.promoted, lab10.packed_resources)


def test_hand_worked_cases_hold() -> None:
    for rungs, rf, want in lab10.HAND_WORKED:
        assert lab10.successive_halving(rungs, rf) == want


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_promotions_right_and_wrong(seed: int) -> None:
    cases = lab10.random_rungs(random.Random(seed), 150)
    assert len(cases) == 150 + len(lab10.HAND_WORKED)
    assert repr(cases) == repr(lab10.random_rungs(random.Random(seed), 150))  # the same inputs in both kernels
    want = lab10.promotions(lab10.successive_halving, cases)
    assert sum(any(p) for p in want.values()) > 50  # the cases promote somebody
    assert _verdict("equal", lab10.promotions(_rule, cases), want) is None

    def keeps_promoted(rungs, rf):  # forgets to drop the trials already in the next rung
        return [
            sorted(r, key=lambda t: -r[t] if r[t] == r[t] else math.inf)[: math.floor(len(r) / rf)]
            if k < len(rungs) - 1
            else []
            for k, r in enumerate(rungs)
        ]

    def crashes(rungs, rf):
        raise KeyError("oops")

    assert "expected" in _verdict("equal", lab10.promotions(keeps_promoted, cases), want)
    why = _verdict("equal", lab10.promotions(crashes, cases), want)
    assert "hand-worked case 1" in why and "KeyError" in why


def test_promotions_do_not_share_inputs_with_the_student() -> None:
    cases = lab10.random_rungs(random.Random(5), 20)

    def vandal(rungs, rf):
        for r in rungs:
            r.clear()
        return []

    before = repr(cases)
    lab10.promotions(vandal, cases)
    assert repr(cases) == before


def test_replays_right_and_wrong() -> None:
    searches = lab10.random_searches(random.Random(3), 4)
    want = lab10.replays(lab10.successive_halving, searches)
    assert all(0 < v["trial_epochs"] for v in want.values())
    assert _verdict("equal", lab10.replays(_rule, searches), want) is None

    def everyone(rungs, rf):
        return [list(r) if k < len(rungs) - 1 else [] for k, r in enumerate(rungs)]

    assert _verdict("equal", lab10.replays(everyone, searches), want) is not None


class _TuneInside(ASHAScheduler):
    """A wrong answer: Tune's ASHA subclassed (decides by Tune's quantile, and is counted)."""

    def __init__(self, max_t, grace_period=1, reduction_factor=3):
        super().__init__(max_t=max_t, grace_period=grace_period, reduction_factor=reduction_factor)


class _Floor(lab10.PromotionASHA):
    """A wrong answer: the top floor(n / rf) by rank, so the first arrivals at a rung stop."""

    def on_trial_result(self, tune_controller, trial, result):
        t = result.get(self.time_attr)
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == "CONTINUE" and t in self.rungs and trial.trial_id in self.rungs[t]:
            rung = self.rungs[t]
            better = sum(v > rung[trial.trial_id] for v in rung.values())
            return "CONTINUE" if better < math.floor(len(rung) / self.reduction_factor) else "STOP"
        return decision


class _IgnoresMode(lab10.PromotionASHA):
    """A wrong answer: forgets that mode="min" means lower is better."""

    def set_search_properties(self, metric, mode, **spec):
        return super().set_search_properties(metric, "max", **spec)


def test_scheduler_streams_right_and_wrong() -> None:
    streams = lab10.random_streams(random.Random(4), 12)
    assert repr(streams) == repr(lab10.random_streams(random.Random(4), 12))  # the same in both kernels
    assert {s["mode"] for s in streams.values()} == {"max", "min"}
    assert len({s["reduction_factor"] for s in streams.values()}) > 1 and any("ties" in n for n in streams)
    want = lab10.scheduler_runs(lab10.PromotionASHA, streams)
    assert all(not isinstance(r, Exception) and r["Tune ASHA calls"] == 0 for r in want.values())
    decisions = [d for r in want.values() for ds in r["decisions"].values() for d in ds]
    assert decisions.count("STOP") > 50 and decisions.count("CONTINUE") > 100
    assert _verdict("equal", lab10.scheduler_runs(lab10.PromotionASHA, streams), want) is None  # deterministic

    why = _verdict("equal", lab10.scheduler_runs(_TuneInside, streams), want)
    assert why is not None and "Tune ASHA calls" in why
    for wrong in (_Floor, _IgnoresMode, lambda max_t, **kw: FIFOScheduler()):
        assert _verdict("equal", lab10.scheduler_runs(wrong, streams), want) is not None, wrong


def test_tune_comparison_baselines_without_ray() -> None:
    """The two baselines beside the real search are computed, not run: check them by hand."""
    case = lab10_asha.comparison_case(random.Random(0))
    assert len(case["curves"]) == 12 and all(len(c) == case["max_t"] == 9 for c in case["curves"])
    stream = {
        "mode": "max",
        "workers": 2,
        "epoch_s": case["epoch_s"],
        "curves": {f"trial_{i:03d}": c for i, c in enumerate(case["curves"])},
    }
    tunes = lab10_asha.stream_run(ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3), stream)
    assert 12 <= tunes["trial_epochs"] < 108 / 2


def test_packed_requests_right_and_wrong() -> None:
    machines = lab10.random_machines(random.Random(6), 24)
    assert any(g for _, _, g in machines) and any(not g for _, _, g in machines)
    want = lab10.packed_requests(lab10.packed_resources, machines)

    def plain(k, cpus, gpus=0):  # no rounding to Ray's 1/10,000: within the tolerance
        if k < 1:
            raise ValueError(k)
        return {"cpu": 1 / k, "gpu": 0} if gpus == 0 else {"gpu": 1 / k, "cpu": min(1.0, cpus / (k * gpus))}

    def one_cpu(k, cpus, gpus=0):
        return {"cpu": 1 / k} if gpus == 0 else {"gpu": 1 / k, "cpu": 1.0}

    tol = dict(rtol=1e-3, atol=1.5e-4)
    assert _verdict("close", lab10.packed_requests(plain, machines), want, **tol) is None
    assert (
        _verdict(
            "close",
            lab10.packed_requests(one_cpu, lab10.random_machines(random.Random(7), 200)),
            lab10.packed_requests(lab10.packed_resources, lab10.random_machines(random.Random(7), 200)),
            **tol,
        )
        is not None
    )


def test_the_packing_bound_passes_two_rounds_of_waiting_and_fails_four() -> None:
    """The packing check's contract (measure.wall, floor 2 and at most 3 x PROBE_WAIT_S): the packed probe
    waits in 2 rounds (about 0.21 s measured on the kit's VM), one task per device in 4 (about 0.41 s),
    and a request that packs more runs in 1 round, faster than the waiting it must do."""
    from gpulab.verdict.rules import Measurement, judge

    bounds = dict(floor_s=2 * lab10.PROBE_WAIT_S, at_most_s=3 * lab10.PROBE_WAIT_S)
    packed, loaded, one_per_device, over = (0.212, 0.205), (0.29, 0.33), (0.414, 0.417), (0.167, 0.169)
    assert judge("measure.wall", [Measurement(t) for t in packed], None, **bounds) is None
    assert judge("measure.wall", [Measurement(t) for t in loaded], None, **bounds) is None  # the least run counts
    assert "more than the 300.0 ms allowed" in judge(
        "measure.wall", [Measurement(t) for t in one_per_device], None, **bounds
    )
    assert "less than the 200.0 ms" in judge("measure.wall", [Measurement(t) for t in over], None, **bounds)
