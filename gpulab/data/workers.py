"""Building and timing DataLoaders: ``LoaderConfig``, ``make_loader``, ``measure_loader``.

The knobs the source posts tuned by hand (one swept ``num_workers`` from 2 to 10 on 16 cores and
kept 4; another adds ``persistent_workers=True``) live in one dataclass, so a sweep or a tuner can
build a loader for each setting and time it the same way.

``make_loader`` explains the two settings that cannot help on this machine instead of passing
them through silently:

- ``num_workers`` above the core count: a warning with the reason (the workers and the main
  process take turns on the cores; each extra worker costs memory and start-up time);
- ``pin_memory=True`` without CUDA: there is no page-locked memory to copy from without a CUDA
  driver, so it is turned off, with one warning per call rather than one per epoch.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, replace
from time import perf_counter, sleep
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from gpulab.devices.batches import tree_tensors
from gpulab.devices.physical import cuda_device_count

__all__ = ["LoaderConfig", "make_loader", "measure_loader", "LoaderWarning"]


class LoaderWarning(UserWarning):
    """A loader setting that cannot help on this machine (the message says why)."""


@dataclass(frozen=True)
class LoaderConfig:
    """The DataLoader settings that decide input-pipeline speed.

    Attributes:
        num_workers: worker processes building batches (0: the main process does it).
        pin_memory: put batches in page-locked memory, which a GPU can copy asynchronously.
        persistent_workers: keep workers alive between epochs instead of starting them again.
        prefetch_factor: batches each worker prepares ahead (ignored with 0 workers).
        batch_size: samples per batch.
    """

    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int = 2
    batch_size: int = 64

    def __post_init__(self) -> None:
        for name in ("num_workers", "prefetch_factor", "batch_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if name == "num_workers" else 1):
                raise ValueError(f"{name} must be an int >= {0 if name == 'num_workers' else 1}, got {v!r}")

    def effective(self) -> "LoaderConfig":
        """The same setting with the knobs that do not apply to 0 workers reset to their defaults."""
        if self.num_workers == 0:
            return replace(self, persistent_workers=False, prefetch_factor=2)
        return self

    def label(self) -> str:
        """A short label for tables and plots."""
        parts = [f"w={self.num_workers}", f"bs={self.batch_size}"]
        if self.pin_memory:
            parts.append("pin")
        if self.num_workers and self.persistent_workers:
            parts.append("persistent")
        if self.num_workers and self.prefetch_factor != 2:
            parts.append(f"prefetch={self.prefetch_factor}")
        return " ".join(parts)


def make_loader(dataset: Dataset, config: LoaderConfig | None = None, *, shuffle: bool = True, seed: int = 0,
                warn: bool = True, **overrides: Any) -> DataLoader:
    """A DataLoader for ``config`` (fields may be overridden by keyword).

    Args:
        dataset: the dataset.
        config: the settings (default :class:`LoaderConfig`).
        shuffle: reshuffle every epoch (seeded by ``seed`` for reproducible runs).
        warn: emit :class:`LoaderWarning` for settings that cannot help here.
        **overrides: e.g. ``num_workers=2``.

    Warns:
        LoaderWarning: ``num_workers`` above ``os.cpu_count()``; ``pin_memory`` without CUDA.
    """
    cfg = replace(config or LoaderConfig(), **overrides).effective()
    cores = os.cpu_count() or 1
    if warn and cfg.num_workers > cores:
        warnings.warn(f"num_workers={cfg.num_workers} but this machine has {cores} cores: the workers and the main "
                      f"process would take turns on the cores, so extra workers add start-up time, memory and context "
                      f"switches without adding speed; use at most {cores}", LoaderWarning, stacklevel=2)
    pin = cfg.pin_memory and cuda_device_count() > 0
    if warn and cfg.pin_memory and not pin:
        warnings.warn("pin_memory=True needs a CUDA device: page-locked memory only speeds up copies to a GPU, and "
                      "this machine has none, so it is turned off", LoaderWarning, stacklevel=2)
    kwargs: dict[str, Any] = {}
    if cfg.num_workers > 0:
        kwargs.update(persistent_workers=cfg.persistent_workers, prefetch_factor=cfg.prefetch_factor)
    loader = _QuietLoader(dataset, batch_size=cfg.batch_size, shuffle=shuffle, num_workers=cfg.num_workers,
                          pin_memory=pin, generator=torch.Generator().manual_seed(seed), **kwargs)
    loader.config = cfg
    return loader


class _QuietLoader(DataLoader):
    """A DataLoader whose own too-many-workers warning is left to :func:`make_loader` (which
    warns once, with the reason) instead of repeating at every epoch."""

    config: LoaderConfig

    def check_worker_number_rationality(self) -> None:
        pass


def measure_loader(loader: Any, num_batches: int | None = None, epochs: int = 1, step_s: float = 0.0) -> dict[str, Any]:
    """Time iterating ``loader``: start-up and steady throughput per epoch.

    With ``step_s=0`` the loader is timed alone (the main process takes each batch as soon as it
    is ready). With ``step_s > 0`` the main process holds each batch for ``step_s`` seconds (a
    sleep, standing for a training step that keeps the host waiting on the device), which is
    when a prefetch queue matters: workers fill it while the step runs, and a slow batch is
    hidden if the queue holds enough batches that were ready earlier.

    Args:
        loader: any iterable of batches; re-iterated each epoch.
        num_batches: batches per epoch (default: all).
        epochs: passes; with ``persistent_workers=False`` every pass starts the workers again.
        step_s: seconds the consumer spends on each batch (0: the loader alone).

    Returns:
        ``startup_s`` (time to the first batch, per epoch), ``epoch_s`` (per epoch),
        ``samples_per_s`` (all samples / all time, start-ups included) and
        ``steady_samples_per_s`` (after each epoch's first batch).
    """
    if step_s < 0:
        raise ValueError(f"step_s must be >= 0 seconds, got {step_s!r}")
    startups, epochs_s, samples, steady_t, steady_n = [], [], 0, 0.0, 0
    for _ in range(epochs):
        t0 = perf_counter()
        first = None
        for k, batch in enumerate(loader):
            n = _batch_len(batch)
            now = perf_counter()
            if first is None:
                first = now
                startups.append(now - t0)
            else:
                steady_n += n
            samples += n
            if num_batches is not None and k + 1 >= num_batches:
                break
            if step_s:
                sleep(step_s)  # the training step: the next batch is taken only after it
        end = perf_counter()
        epochs_s.append(end - t0)
        if first is not None:
            steady_t += end - first
    total = sum(epochs_s)
    return {"startup_s": startups, "epoch_s": epochs_s, "samples": samples,
            "samples_per_s": samples / total if total > 0 else 0.0,
            "steady_samples_per_s": steady_n / steady_t if steady_t > 0 else 0.0}


def _batch_len(batch: Any) -> int:
    tensors = tree_tensors(batch)  # the first tensor's rows; a batch without tensors counts as one sample
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1
