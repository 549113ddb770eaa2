"""gpulab.hpo.asha and gpulab.hpo.replay: the asynchronous promotion rule, checked against the rule
computed by brute force on every prefix of a result stream, against the synchronous successive
halving it approximates, and beside Tune's own ASHAScheduler on the same streams."""

from __future__ import annotations

import math
import random

import pytest

pytest.importorskip("ray")
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

from gpulab.hpo.asha import PromotionASHA, promoted
from gpulab.hpo.replay import replay_scheduler


class _T:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _report(s, trial: str, epoch: int, value: float, metric: str = "accuracy") -> str:
    return str(s.on_trial_result(None, _T(trial), {"training_iteration": epoch, metric: value}))


def _fresh(max_t=9, grace=1, rf=3, mode="max") -> PromotionASHA:
    s = PromotionASHA(max_t, grace_period=grace, reduction_factor=rf)
    s.set_search_properties("accuracy" if mode == "max" else "loss", mode)
    return s


def test_hand_worked_rung():
    """rf=3 at epoch 1: the first arrival goes on; then a trial needs fewer than n/3 results above it."""
    s = _fresh()
    assert [_report(s, t, 1, v) for t, v in [("a", .5), ("b", .8), ("c", .75), ("d", .9), ("e", .85)]] == [
        "CONTINUE",  # n=1, nobody better
        "CONTINUE",  # n=2, nobody better
        "STOP",      # n=3, b is better: 1 < 3/3 fails (Tune's cutoff, 0.7, lets it on)
        "CONTINUE",  # n=4, best
        "CONTINUE",  # n=5, only d is better: 1 < 5/3
    ]
    assert _report(s, "a", 2, .6) == "CONTINUE"  # between milestones
    assert _report(s, "a", 9, .6) == "STOP"      # max_t: finished
    assert s.rungs[1] == {"a": .5, "b": .8, "c": .75, "d": .9, "e": .85} and s.milestones == [1, 3]


def test_ties_nan_and_min_mode():
    s = _fresh(rf=2)
    assert _report(s, "a", 1, .5) == "CONTINUE"
    assert _report(s, "b", 1, .5) == "CONTINUE"  # a tie is not better
    assert _report(s, "c", 1, float("nan")) == "STOP"  # a diverged trial is never promoted
    assert _report(s, "d", 1, .4) == "STOP"  # 2 better of 4: 2 < 4/2 fails; the NaN beats nobody
    s = _fresh(mode="min")
    assert [_report(s, t, 1, v, "loss") for t, v in [("a", .5), ("b", .2), ("c", .4)]] == ["CONTINUE"] * 2 + ["STOP"]


def test_promoted_by_brute_force():
    rng = random.Random(0)
    for _ in range(300):
        scores = [round(rng.random(), 1) for _ in range(rng.randint(1, 12))]
        rf = rng.choice([2, 3, 4, 2.5])
        rank = sorted(scores, reverse=True).index(scores[-1])  # 0-based, ties share the best rank
        assert promoted(scores, scores[-1], rf) == (rank < len(scores) / rf)


def test_bad_settings():
    with pytest.raises(ValueError, match="reduction_factor"):
        PromotionASHA(9, reduction_factor=1)
    with pytest.raises(ValueError, match="grace_period"):
        PromotionASHA(2, grace_period=3)
    with pytest.raises(ValueError, match="mode"):
        PromotionASHA(9).set_search_properties("accuracy", "maximise")
    with pytest.raises(ValueError, match="workers"):
        replay_scheduler(FIFOScheduler(), {"a": [1.0]}, workers=0)


def _curves(rng: random.Random, n: int, epochs: int) -> dict[str, list[float]]:
    out = {}
    for i in range(n):
        final, tau = rng.uniform(0.2, 0.9), rng.uniform(0.3, 3.0)
        out[f"t{i:02d}"] = [round(final * (1 - math.exp(-e / tau)), 3) for e in range(1, epochs + 1)]
    return out


def test_replay_one_worker_and_the_saving():
    """With one worker the arrival order is the trials' order; the rule saves trial-epochs and
    keeps every rung's share near 1/rf, as synchronous halving does."""
    rng = random.Random(1)
    for seed in range(5):
        curves = _curves(random.Random(seed), 27, 9)
        run = replay_scheduler(_fresh(), curves, workers=rng.randint(1, 4), epoch_s=1.0)
        reached = [len(d) for d in run["decisions"].values()]
        assert run["trial_epochs"] == sum(reached) < 27 * 9 / 2
        at_3 = sum(r >= 3 for r in reached)
        assert 1 <= sum(r == 9 for r in reached) <= at_3 <= 27 * 2 // 3  # ceil-like share, never everyone
        assert all(d[-1] == "STOP" for d in run["decisions"].values())


def test_differs_from_tunes_quantile_rule():
    """On the same streams the two rules agree often but not always: Tune interpolates a quantile
    of the earlier results, PromotionASHA counts the results that beat this one."""
    differ = 0
    for seed in range(20):
        curves = _curves(random.Random(seed), 15, 9)
        ours = replay_scheduler(_fresh(), curves, workers=2)
        tunes = replay_scheduler(ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3), curves, workers=2)
        differ += ours["decisions"] != tunes["decisions"]
        assert ours["trial_epochs"] < 15 * 9 and tunes["trial_epochs"] < 15 * 9
    assert 0 < differ < 20
    # the docstring's case: earlier 0.5 and 0.8, cutoff 0.7: Tune lets 0.75 on, PromotionASHA stops it
    stream = {"a": [.5] * 9, "b": [.8] * 9, "c": [.75] * 9}
    assert replay_scheduler(ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3), stream)["decisions"]["c"][0] == "CONTINUE"
    assert replay_scheduler(_fresh(), stream)["decisions"]["c"][0] == "STOP"


def test_fifo_runs_everything():
    curves = _curves(random.Random(3), 5, 4)
    run = replay_scheduler(FIFOScheduler(), curves, workers=3, epoch_s={t: 1 + i for i, t in enumerate(curves)})
    assert run["trial_epochs"] == 20 and run["best"] == max(max(c) for c in curves.values())
