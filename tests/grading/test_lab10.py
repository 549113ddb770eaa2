"""Lab 10's graders: seeded inputs that exercise the rules (promotions, stops, packed shares), values
from a right answer that the judge finds equal to the reference's, and wrong answers it tells apart.
No Ray runtime is started here (tests/hpo does that); the timed probe is run by the notebook."""

from __future__ import annotations

import math
import random

import pytest

from gpulab.grading import judge, lab10
from gpulab.grading.evidence import encode

ray = pytest.importorskip("ray")
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler  # noqa: E402


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
        out.append([t for t in ranked[:math.floor(len(rung) / reduction_factor)] if t not in rungs[k + 1]])
    return out


def _asha(max_t, **kw):
    return ASHAScheduler(**{"time_attr": "training_iteration", "max_t": max_t, "grace_period": 1,
                            "reduction_factor": 3, **kw})


def test_references_are_the_exercises() -> None:
    assert lab10.REFERENCES == (lab10.successive_halving, lab10.packed_resources)


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
        return [sorted(r, key=lambda t: -r[t] if r[t] == r[t] else math.inf)[:math.floor(len(r) / rf)]
                if k < len(rungs) - 1 else [] for k, r in enumerate(rungs)]

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


def test_asha_settings_and_decisions() -> None:
    searches = lab10.random_asha_searches(random.Random(4), 3)
    want_settings = lab10.asha_settings_of(_asha, searches)
    want_runs = lab10.asha_runs(_asha, searches)
    assert _verdict("equal", lab10.asha_settings_of(_asha, searches), want_settings) is None
    assert _verdict("equal", lab10.asha_runs(_asha, searches), want_runs) is None  # deterministic
    stops = [d for run in want_runs.values() for ds in run["decisions"].values() for d in ds if d == "STOP"]
    assert stops, "the simulated searches must make ASHA stop trials"
    first = next(iter(want_runs.values()))
    assert first["trial_epochs"] < sum(len(c) for c in next(iter(searches.values()))["curves"].values()) / 2

    # wrong settings and schedulers are told apart
    assert _verdict("equal", lab10.asha_runs(lambda m: _asha(m, reduction_factor=4), searches), want_runs) is not None
    assert _verdict("equal", lab10.asha_runs(lambda m: _asha(m, grace_period=3), searches), want_runs) is not None
    assert _verdict("equal", lab10.asha_runs(lambda m: FIFOScheduler(), searches), want_runs) is not None
    assert "time_attr" in _verdict("equal", lab10.asha_settings_of(lambda m: _asha(m, time_attr="epoch"), searches),
                                   want_settings)
    assert "TuneConfig" in _verdict("equal", lab10.asha_settings_of(
        lambda m: _asha(m, metric="accuracy", mode="max"), searches), want_settings)
    assert "max_t" in _verdict("equal", lab10.asha_settings_of(lambda m: _asha(m + 1), searches), want_settings)
    # stop_last_trials only changes the decision at the last epoch, which the trainable ends anyway
    assert _verdict("equal", lab10.asha_runs(lambda m: _asha(m, stop_last_trials=False), searches), want_runs) is None


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
    assert _verdict("close", lab10.packed_requests(one_cpu, lab10.random_machines(random.Random(7), 200)),
                    lab10.packed_requests(lab10.packed_resources, lab10.random_machines(random.Random(7), 200)),
                    **tol) is not None


def test_one_per_device() -> None:
    assert lab10.one_per_device(2, 0) == {"cpu": 1.0}
    assert lab10.one_per_device(2, 4) == {"gpu": 1.0, "cpu": 0.5}
