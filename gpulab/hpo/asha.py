"""ASHA as an asynchronous Tune scheduler: promotions decided as results arrive (lab 10's reference).

Successive halving on a finished table (:func:`gpulab.hpo.halving.successive_halving`) ranks a rung
once every trial has reached it, so a worker would wait for the rung to fill. ASHA (Li et al. 2020,
"A System for Massively Parallel Hyperparameter Tuning", MLSys; arXiv 1810.05934) never waits: it
decides with the results recorded *so far*. :class:`PromotionASHA` decides once, when a trial
reports at a milestone (``grace_period * reduction_factor**k`` epochs, below ``max_t``); the rule,
and how it differs from Li et al.'s and Tune's, is in the comment below the imports. This module
imports Ray, so ``gpulab.hpo`` does not import it. Use it as any Tune scheduler::

    tune.Tuner(trainable, tune_config=tune.TuneConfig(metric="accuracy", mode="max",
               scheduler=PromotionASHA(max_t=9, grace_period=1, reduction_factor=3)), ...)

    .venv/bin/python -m pytest tests/hpo/test_asha.py
"""

from __future__ import annotations

import math
from typing import Any

from gpulab.hpo.halving import rung_milestones
from gpulab.hpo.session import import_ray

# PromotionASHA's rule, when a trial reports at a milestone (metric and mode come from the
# ``TuneConfig``; the scheduler subclasses Tune's ``FIFOScheduler``):
# 1. record the trial's result in that rung (higher is better; ``mode="min"`` flips the sign);
# 2. with ``n`` results in the rung (this one included) and ``b`` of them strictly better, the trial
#    is **promoted** (``CONTINUE``) if ``b < n / reduction_factor``: it is in the top
#    ``1 / reduction_factor`` of what the rung has seen. Otherwise it is **stopped** (``STOP``).
#    A tie is not better, and a NaN (a diverged trial) is never promoted and beats nobody;
# 3. a trial that reaches ``max_t`` is finished (``STOP``); between milestones it continues.
#
# How this differs from its neighbours:
# - Li et al.'s ``get_job`` *pauses* a trial that is not promotable yet and may promote it later,
#   when the rung has grown; here the decision is final, as in Tune's scheduler, so no checkpoint is
#   saved and restored.
# - Tune's ``ASHAScheduler`` (``ray/tune/schedulers/async_hyperband.py``, ``_Bracket.on_result`` and
#   ``cutoff``) compares the result with ``np.nanpercentile(earlier, (1 - 1/rf) * 100)`` of the
#   results recorded *before* it, a linearly interpolated quantile, and stops it only if it is
#   below. With earlier results 0.5 and 0.8 and ``rf=3``, the cutoff is 0.7, so 0.75 goes on; here
#   one of three results beats 0.75 and ``1 < 3 / 3`` fails, so it stops.

import_ray()  # the fix named (make setup) when the search extra is missing
from ray.tune.schedulers import FIFOScheduler, TrialScheduler  # noqa: E402

__all__ = ["PromotionASHA", "promoted"]


def promoted(scores: list[float], score: float, reduction_factor: float) -> bool:
    """Is ``score`` in the top ``1 / reduction_factor`` of ``scores`` (the rung's results, itself
    included; higher is better)? True if fewer than ``len(scores) / reduction_factor`` beat it."""
    if math.isnan(score):
        return False
    better = sum(1 for s in scores if s > score)  # NaN > x is False: a diverged trial beats nobody
    return better * reduction_factor < len(scores)


class PromotionASHA(FIFOScheduler):
    """Asynchronous successive halving that promotes a trial in the top ``1 / reduction_factor`` of
    the results its rung has recorded so far, and stops it otherwise (see the module doc).

    Args:
        max_t: the epochs (``time_attr`` units) a promoted trial runs in all.
        grace_period: the first milestone.
        reduction_factor: the rungs' spacing and the share promoted (3 keeps a third).
        time_attr: the result's measure of progress.

    Raises:
        ValueError: for ``reduction_factor <= 1`` or ``not 1 <= grace_period <= max_t``.
    """

    def __init__(self, max_t: int, grace_period: int = 1, reduction_factor: float = 3,
                 time_attr: str = "training_iteration") -> None:
        super().__init__()
        self.milestones = rung_milestones(max_t, grace_period, reduction_factor)[:-1]  # max_t ends a trial
        self.max_t, self.reduction_factor, self.time_attr = max_t, reduction_factor, time_attr
        self.rungs: dict[int, dict[str, float]] = {m: {} for m in self.milestones}  # milestone -> trial -> score
        self._mode: str | None = None

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        """Tune passes the ``TuneConfig``'s metric and mode here (the base class keeps no mode)."""
        if mode not in (None, "max", "min"):
            raise ValueError(f"mode must be 'max' or 'min', got {mode!r}")
        self._mode = mode or self._mode
        return super().set_search_properties(metric, mode, **spec)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        t, value = result.get(self.time_attr), result.get(self._metric)
        if t is None or value is None:
            return TrialScheduler.CONTINUE
        if t >= self.max_t:
            return TrialScheduler.STOP  # finished
        reached = [m for m in self.milestones if m <= t]
        if not reached or trial.trial_id in self.rungs[reached[-1]]:
            return TrialScheduler.CONTINUE  # between milestones, or judged here already
        rung = self.rungs[reached[-1]]
        rung[trial.trial_id] = float(value) if self._mode != "min" else -float(value)
        if promoted(list(rung.values()), rung[trial.trial_id], self.reduction_factor):
            return TrialScheduler.CONTINUE
        return TrialScheduler.STOP

    def debug_string(self) -> str:
        return "PromotionASHA: " + ", ".join(f"{len(r)} recorded at {m}" for m, r in self.rungs.items())
