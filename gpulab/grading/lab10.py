"""Graders for lab 10 (hyperparameter search): the hidden tests call these.

Every check returns None (nbgrader would read a test cell's last value as partial credit) and
raises ``GradingError`` on failure. The student writes three things; each grader compares them with gpulab's reference, loaded
afresh from its source file (so replacing ``gpulab.hpo.successive_halving`` in the kernel does
not change what the student is compared with), and checks that the student's code does not just
call the reference (:data:`REFERENCES`, for ``grading.check_not_calling``):

- ``successive_halving(rungs, reduction_factor)``: :func:`check_promotion_rule` (hand-worked
  cases, then random rungs with ties, NaNs and already-promoted trials);
- ``make_asha(max_t)``: :func:`check_asha_scheduler` (the scheduler's settings) and
  :func:`check_asha_saving` (the measured trial-epochs and best accuracy of the two searches);
- ``packed_resources(trials_per_device, num_cpus, num_gpus)``: :func:`check_packed_resources`,
  and :func:`check_packing_gain` on the throughput it measured.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from gpulab import grading
from gpulab.hpo import halving as _halving
from gpulab.hpo import packing as _packing

__all__ = ["REFERENCES", "HAND_WORKED", "check_promotion_rule", "check_replay", "check_asha_scheduler",
           "check_asha_saving", "check_packed_resources", "check_packing_gain", "fresh_reference"]

# gpulab's own answers: a student's exercise must not call these
REFERENCES = (_halving.successive_halving, _halving.asha_continues, _halving.replay_halving,
              _packing.packed_resources)

# (rungs, reduction_factor, promotions), worked by hand in the lab's text
HAND_WORKED: tuple[tuple[list[dict[str, float]], float, list[list[str]]], ...] = (
    # 6 trials after 1 epoch; f is already in rung 1, so only b (second best) is promoted
    ([{"a": .3, "b": .5, "c": .1, "d": .4, "e": .2, "f": .6}, {"f": .7}, {}], 3, [["b"], [], []]),
    # 10 trials: the best 3 are t9, t8, t7, and t8, t7 are already up (t6 went up earlier, when the
    # rung was smaller); rung 1 holds 3, so its best (t7) goes up; the top rung promotes nobody
    ([{**{f"t{i}": i / 10 for i in range(9)}, "t9": .85}, {"t8": .9, "t7": .95, "t6": .5}, {}], 3,
     [["t9"], ["t7"], []]),
    # fewer trials than the reduction factor: nobody is promoted yet (ASHA starts a new trial)
    ([{"a": .9, "b": .8}, {}], 3, [[], []]),
    # a tie keeps the order the rung recorded: x before y; a diverged trial (NaN) ranks last
    ([{"x": .5, "y": .5, "z": float("nan"), "w": .1}, {}], 2, [["x", "y"], []]),
    # reduction factor 2 on a 2-rung ladder with one rung to promote into
    ([{"a": .1, "b": .2, "c": .3, "d": .4}, {"d": .45}], 2, [["c"], []]),
)


def fresh_reference(name: str = "halving") -> ModuleType:
    """``gpulab/hpo/<name>.py`` loaded anew from disk, outside ``sys.modules``."""
    # the gpulab folder this file lives in (gpulab/grading/lab10.py)
    root = next(p for p in Path(__file__).resolve().parents if (p / "hpo" / "halving.py").is_file())
    path = root / "hpo" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_gpulab_fresh_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _random_rungs(rng: random.Random) -> tuple[list[dict[str, float]], float]:
    rf = rng.choice([2, 3, 4, 2.5])
    n = rng.randint(0, 30)
    values = [round(rng.random(), 1) for _ in range(n)]  # rounded: ties happen
    if n and rng.random() < 0.3:
        values[rng.randrange(n)] = float("nan")
    rungs = [{f"t{i}": v for i, v in enumerate(values)}]
    for _ in range(rng.randint(0, 3)):  # higher rungs: some of the lower rung's trials, already up
        below = list(rungs[-1])
        up = rng.sample(below, rng.randint(0, len(below) // 2)) if below else []
        rungs.append({t: round(rng.random(), 2) for t in up})
    return rungs, rf


def check_promotion_rule(fn: Callable[..., Any], num_random: int = 150, seed: int = 10) -> None:
    """``fn`` promotes what successive halving promotes: the hand-worked cases, then random rungs.

    Returns nothing (a test cell's last value would be read by nbgrader as partial credit).
    """
    ref = fresh_reference().successive_halving
    cases = [(copy.deepcopy(r), rf) for r, rf, _ in HAND_WORKED]
    rng = random.Random(seed)
    cases += [_random_rungs(rng) for _ in range(num_random)]
    for i, (rungs, rf) in enumerate(cases):
        got = grading.check_not_calling(fn, copy.deepcopy(rungs), rf, forbidden=REFERENCES,
                                        what="successive_halving")
        want = ref(copy.deepcopy(rungs), rf)
        if got is None or [list(p) for p in got] != want:
            sizes = [len(r) for r in rungs]
            grading.check_equal(got, want, what=f"successive_halving on rungs of sizes {sizes} with reduction_factor={rf}",
                                hint="per rung: sort by metric (best first, NaN last, ties in recorded order), keep "
                                     "floor(len / reduction_factor), drop trials already in the next rung; the top "
                                     "rung promotes nobody")
    grading.check_raises(ValueError, fn, [{"a": 1.0}, {}], 1, what="successive_halving with reduction_factor=1",
                         hint="a reduction factor must be > 1")


def check_replay(fn: Callable[..., Any], curves: dict[str, list[float]], milestones: list[int], rf: float) -> None:
    """Successive halving replayed on the lab's curves with ``fn`` matches the reference."""
    fresh = fresh_reference()
    want = fresh.replay_halving(curves, milestones, rf, rule=fresh.successive_halving)
    got = fresh.replay_halving(curves, milestones, rf, rule=fn)
    grading.check_equal(got.reached, want.reached, what="the epochs each trial reaches when your rule replays the search")


def check_asha_scheduler(scheduler: Any, max_t: int, grace_period: int = 1, reduction_factor: float = 3) -> None:
    """``scheduler`` is Tune's ASHA with the lab's settings."""
    from ray.tune.schedulers import AsyncHyperBandScheduler

    grading.check(isinstance(scheduler, AsyncHyperBandScheduler), "make_asha returns Tune's ASHAScheduler",
                  hint="from ray.tune.schedulers import ASHAScheduler")
    grading.check_equal(scheduler._max_t, max_t, what="ASHA's max_t (the most epochs a trial runs)")
    grading.check_equal(scheduler._time_attr, "training_iteration", what="ASHA's time_attr")
    rungs = [m for m, _ in scheduler._brackets[0]._rungs]
    want = [m for m, _ in AsyncHyperBandScheduler(max_t=max_t, grace_period=grace_period,
                                                  reduction_factor=reduction_factor)._brackets[0]._rungs]
    grading.check_equal(rungs, want, what="ASHA's milestones (grace_period x reduction_factor^k)",
                        hint=f"grace_period={grace_period}, reduction_factor={reduction_factor}")


def check_asha_saving(random_epochs: int, asha_epochs: int, random_best: float, asha_best: float, *,
                      at_least: float = 2.0, max_gap: float = 0.03) -> None:
    """ASHA used ``at_least`` times fewer trial-epochs and lost at most ``max_gap`` accuracy."""
    grading.check(asha_epochs > 0, "the ASHA search ran no epoch", hint="run the ASHA cell after make_asha")
    grading.check_ratio(random_epochs, asha_epochs, at_least=at_least,
                        what="trial-epochs of random search / trial-epochs of ASHA on the same configs")
    grading.check_between(random_best - asha_best, None, max_gap, what="best accuracy lost by stopping trials early")


def check_packing_gain(ratio: float, idle_pct: float, *, at_least: float = 1.15, busy_idle_pct: float = 15.0) -> None:
    """Packing raised the steady-state trials per hour ``at_least`` times, where it could.

    Packing fills time that one trial per device leaves idle. ``idle_pct`` is the share of the
    CPU cores nobody used while the unpacked search ran (100 - the cores' mean busy %). On a
    machine that other jobs already kept busy (``idle_pct < busy_idle_pct``) there was nothing to
    fill, so the check only asks that packing did not make the search slower (``>= 0.9``), and
    says so.
    """
    if idle_pct < busy_idle_pct:
        grading.check_between(ratio, 0.9, None, what=f"trials per hour, packed / one per device (the cores were only "
                              f"{idle_pct:.0f} % idle: other jobs kept them busy, so packing could not gain much)",
                              hint="packing must at least not slow the search down")
        return
    grading.check_between(ratio, at_least, None, what=f"trials per hour, packed / one per device "
                          f"(the cores were {idle_pct:.0f} % idle during the unpacked search)",
                          hint="the trials wait for data; two per core fill that wait")


def check_packed_resources(fn: Callable[..., Any]) -> None:
    """``fn(trials_per_device, num_cpus, num_gpus)`` asks for what the reference asks for."""
    ref = fresh_reference("packing").packed_resources
    for k, cpus, gpus in [(1, 2, 0), (2, 2, 0), (4, 2, 0), (4, 16, 1), (4, 2, 1), (2, 8, 2), (1, 4, 1), (3, 3, 0)]:
        got = grading.check_not_calling(fn, k, cpus, gpus, forbidden=REFERENCES, what="packed_resources")
        want = ref(k, cpus, gpus)
        grading.check(isinstance(got, dict), f"packed_resources({k}, {cpus}, {gpus}) returns a dict like {want}")
        keys = {key for key, v in got.items() if v}
        grading.check_equal(keys, {key for key, v in want.items() if v},
                            what=f"the resources packed_resources({k}, num_cpus={cpus}, num_gpus={gpus}) asks for")
        for key in keys:
            grading.check(math.isclose(got[key], want[key], rel_tol=1e-3),
                          f"packed_resources({k}, num_cpus={cpus}, num_gpus={gpus})[{key!r}] is {got[key]!r}, "
                          f"expected {want[key]!r}")
    grading.check_raises(ValueError, fn, 0, 2, 0, what="packed_resources(0, ...)", hint="at least one trial per device")
