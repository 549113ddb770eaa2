"""Lab 02's first exercise, gpulab's version (the reference its hidden tests compare with): time
torch's own ``DataLoader`` at each ``num_workers``, and choose the fewest workers that load about
as fast as the best.

    rates = sweep_workers(dataset, range(0, 5), batch_size=64, num_batches=10)  # {0: 1650.2, 1: 1250.9, ...}
    workers = pick_workers(rates)                                               # 0 on a busy 2-core machine

:func:`gpulab.data.tuning.sweep_loader` and ``tune_loader`` are the instruments the lab shows beside
it: the same measurement over more settings, with a table, a plot and a search.

    .venv/bin/python -m pytest tests/grading/test_lab02.py -k "sweep or pick"
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch
from torch.utils.data import DataLoader

from gpulab.data.workers import measure_loader

__all__ = ["sweep_workers", "pick_workers"]


def sweep_workers(dataset: Any, worker_counts: Iterable[int], *, batch_size: int, num_batches: int,
                  epochs: int = 2, seed: int = 0) -> dict[int, float]:
    """Samples per second of a shuffled ``DataLoader`` over ``dataset`` for each ``num_workers``.

    Each count gets a loader of its own with ``persistent_workers`` (when it has workers), read for
    ``epochs`` epochs of ``num_batches`` batches; the clock runs from before the first epoch to after
    the last, so the workers' start-up is paid once and counted, as in training.

    Args:
        dataset: a map-style dataset of ``(input, label)`` samples.
        worker_counts: the ``num_workers`` values, in the order they are timed.
        batch_size, num_batches, epochs: what each loader reads.
        seed: the shuffling seed (the same order for every count).

    Returns:
        ``{num_workers: samples per second}`` in the order of ``worker_counts``.
    """
    rates: dict[int, float] = {}
    for k in worker_counts:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=k, persistent_workers=k > 0,
                            generator=torch.Generator().manual_seed(seed))
        rates[int(k)] = measure_loader(loader, num_batches=num_batches, epochs=epochs)["samples_per_s"]
        del loader  # its persistent workers exit with it, before the next count starts its own
    return rates


def pick_workers(rates: Mapping[int, float], slack: float = 0.05) -> int:
    """The fewest workers whose rate is within ``slack`` of the best: ``rate >= (1 - slack) * best``.

    A worker costs a core and a copy of the dataset's memory, so a difference smaller than the
    measurement's noise does not buy one.

    Raises:
        ValueError: for no rates, or a ``slack`` outside ``[0, 1)``.
    """
    if not rates:
        raise ValueError("no rates to choose from: sweep at least one num_workers")
    if not 0 <= slack < 1:
        raise ValueError(f"slack must be in [0, 1) (a share of the best rate), got {slack!r}")
    best = max(rates.values())
    return min(k for k, rate in rates.items() if rate >= (1 - slack) * best)
