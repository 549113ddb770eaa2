"""Replay a Tune scheduler on finished learning curves, as Tune's controller would call it (lab 10).

A real search's decisions depend on when each result arrives. Here the arrivals are simulated:
``workers`` trials run at once, each epoch of a trial takes its ``epoch_s`` seconds, a trial
stopped (or finished) frees its worker for the next trial in order. The scheduler gets the calls
Tune makes (``set_search_properties``, ``on_trial_add``, ``on_trial_result``,
``on_trial_complete``), so Tune's own ``ASHAScheduler``, gpulab's ``PromotionASHA`` and a
student's scheduler can be compared on exactly the same stream, without starting Ray::

    replay_scheduler(ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3), curves, workers=2)
    # {"decisions": {trial: ["CONTINUE", "STOP"], ...}, "trial_epochs": 21, "best": 0.91}

Importing this module does not import Ray (the scheduler is passed in).
"""

from __future__ import annotations

import heapq
from typing import Any, Hashable, Mapping, Sequence

__all__ = ["replay_scheduler"]


class _Trial:
    """What a scheduler reads of a Tune trial here: its id."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id

    def __repr__(self) -> str:
        return f"Trial({self.trial_id})"


def replay_scheduler(scheduler: Any, curves: Mapping[Hashable, Sequence[float]], *, mode: str = "max",
                     workers: int = 1, epoch_s: float | Mapping[Hashable, float] = 1.0) -> dict[str, Any]:
    """Feed ``scheduler`` the results of a simulated asynchronous search and record its decisions.

    Args:
        scheduler: a Tune ``TrialScheduler`` (fresh: it keeps what it has seen).
        curves: trial -> its metric after each epoch; trials start in this order.
        mode: ``"max"`` reports the metric as ``accuracy``, ``"min"`` as ``loss``.
        workers: trials running at once.
        epoch_s: seconds per epoch, one number or one per trial (sets the arrival order).

    Returns:
        ``{"decisions": {trial: [the answer to each epoch's result]}, "trial_epochs": epochs run in
        all, "best": the best value reported}``. A trial whose list is as long as its curve finished.

    Raises:
        ValueError: for ``workers < 1`` or a mode other than "max"/"min".
    """
    if workers < 1 or mode not in ("max", "min"):
        raise ValueError(f"need workers >= 1 and mode 'max' or 'min', got {workers} and {mode!r}")
    seconds = epoch_s if isinstance(epoch_s, Mapping) else {t: epoch_s for t in curves}
    metric = "accuracy" if mode == "max" else "loss"
    scheduler.set_search_properties(metric, mode)  # what Tune does with TuneConfig(metric=..., mode=...)
    pending, events, seq = list(curves), [], 0
    trials = {t: _Trial(str(t)) for t in curves}
    decisions: dict[Hashable, list[str]] = {t: [] for t in curves}
    seen: list[float] = []

    def start(trial: Hashable, now: float) -> None:
        nonlocal seq
        scheduler.on_trial_add(None, trials[trial])
        heapq.heappush(events, (now + seconds[trial], seq, trial, 1))  # seq: ties keep start order
        seq += 1

    for _ in range(workers):
        if pending:
            start(pending.pop(0), 0.0)
    while events:
        now, _, trial, epoch = heapq.heappop(events)
        value = float(curves[trial][epoch - 1])
        seen.append(value)
        result = {"training_iteration": epoch, metric: value, "trial_id": str(trial)}
        decision = str(scheduler.on_trial_result(None, trials[trial], result))
        decisions[trial].append(decision)
        if decision == "STOP" or epoch == len(curves[trial]):
            scheduler.on_trial_complete(None, trials[trial], result)
            if pending:
                start(pending.pop(0), now)
        else:
            heapq.heappush(events, (now + seconds[trial], seq, trial, epoch + 1))
            seq += 1
    finite = [v for v in seen if v == v]
    best = (max if mode == "max" else min)(finite) if finite else float("nan")
    return {"decisions": decisions, "trial_epochs": len(seen), "best": best}
