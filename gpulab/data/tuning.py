"""Sweeping and tuning DataLoader settings: ``sweep_loader`` and ``tune_loader``.

``sweep_loader`` is the hand sweep from the source posts, automated: every combination of the
given values, each timed the same way, with a progress bar, a table and a plot of throughput
against ``num_workers``. It is exhaustive, so it is slow when the grid is large.

``tune_loader`` finds a setting within 5 % of the sweep's best with a handful of trials. It relies
on the usual shape of throughput against ``num_workers`` (it rises until the cores or the consumer
are saturated, then flattens or falls): it doubles ``num_workers`` while throughput still improves
by more than the tolerance (always trying 1 and 2: a single worker only moves the work out of the
main process, so it is often no faster than none), then bisects between the best count and its neighbours, and finally
tries ``persistent_workers`` for multi-epoch runs. Both accept ``measure=`` (a function from a
:class:`LoaderConfig` to samples per second), which tests use to run them on a cost model.
"""

from __future__ import annotations

import itertools
import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from tqdm.auto import tqdm

from gpulab.data.workers import LoaderConfig, LoaderWarning, make_loader, measure_loader
from gpulab.devices.physical import cuda_device_count

__all__ = ["sweep_loader", "tune_loader", "SweepResult", "TuneResult"]

Measure = Callable[[LoaderConfig], float]


def _measure_with(dataset: Any, num_batches: int, epochs: int, seed: int, step_s: float = 0.0,
                  count_startup: bool = True) -> Measure:
    key = "samples_per_s" if count_startup else "steady_samples_per_s"

    def measure(cfg: LoaderConfig) -> float:
        with warnings.catch_warnings():  # the caller already warned once about the grid
            warnings.simplefilter("ignore", LoaderWarning)
            loader = make_loader(dataset, cfg, seed=seed, warn=False)
        return measure_loader(loader, num_batches=num_batches, epochs=epochs, step_s=step_s)[key]
    return measure


@dataclass
class SweepResult:
    """Every setting a sweep timed. ``rows`` are dicts of the config fields plus ``samples_per_s``."""

    rows: list[dict[str, Any]]

    @property
    def best(self) -> LoaderConfig:
        """The fastest setting."""
        row = max(self.rows, key=lambda r: r["samples_per_s"])
        return LoaderConfig(**{k: row[k] for k in LoaderConfig.__dataclass_fields__})

    @property
    def best_samples_per_s(self) -> float:
        return max(r["samples_per_s"] for r in self.rows)

    def table(self) -> str:
        """A text table, fastest first."""
        keys = list(LoaderConfig.__dataclass_fields__)
        lines = ["  ".join(f"{k:>18}" for k in keys + ["samples_per_s"])]
        for r in sorted(self.rows, key=lambda r: -r["samples_per_s"]):
            lines.append("  ".join(f"{str(r[k]):>18}" for k in keys) + f"  {r['samples_per_s']:>18.0f}")
        return "\n".join(lines)

    __str__ = table

    def plot(self, x: str = "num_workers", ax: Any = None) -> Any:
        """Throughput against ``x``, one line per combination of the other swept settings."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6.5, 3.5))
        varying = [k for k in LoaderConfig.__dataclass_fields__
                   if k != x and len({r[k] for r in self.rows}) > 1]
        groups: dict[tuple, list[dict]] = {}
        for r in self.rows:
            groups.setdefault(tuple(r[k] for k in varying), []).append(r)
        for key, rows in groups.items():
            rows = sorted(rows, key=lambda r: r[x])
            label = ", ".join(f"{k}={v}" for k, v in zip(varying, key)) or None
            ax.plot([r[x] for r in rows], [r["samples_per_s"] for r in rows], "o-", label=label)
        cores = os.cpu_count() or 1
        if x == "num_workers":
            ax.axvline(cores, color="grey", ls="--", lw=1)
            ax.text(cores, ax.get_ylim()[0], f" {cores} cores", color="grey", va="bottom", fontsize=8)
        ax.set(xlabel=x, ylabel="samples / s", title=f"loader throughput against {x}")
        if len(groups) > 1:
            ax.legend(fontsize=8)
        return ax.figure


def sweep_loader(
    dataset: Any,
    num_workers: Iterable[int] | None = None,
    pin_memory: Sequence[bool] = (False,),
    persistent_workers: Sequence[bool] = (False,),
    prefetch_factor: Sequence[int] = (2,),
    batch_size: Sequence[int] = (64,),
    *,
    num_batches: int = 16,
    epochs: int = 1,
    step_s: float = 0.0,
    count_startup: bool = True,
    measure: Measure | None = None,
    seed: int = 0,
    disable: bool = False,
) -> SweepResult:
    """Time the loader for every combination of the given settings (the loader alone, no model).

    Args:
        dataset: what the loaders read.
        num_workers: values to try (default ``0 .. os.cpu_count()``).
        pin_memory, persistent_workers, prefetch_factor, batch_size: values to try.
        num_batches: batches timed per epoch; ``epochs``: passes (start-ups are included, which
            is what ``persistent_workers`` changes).
        step_s: seconds the consumer holds each batch (see :func:`measure_loader`); 0 times the
            loader alone. ``prefetch_factor`` only shows an effect with a consumer: it is the
            number of batches each worker may have ready or in progress while the step runs.
        count_startup: include each epoch's wait for its first batch (worker start-up, what
            ``persistent_workers`` changes); False times the steady state only.
        measure: ``config -> samples/s`` instead of timing real loaders (cost models, tests).
        seed: shuffling seed.
        disable: turn the progress bar off.

    Returns:
        A :class:`SweepResult` (``.table()``, ``.best``, ``.plot()``).

    Warns:
        LoaderWarning: once for the whole grid, when a setting cannot help here.
    """
    cores = os.cpu_count() or 1
    workers = list(range(cores + 1)) if num_workers is None else list(num_workers)
    grid = [LoaderConfig(nw, pin, pers, pf, bs).effective()
            for nw, pin, pers, pf, bs in itertools.product(workers, pin_memory, persistent_workers,
                                                            prefetch_factor, batch_size)]
    grid = list(dict.fromkeys(grid))  # with 0 workers, persistent/prefetch collapse to one setting
    if measure is None:
        _warn_once(grid, cores)
        measure = _measure_with(dataset, num_batches, epochs, seed, step_s, count_startup)
    rows = []
    for cfg in tqdm(grid, desc="sweep_loader", disable=disable, leave=False):
        rows.append(dict(asdict(cfg), samples_per_s=float(measure(cfg))))
    return SweepResult(rows)


def _warn_once(grid: list[LoaderConfig], cores: int) -> None:
    over = sorted({c.num_workers for c in grid if c.num_workers > cores})
    if over:
        warnings.warn(f"num_workers={over} exceed this machine's {cores} cores: they are measured to show the "
                      "plateau, but the workers would take turns on the cores rather than add speed",
                      LoaderWarning, stacklevel=3)
    if any(c.pin_memory for c in grid):
        if cuda_device_count() == 0:
            warnings.warn("pin_memory=True needs a CUDA device; with none here it is turned off (so pinned and "
                          "unpinned settings measure the same)", LoaderWarning, stacklevel=3)


@dataclass
class TuneResult:
    """What :func:`tune_loader` tried and chose."""

    best: LoaderConfig
    samples_per_s: float
    trials: list[tuple[LoaderConfig, float]] = field(default_factory=list)

    def __str__(self) -> str:
        tried = ", ".join(f"{c.label()}: {v:.0f}" for c, v in self.trials)
        return f"best {self.best.label()} at {self.samples_per_s:.0f} samples/s after {len(self.trials)} trials ({tried})"


def tune_loader(
    dataset: Any = None,
    *,
    batch_size: int = 64,
    max_workers: int | None = None,
    epochs: int = 1,
    num_batches: int = 16,
    tolerance: float = 0.05,
    measure: Measure | None = None,
    seed: int = 0,
    disable: bool = False,
) -> TuneResult:
    """Find a fast setting with few trials (see the module docstring for the search).

    Args:
        dataset: what the loaders read (not needed with ``measure``).
        batch_size: fixed batch size (it changes the model's behaviour, so it is not tuned here).
        max_workers: the largest ``num_workers`` to try (default ``os.cpu_count()``).
        epochs: with 2 or more, ``persistent_workers=True`` is tried as well.
        num_batches: batches timed per epoch.
        tolerance: an improvement smaller than this share does not count.
        measure: ``config -> samples/s`` instead of timing real loaders.

    Returns:
        A :class:`TuneResult` with the best setting and every trial.
    """
    if dataset is None and measure is None:
        raise ValueError("pass a dataset to time real loaders, or measure= (config -> samples/s)")
    hi = max(0, (os.cpu_count() or 1) if max_workers is None else max_workers)
    measure = measure or _measure_with(dataset, num_batches, epochs, seed)
    seen: dict[LoaderConfig, float] = {}
    bar = tqdm(desc="tune_loader", disable=disable, leave=False)

    def trial(cfg: LoaderConfig) -> float:
        cfg = cfg.effective()
        if cfg not in seen:
            seen[cfg] = float(measure(cfg))
            bar.update(1)
        return seen[cfg]

    base = LoaderConfig(batch_size=batch_size)
    speed = {0: trial(base)}
    nw = 1
    while nw <= hi:  # double while it still pays; 1 worker only moves the work, so always try 2
        speed[nw] = trial(replace(base, num_workers=nw))
        if nw >= 2 and speed[nw] < max(v for k, v in speed.items() if k < nw) * (1 + tolerance):
            break
        nw *= 2
    best = max(speed, key=speed.get)
    lo_n, hi_n = max([k for k in speed if k < best], default=best), min([k for k in speed if k > best], default=best)
    for _ in range(4):  # bisect towards the peak between the best count and its neighbours
        mids = {(lo_n + best) // 2, (best + hi_n + 1) // 2} - set(speed)
        mids = {m for m in mids if 0 <= m <= hi}
        if not mids:
            break
        for m in mids:
            speed[m] = trial(replace(base, num_workers=m))
        new = max(speed, key=speed.get)
        lo_n = max([k for k in speed if k < new], default=new)
        hi_n = min([k for k in speed if k > new], default=new)
        best = new
    chosen = replace(base, num_workers=best)
    if epochs > 1 and best > 0:
        trial(replace(chosen, persistent_workers=True))
    bar.close()
    cfg, value = max(seen.items(), key=lambda kv: kv[1])
    return TuneResult(cfg, value, list(seen.items()))
