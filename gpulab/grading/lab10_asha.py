"""Lab 10's graders for the asynchronous ASHA scheduler the student writes (a Tune ``FIFOScheduler``
subclass, ``MyASHA(max_t, grace_period, reduction_factor)``).

Two kinds of evidence, neither read from the notebook's globals:

- :func:`scheduler_runs` replays result streams drawn from the grading run's seed
  (:func:`random_streams`: learning curves, seconds per epoch, workers, so the arrival order
  changes; rounded values, so ties happen; several reduction factors, grace periods, ``max_t`` and
  both modes) through the scheduler exactly as Tune's controller calls it, and records every
  decision. The reference kernel runs gpulab's :class:`~gpulab.hpo.asha.PromotionASHA` on the same
  streams; the judge compares the decisions one by one. While the student's scheduler runs, Tune's
  own ASHA bookkeeping (``async_hyperband._Bracket``) is counted: the exercise is to write the
  rule, and wrapping Tune's ``ASHAScheduler`` would decide differently anyway, but must not pass.
- :func:`tune_comparison` runs the scheduler in a real Tune search (a trainable that replays
  seeded curves, a few ms per epoch, 2 at a time), and sets beside it Tune's ``ASHAScheduler``
  on the same results and a search without stopping: the trials finished and the trial-epochs of
  each, which the test cell checks as ratios.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import tempfile
from typing import Any, Callable, Iterator

from gpulab.hpo.replay import replay_scheduler

__all__ = ["random_streams", "scheduler_runs", "stream_run", "counting_tune_asha", "comparison_case",
           "tune_comparison", "tune_search"]


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as err:  # the student's failure is the evidence, named by its case
        return err


def _curve(rng: random.Random, epochs: int, ties: bool) -> list[float]:
    """Accuracies that rise at their own speed (so curves cross), a little noise, rounded."""
    final, start, tau = rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.3), rng.uniform(0.3, 4.0)
    digits = 1 if ties else 3
    return [round(min(1.0, max(0.0, final - (final - start) * math.exp(-e / tau) + rng.gauss(0, 0.01))), digits)
            for e in range(1, epochs + 1)]


def random_streams(rng: random.Random, n: int) -> dict[str, dict[str, Any]]:
    """Search name -> the settings and results of an asynchronous search: ``max_t``,
    ``grace_period``, ``reduction_factor``, ``mode`` ("max" reports accuracy, "min" reports 1 -
    accuracy as ``loss``), ``curves`` (trial -> value per epoch), ``epoch_s`` and ``workers``.
    Every fourth search rounds its values to one decimal, so ties are common; now and then a
    trial diverges (NaN from some epoch on)."""
    out = {}
    for i in range(n):
        rf = rng.choice([2, 3, 3, 4])
        grace = rng.choice([1, 1, 2])
        max_t = rng.choice([8, 9, 12, 16])
        trials = rng.randint(6, 24)
        ties = i % 4 == 3
        curves = {f"trial_{j:03d}": _curve(rng, max_t, ties) for j in range(trials)}
        if rng.random() < 0.4:
            bad = rng.choice(list(curves))
            start = rng.randint(1, max_t)
            curves[bad] = curves[bad][:start - 1] + [float("nan")] * (max_t - start + 1)
        mode = rng.choice(["max", "min"])
        if mode == "min":
            curves = {t: [round(1 - v, 3) for v in c] for t, c in curves.items()}
        out[f"search {i + 1}: {trials} trials, max_t={max_t}, grace_period={grace}, reduction_factor={rf}, "
            f"mode={mode}{', ties' if ties else ''}"] = {
            "max_t": max_t, "grace_period": grace, "reduction_factor": rf, "mode": mode, "curves": curves,
            "workers": rng.randint(1, 4), "epoch_s": {t: round(rng.uniform(0.5, 2.0), 2) for t in curves}}
    return out


@contextlib.contextmanager
def counting_tune_asha() -> Iterator[list[str]]:
    """Count the calls into Tune's ASHA bookkeeping (``_Bracket``, which ``ASHAScheduler`` and any
    subclass or wrapper of it go through) made inside the block."""
    from ray.tune.schedulers import async_hyperband

    used: list[str] = []
    originals = {name: getattr(async_hyperband._Bracket, name) for name in ("__init__", "on_result")}

    def counted(name: str) -> Callable[..., Any]:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            used.append(name)
            return originals[name](self, *args, **kwargs)
        return call

    for name in originals:
        setattr(async_hyperband._Bracket, name, counted(name))
    try:
        yield used
    finally:
        for name, fn in originals.items():
            setattr(async_hyperband._Bracket, name, fn)


def stream_run(scheduler: Any, search: dict[str, Any]) -> dict[str, Any]:
    """:func:`gpulab.hpo.replay.replay_scheduler` on one search of :func:`random_streams`."""
    return replay_scheduler(scheduler, search["curves"], mode=search["mode"], workers=search["workers"],
                            epoch_s=search["epoch_s"])


def scheduler_runs(cls: Callable[..., Any], searches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Search name -> :func:`stream_run` of a fresh ``cls(max_t, grace_period=, reduction_factor=)``,
    with ``"Tune ASHA calls"``: how often Tune's own ASHA bookkeeping ran inside (0 for a rule
    written by hand). An exception is the search's value."""
    def one(s: dict[str, Any]) -> dict[str, Any]:
        with counting_tune_asha() as used:
            run = stream_run(cls(s["max_t"], grace_period=s["grace_period"], reduction_factor=s["reduction_factor"]), s)
        return {"Tune ASHA calls": len(used), **run}  # first: the message names it first

    return {name: _call(one, s) for name, s in searches.items()}


# ---- a real Tune search ------------------------------------------------------------------------

def comparison_case(rng: random.Random, trials: int = 12, max_t: int = 9) -> dict[str, Any]:
    """The configurations of the real search: each replays a seeded learning curve (``max_t``
    epochs), all with the same few milliseconds per epoch."""
    return {"max_t": max_t, "curves": [_curve(rng, max_t, ties=False) for _ in range(trials)], "epoch_s": 0.02}


def _replay_trainable() -> Callable[[dict[str, Any]], None]:
    """A Tune function trainable that reports ``config["curve"]`` one epoch at a time. Defined inside a
    function so that Ray ships it by value: its workers import neither gpulab nor torch."""
    def replay_curve(config: dict[str, Any]) -> None:
        import time as _time

        from ray import tune as _tune

        for value in config["curve"]:
            _time.sleep(config["epoch_s"])
            _tune.report({"accuracy": value})

    return replay_curve


def tune_search(scheduler: Any, case: dict[str, Any], *, concurrent: int = 2) -> dict[str, Any]:
    """One real Tune search of ``case``'s configurations with ``scheduler`` (None: no stopping).

    Returns:
        ``{"trials finished": trials that ran all max_t epochs, "trial-epochs": int, "best": float}``.

    Raises:
        RuntimeError: if Ray is not running in this kernel.
    """
    import ray
    from ray import tune

    if not ray.is_initialized():
        raise RuntimeError("Ray is not running: run the lab's first cell (ray_session) again")
    storage = tempfile.mkdtemp(prefix="gpulab-asha-")
    try:
        results = tune.Tuner(
            tune.with_resources(_replay_trainable(), {"cpu": 1 / concurrent}),
            param_space={"curve": tune.grid_search(case["curves"]), "epoch_s": case["epoch_s"]},  # in this order
            tune_config=tune.TuneConfig(metric="accuracy", mode="max", reuse_actors=True,
                                        max_concurrent_trials=concurrent, scheduler=scheduler),
            run_config=tune.RunConfig(storage_path=storage, verbose=0, name="asha-check")).fit()
        epochs = [r.metrics.get("training_iteration", 0) if r.metrics else 0 for r in results]
        best = max((r.metrics["accuracy"] for r in results if r.metrics and "accuracy" in r.metrics), default=0.0)
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    return {"trials finished": sum(e >= case["max_t"] for e in epochs), "trial-epochs": int(sum(epochs)),
            "best": float(best)}


def tune_comparison(cls: Callable[..., Any], case: dict[str, Any], *, concurrent: int = 2) -> dict[str, dict[str, Any]]:
    """``case`` searched by Tune with ``cls(max_t, grace_period=1, reduction_factor=3)`` as its
    scheduler (a real ``Tuner.fit()``), beside two baselines on the same configurations: Tune's
    ``ASHAScheduler`` (the same settings) fed the same results in the same arrival order by
    :func:`stream_run` (a second ``fit()`` would cost as much again in Ray's start-up), and no
    stopping, which runs every trial to ``max_t``."""
    from ray.tune.schedulers import ASHAScheduler

    max_t, curves = case["max_t"], case["curves"]
    with counting_tune_asha() as used:
        yours = tune_search(cls(max_t, grace_period=1, reduction_factor=3), case, concurrent=concurrent)
    stream = {"mode": "max", "workers": concurrent, "curves": {f"trial_{i:03d}": c for i, c in enumerate(curves)}}
    stream["epoch_s"] = {t: case["epoch_s"] for t in stream["curves"]}
    tunes = stream_run(ASHAScheduler(max_t=max_t, grace_period=1, reduction_factor=3), stream)
    finished = sum(len(d) == max_t for d in tunes["decisions"].values())
    return {"yours": {"Tune ASHA calls": len(used), **yours},
            "Tune's ASHAScheduler": {"trials finished": finished, "trial-epochs": tunes["trial_epochs"],
                                     "best": tunes["best"]},
            "no stopping": {"trials finished": len(curves), "trial-epochs": len(curves) * max_t,
                            "best": max(max(c) for c in curves)}}
