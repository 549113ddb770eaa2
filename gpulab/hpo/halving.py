"""Successive halving: the promotion rule inside ASHA, written out (lab 10's reference).

Run every trial for a small budget (the first *rung*, e.g. 1 epoch), keep the best
``1 / reduction_factor`` of them for the next rung (3 epochs), the best third of those for the
next (9 epochs), and so on. Bad trials stop after one epoch instead of nine, so most of the
budget goes to the promising ones. Sources, and how ASHA and Ray Tune apply the rule: the comment
below the imports. Example (higher is better)::

    rungs = [{"a": .3, "b": .5, "c": .1, "d": .4, "e": .2, "f": .6},   # 6 trials after 1 epoch
             {"f": .7},                                                # f already promoted
             {}]
    successive_halving(rungs, 3)   # [["b"], [], []]: top 6 // 3 = 2 are f and b; f is already up

    .venv/bin/python -m pytest tests/hpo/test_hpo.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Sequence

import numpy as np

# - Successive halving: Jamieson & Talwalkar 2016, "Non-stochastic Best Arm Identification and
#   Hyperparameter Optimization" (arXiv 1502.07943); Hyperband runs it with several first-rung
#   budgets (Li et al. 2017, arXiv 1603.06560).
# - ASHA: Li et al. 2020, "A System for Massively Parallel Hyperparameter Tuning" (MLSys; arXiv
#   1810.05934). Its ``get_job`` asks, from the top rung down, whether some trial of rung ``k``
#   is among the best ``floor(n_k / reduction_factor)`` of that rung and not promoted yet; if so
#   it is promoted, otherwise a new trial starts in the bottom rung. No rung waits for the rung
#   to fill, so workers never idle. ``successive_halving`` is that test, for every rung, on a
#   table; ``gpulab.hpo.asha`` decides as each result arrives, as a Tune scheduler.
# - Ray Tune's ``ASHAScheduler`` is a *stopping* rule instead: when a trial reaches a milestone, it
#   continues only if its metric is at least the ``1 - 1 / reduction_factor`` quantile (linearly
#   interpolated) of the results that milestone recorded *before* it (see ``asha_continues``).

__all__ = ["successive_halving", "asha_continues", "replay_halving", "HalvingReplay", "rung_milestones"]

Rungs = Sequence[Mapping[Hashable, float]]


def _check_factor(reduction_factor: float) -> None:
    if not (isinstance(reduction_factor, (int, float)) and reduction_factor > 1):
        raise ValueError(f"reduction_factor must be a number > 1 (3 keeps a third of each rung), got {reduction_factor!r}")


def _rank_key(value: float) -> float:
    return -value if value == value else math.inf  # best first; NaN (a diverged trial) last


def successive_halving(rungs: Rungs, reduction_factor: float) -> list[list[Hashable]]:
    """The trials each rung promotes now, by ASHA's rule (higher metric is better).

    Args:
        rungs: ``rungs[k]`` maps trial -> metric recorded at rung ``k``, lowest rung first.
        reduction_factor: keep the best ``floor(len(rungs[k]) / reduction_factor)`` of a rung.

    Returns:
        One list per rung: the trials of rung ``k`` to promote to rung ``k + 1``, best first.
        A trial is promotable if it is among the best ``floor(n_k / reduction_factor)`` of its
        rung and not already in rung ``k + 1``. Ties keep the order in which the rung recorded
        them. The top rung promotes nobody (an empty list).

    Raises:
        ValueError: if ``reduction_factor`` is not a number > 1.
    """
    _check_factor(reduction_factor)
    promotions: list[list[Hashable]] = []
    for k, rung in enumerate(rungs):
        if k == len(rungs) - 1:
            promotions.append([])
            break
        keep = math.floor(len(rung) / reduction_factor)
        ranked = sorted(rung, key=lambda trial: _rank_key(rung[trial]))  # stable: ties in recorded order
        promotions.append([trial for trial in ranked[:keep] if trial not in rungs[k + 1]])
    return promotions


def asha_continues(recorded: Sequence[float], value: float, reduction_factor: float) -> bool:
    """Ray Tune's form of the rule: does a trial that reports ``value`` at a milestone go on?

    It goes on if nothing was recorded there yet, or if ``value`` is at least the
    ``(1 - 1 / reduction_factor)`` quantile of the values recorded before it. Early trials thus
    pass more easily than late ones: the price of never waiting for a rung to fill.
    """
    _check_factor(reduction_factor)
    if len(recorded) == 0:
        return True
    cutoff = np.nanpercentile(np.asarray(recorded, dtype=float), (1 - 1 / reduction_factor) * 100)
    return not value < cutoff


def rung_milestones(max_t: int, grace_period: int = 1, reduction_factor: float = 3) -> list[int]:
    """The epochs at which ASHA compares trials: ``grace_period * reduction_factor**k`` up to
    ``max_t`` (the last milestone is ``max_t`` itself, where every surviving trial ends).

    Raises:
        ValueError: for ``grace_period`` < 1 or ``max_t`` < ``grace_period``.
    """
    _check_factor(reduction_factor)
    if grace_period < 1 or max_t < grace_period:
        raise ValueError(f"need 1 <= grace_period <= max_t, got grace_period={grace_period}, max_t={max_t}")
    out, t = [], float(grace_period)
    while t < max_t:
        out.append(int(round(t)))
        t *= reduction_factor
    return out + [max_t]


@dataclass
class HalvingReplay:
    """Successive halving replayed on complete learning curves (see :func:`replay_halving`)."""

    milestones: list[int]
    rungs: list[dict[Hashable, float]]
    trial_epochs: int  # epochs the halving runs in total
    full_epochs: int  # epochs of running every trial to the last milestone
    reached: dict[Hashable, int] = field(default_factory=dict)  # trial -> last epoch it ran

    @property
    def saving(self) -> float:
        """How many times fewer trial-epochs than running every trial to the end."""
        return self.full_epochs / max(self.trial_epochs, 1)

    @property
    def best(self) -> tuple[Hashable, float]:
        """The best trial of the highest rung that anybody reached, and its metric."""
        top = next(r for r in reversed(self.rungs) if r)
        trial = min(top, key=lambda t: _rank_key(top[t]))
        return trial, top[trial]


def replay_halving(curves: Mapping[Hashable, Sequence[float]], milestones: Sequence[int], reduction_factor: float,
                   rule: Callable[[Rungs, float], list[list[Hashable]]] = successive_halving) -> HalvingReplay:
    """What synchronous successive halving would have run, given every trial's full curve.

    Every trial enters the first rung with its metric at epoch ``milestones[0]``; then, rung by
    rung, ``rule(rungs, reduction_factor)`` names the trials promoted to the next milestone.

    Args:
        curves: trial -> metric after each epoch (``curve[e - 1]`` is epoch ``e``).
        milestones: increasing epochs, e.g. ``rung_milestones(9)`` = ``[1, 3, 9]``.
        reduction_factor: passed to ``rule``.
        rule: the promotion rule (a student's version, or :func:`successive_halving`).

    Raises:
        ValueError: for empty curves, milestones that do not increase, or a curve shorter
            than the last milestone.
    """
    ms = list(milestones)
    if not curves or not ms or any(b <= a for a, b in zip(ms, ms[1:])) or ms[0] < 1:
        raise ValueError(f"need some curves and increasing milestones >= 1, got {len(curves)} curves, milestones {ms}")
    short = [t for t, c in curves.items() if len(c) < ms[-1]]
    if short:
        raise ValueError(f"{len(short)} curve(s) have fewer than {ms[-1]} epochs (e.g. {short[0]!r}); "
                         f"replay needs every trial run to the last milestone")
    rungs: list[dict[Hashable, float]] = [{t: float(c[ms[0] - 1]) for t, c in curves.items()}]
    rungs += [{} for _ in ms[1:]]
    reached = {t: ms[0] for t in curves}
    for k in range(len(ms) - 1):
        for trial in rule(rungs, reduction_factor)[k]:
            rungs[k + 1][trial] = float(curves[trial][ms[k + 1] - 1])
            reached[trial] = ms[k + 1]
    return HalvingReplay(ms, rungs, sum(reached.values()), len(curves) * ms[-1], reached)
