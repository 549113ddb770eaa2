"""gpulab.data.tuning: tune_loader finds the sweep's best within 5 % in few trials on known cost models;
the sweep's table, plot and a real run."""

from __future__ import annotations

import matplotlib
import pytest

from gpulab.data.loading import sweep_loader, tune_loader
from gpulab.data.synthetic import SyntheticImages

matplotlib.use("Agg")


COST_MODELS = {
    # samples/s as a function of the setting: a peak, a plateau, "more is better", "workers hurt"
    "peak_at_6": lambda c: 100 + 120 * min(c.num_workers, 6) - 30 * max(0, c.num_workers - 6),
    "plateau_after_4": lambda c: 100 + 200 * min(c.num_workers, 4) + c.num_workers,
    "monotonic": lambda c: 50 + 10 * c.num_workers,
    "workers_hurt": lambda c: 1000 - 50 * c.num_workers,
    "persistent_pays": lambda c: 100 + 100 * min(c.num_workers, 3) + 150 * c.persistent_workers,
}


@pytest.mark.parametrize("name", list(COST_MODELS))
def test_tune_finds_the_sweeps_best_within_5_percent_with_few_trials(name) -> None:
    model = COST_MODELS[name]
    sweep = sweep_loader(None, num_workers=range(17), persistent_workers=(False, True), measure=model, disable=True)
    tuned = tune_loader(measure=model, max_workers=16, epochs=2, disable=True)
    assert tuned.samples_per_s >= 0.95 * sweep.best_samples_per_s, (str(tuned), sweep.best)
    assert len(tuned.trials) <= 12 < len(sweep.rows)


def test_sweep_table_plot_and_a_real_run() -> None:
    ds = SyntheticImages(32)
    res = sweep_loader(ds, num_workers=(0, 1), batch_size=(8,), num_batches=2, disable=True)
    assert len(res.rows) == 2 and all(r["samples_per_s"] > 0 for r in res.rows)
    assert res.best.num_workers in (0, 1) and "samples_per_s" in res.table()
    assert res.plot().axes[0].lines


def test_tune_needs_a_dataset_or_a_measure() -> None:
    with pytest.raises(ValueError, match="measure="):
        tune_loader()
