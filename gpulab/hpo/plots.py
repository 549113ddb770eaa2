"""Plots of hyperparameter searches (lab 10): learning curves, cost and best, best-so-far.

    from gpulab.hpo import plots
    plots.plot_curves(grid_results, title="grid")               # every trial's accuracy per epoch
    plots.plot_searches([grid_summary, random_summary])         # trial-epochs, wall time, best
    plots.plot_best_so_far({"random": rr, "TPE": tpe_results})  # who finds a good trial sooner

Curves are coloured by learning rate (log scale): a search that only ever tries three learning
rates shows three colours, however many trials it ran. A curve that stops early was stopped by
the scheduler.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

from gpulab.hpo.results import SearchSummary, best_so_far, learning_curves, trial_configs

__all__ = ["plot_curves", "plot_searches", "plot_best_so_far", "plot_space"]


def plot_curves(results: Iterable[Any], ax: Any = None, title: str = "", metric: str = "accuracy",
                color_by: str = "lr") -> Any:
    """Every trial's ``metric`` after each epoch, coloured by ``color_by`` (log scale).

    Returns:
        The matplotlib Axes.
    """
    results = list(results)
    curves, configs = learning_curves(results, metric), trial_configs(results)
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    values = [configs[t].get(color_by) for t in curves]
    known = [float(v) for v in values if isinstance(v, (int, float))]
    lo, hi = (math.log10(min(known)), math.log10(max(known))) if known else (0.0, 1.0)
    cmap = plt.get_cmap("viridis")
    for (tid, curve), v in zip(curves.items(), values):
        shade = 0.5 if not isinstance(v, (int, float)) or hi == lo else (math.log10(float(v)) - lo) / (hi - lo)
        epochs = np.arange(1, len(curve) + 1)
        ax.plot(epochs, curve, "-o", ms=2.5, lw=1.2, color=cmap(shade), alpha=0.85)
    if known and hi > lo:
        sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo, hi))
        ax.figure.colorbar(sm, ax=ax, label=f"log10({color_by})")
    ax.set_xlabel("epoch")
    ax.set_ylabel(metric)
    ax.set_title(title or f"{len(curves)} trials")
    ax.grid(alpha=0.3)
    return ax


def plot_searches(summaries: Sequence[SearchSummary], axes: Any = None) -> Any:
    """Three bar charts side by side: trial-epochs (cost), wall time, best accuracy.

    Returns:
        The array of three Axes.
    """
    if axes is None:
        _, axes = plt.subplots(1, 3, figsize=(11, 3))
    names = [s.name for s in summaries]
    colors = plt.get_cmap("tab10")(np.arange(len(summaries)))
    panels = [("trial-epochs", [s.trial_epochs for s in summaries], "{:.0f}"),
              ("wall time (s)", [s.wall_s for s in summaries], "{:.1f}"),
              ("best accuracy", [s.best_accuracy for s in summaries], "{:.3f}")]
    for ax, (label, values, fmt) in zip(axes, panels):
        bars = ax.bar(names, values, color=colors)
        for bar, v in zip(bars, values):
            ax.annotate(fmt.format(v), (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_title(label)
        ax.tick_params(axis="x", labelrotation=20)
    axes[2].set_ylim(0, 1.05)
    return axes


def plot_best_so_far(searches: Mapping[str, Iterable[Any]], ax: Any = None, metric: str = "accuracy") -> Any:
    """The best final ``metric`` found after 1, 2, ... trials, one line per search.

    Returns:
        The matplotlib Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    for name, results in searches.items():
        curve = best_so_far(results, metric)
        ax.step(np.arange(1, len(curve) + 1), curve, where="post", label=name, lw=1.8)
    ax.set_xlabel("trials run")
    ax.set_ylabel(f"best {metric} so far")
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def plot_space(searches: Mapping[str, Iterable[Any]], ax: Any = None, x: str = "lr", y: str = "width") -> Any:
    """Where each search put its trials in the (``x``, ``y``) plane (log axes).

    Returns:
        The matplotlib Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    markers = "osD^v*"
    for (name, results), marker in zip(searches.items(), markers):
        cfgs = list(trial_configs(results).values())
        ax.scatter([c.get(x) for c in cfgs], [c.get(y) for c in cfgs], marker=marker, label=name, alpha=0.75)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.legend()
    return ax
