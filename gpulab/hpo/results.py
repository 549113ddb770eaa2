"""Read a Tune ``ResultGrid`` as the figures lab 10 compares: curves, trial-epochs, best, throughput.

A search's cost is counted in **trial-epochs** (the sum over trials of the epochs each one ran):
unlike wall time it does not depend on the machine or on how many trials ran at once, so grid,
random, Bayesian and ASHA searches compare fairly. Wall time and **trials per hour** then say how
well the search kept the hardware busy::

    results = tuner.fit()
    s = summarize(results, wall_s, name="random")
    print(s)                         # random: 9 trials, 81 trial-epochs, best 0.74, 21.3 s ...
    curves = learning_curves(results)            # trial id -> [accuracy after epoch 1, 2, ...]

Works on anything iterable whose items have ``metrics_dataframe``, ``config``, ``metrics`` and
``error`` (a ``ray.tune.ResultGrid`` or a list of ``ray.tune.Result``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["learning_curves", "trial_epochs", "trial_configs", "best_so_far", "summarize", "SearchSummary",
           "trial_errors"]


def _trial_id(result: Any, index: int) -> str:
    metrics = getattr(result, "metrics", None) or {}
    return str(metrics.get("trial_id", f"trial_{index:05d}"))


def _frames(results: Iterable[Any]) -> list[tuple[str, Any, Any]]:
    """(trial id, result, metrics dataframe or None), in the order Tune created the trials."""
    out = []
    for i, r in enumerate(results):
        df = getattr(r, "metrics_dataframe", None)
        out.append((_trial_id(r, i), r, df if df is not None and len(df) else None))
    return sorted(out, key=lambda item: item[0])  # ids end in 00000, 00001...: creation order


def learning_curves(results: Iterable[Any], metric: str = "accuracy") -> dict[str, list[float]]:
    """Trial id -> the metric after each epoch it ran (trials that reported nothing are left out).

    Raises:
        KeyError: if the trials reported no ``metric`` (the message lists what they reported).
    """
    curves = {}
    for tid, _, df in _frames(results):
        if df is None:
            continue
        if metric not in df.columns:
            raise KeyError(f"the trials did not report {metric!r}; they reported {sorted(df.columns)[:12]}")
        curves[tid] = [float(v) for v in df.sort_values("training_iteration")[metric]]
    return curves


def trial_configs(results: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Trial id -> the configuration it ran."""
    return {tid: dict(r.config or {}) for tid, r, _ in _frames(results)}


def trial_epochs(results: Iterable[Any]) -> int:
    """Total epochs run by all trials: the search's cost in units that ignore the hardware."""
    return sum(int(df["training_iteration"].max()) for _, _, df in _frames(results) if df is not None)


def trial_errors(results: Iterable[Any]) -> dict[str, str]:
    """Trial id -> the error that ended it, for the trials that raised."""
    return {tid: f"{type(r.error).__name__}: {r.error}" for tid, r, _ in _frames(results) if r.error is not None}


def best_so_far(results: Iterable[Any], metric: str = "accuracy") -> list[float]:
    """After each trial (in creation order), the best final ``metric`` of the trials so far.

    A search that finds the good region sooner climbs sooner; NaN where no trial finished yet.
    """
    best, out = -math.inf, []
    for _, _, df in _frames(results):
        if df is not None and metric in df.columns:
            best = max(best, float(df.sort_values("training_iteration")[metric].iloc[-1]))
        out.append(best if best > -math.inf else math.nan)
    return out


@dataclass
class SearchSummary:
    """One search in the figures that lab 10 compares."""

    name: str
    trials: int
    trial_epochs: int
    best_accuracy: float
    best_config: dict[str, Any]
    wall_s: float
    errors: dict[str, str] = field(default_factory=dict)

    @property
    def trials_per_hour(self) -> float:
        """Finished trials per hour of wall time (throughput; higher is a busier machine)."""
        return 3600.0 * self.trials / max(self.wall_s, 1e-9)

    @property
    def epochs_per_s(self) -> float:
        """Trial-epochs per second of wall time."""
        return self.trial_epochs / max(self.wall_s, 1e-9)

    def __str__(self) -> str:
        cfg = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.best_config.items()
                        if k in ("lr", "width"))
        err = f", {len(self.errors)} failed" if self.errors else ""
        return (f"{self.name}: {self.trials} trials, {self.trial_epochs} trial-epochs, best accuracy "
                f"{self.best_accuracy:.3f} ({cfg}), {self.wall_s:.1f} s, {self.trials_per_hour:.0f} trials/h{err}")


def summarize(results: Iterable[Any], wall_s: float, name: str = "search", metric: str = "accuracy") -> SearchSummary:
    """The figures of one search: trials, trial-epochs, the best ``metric`` reached by any trial
    (at any epoch, as Tune's ``get_best_result(scope="all")``), its config, wall time, errors."""
    frames = _frames(results)
    best, best_cfg = -math.inf, {}
    for _, r, df in frames:
        if df is not None and metric in df.columns and df[metric].max() > best:
            best, best_cfg = float(df[metric].max()), dict(r.config or {})
    return SearchSummary(name, len(frames), trial_epochs(results), best if best > -math.inf else math.nan, best_cfg,
                         float(wall_s), trial_errors(results))
