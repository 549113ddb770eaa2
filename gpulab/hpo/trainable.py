"""The trainable every search in lab 10 runs: a small MLP on the kit's synthetic images.

A *trial* trains one configuration (learning rate, width, ...) for up to ``epochs`` epochs and
reports the validation accuracy after each one, with a checkpoint, so that:

- a scheduler (ASHA) can stop it after any epoch, and every search can be counted in
  **trial-epochs** (the unit of work, whatever the hardware);
- Tune can restore it from its last checkpoint (after a crash with ``FailureConfig``, or
  ``Tuner.restore``) and continue at the next epoch, not from scratch.

The data are :class:`gpulab.data.synthetic.SyntheticImages` (stripe patterns whose angle and
frequency encode the class) made small and noisy: 8x8 grey images, 10 classes, Gaussian noise,
so accuracy depends on the learning rate and the width, and keeps rising for several epochs.
Every trial uses the same seed, so two trials differ only by their hyperparameters, and a
configuration gives the same curve in a Ray worker as in this process (:func:`run_trial`).

    from ray import tune
    from gpulab.hpo import train_classifier
    tuner = tune.Tuner(train_classifier, param_space={"lr": tune.loguniform(1e-3, 1), "epochs": 9})

``io_wait_ms`` makes every step wait for its batch, as a trial does whose input pipeline (lab
02) or storage (lab 03) is slow: the trial then leaves its share of the CPU or GPU idle, which
is what packing several trials per device (fractional resources) recovers.
"""

from __future__ import annotations

import copy
import functools
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from gpulab.data.synthetic import SyntheticImages
from gpulab.devices import default_device
from gpulab.hpo.resources import visible_devices
from gpulab.models import MLP

__all__ = ["DEFAULTS", "SearchData", "make_data", "run_trial", "train_classifier", "TrialCrash"]

DEFAULTS: dict[str, Any] = {
    "lr": 0.03,            # SGD learning rate
    "width": 32,           # hidden units of the MLP
    "momentum": 0.9,
    "batch_size": 32,
    "epochs": 9,           # the most a trial runs (ASHA's max_t)
    "io_wait_ms": 0.0,     # wait per step for the next batch (a slow input pipeline)
    "crash_at_epoch": 0,   # >0: raise after this epoch, unless restored from a checkpoint
    "seed": 0,
}


class TrialCrash(RuntimeError):
    """Raised by a trial configured with ``crash_at_epoch`` (to show and test failures)."""


@dataclass(frozen=True)
class SearchData:
    """Flattened images, standardised, split into training and validation sets (CPU tensors)."""

    X_train: torch.Tensor  # (N_train, H * W) float32
    y_train: torch.Tensor  # (N_train,) int64
    X_val: torch.Tensor
    y_val: torch.Tensor
    num_classes: int


@functools.lru_cache(maxsize=4)  # one copy per worker process: trials reuse their actor's data
def make_data(num_samples: int = 2048, val_fraction: float = 0.25, image_size: int = 8, num_classes: int = 10,
              noise: float = 1.5, seed: int = 0) -> SearchData:
    """The search's dataset, deterministic from ``seed``.

    Raises:
        ValueError: for a ``val_fraction`` outside (0, 1) or fewer than 2 samples per split.
    """
    n_val = int(num_samples * val_fraction)
    if not 0 < val_fraction < 1 or n_val < 2 or num_samples - n_val < 2:
        raise ValueError(f"need 0 < val_fraction < 1 and 2+ samples per split, got num_samples={num_samples}, "
                         f"val_fraction={val_fraction}")
    ds = SyntheticImages(num_samples, image_size=image_size, channels=1, num_classes=num_classes, augment=False, seed=seed)
    X = torch.stack([ds.load(i)[0] for i in range(num_samples)]).float().flatten(1)  # (N, H * W)
    X = (X - X.mean()) / X.std()
    X = X + noise * torch.randn(X.shape, generator=torch.Generator().manual_seed(seed + 1))  # a hard task
    y = torch.as_tensor(ds.labels, dtype=torch.int64)
    return SearchData(X[n_val:], y[n_val:], X[:n_val], y[:n_val], num_classes)


def _accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(X).argmax(dim=1) == y).float().mean().item()  # a sync, once per epoch


def run_trial(config: Mapping[str, Any], report: Callable[[dict[str, float], dict[str, Any]], None],
              state: Mapping[str, Any] | None = None, device: torch.device | None = None) -> None:
    """Train one configuration, calling ``report(metrics, state)`` after every epoch.

    Args:
        config: keys of :data:`DEFAULTS` (missing ones take the default).
        report: receives ``{"accuracy", "loss", "epoch", "epoch_s"}`` and a state dict that
            restarts training after that epoch.
        state: such a state dict, to continue a trial instead of starting it.
        device: where to train (default: the first GPU, else the CPU).

    Raises:
        ValueError: for an unknown key, a non-positive lr, width, batch_size or epochs.
        TrialCrash: at ``crash_at_epoch`` when not restored.
    """
    unknown = set(config) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown config keys {sorted(unknown)}; the trainable takes {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **config}
    for key in ("lr", "width", "batch_size", "epochs"):
        if not cfg[key] > 0:
            raise ValueError(f"{key} must be positive, got {cfg[key]!r}")
    device = device or default_device()
    data = make_data()
    torch.manual_seed(cfg["seed"])  # every trial starts from the same weights
    model = MLP([data.X_train.shape[1], int(cfg["width"]), data.num_classes]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=float(cfg["lr"]), momentum=float(cfg["momentum"]))
    gen = torch.Generator().manual_seed(cfg["seed"])
    first = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        first = int(state["epoch"])
    X_train, y_train = data.X_train.to(device), data.y_train.to(device)
    X_val, y_val = data.X_val.to(device), data.y_val.to(device)
    bs, wait = int(cfg["batch_size"]), float(cfg["io_wait_ms"]) / 1e3
    for epoch in range(first, int(cfg["epochs"])):
        t0 = time.perf_counter()
        model.train()
        order = torch.randperm(len(X_train), generator=gen).to(device)
        total = torch.zeros((), device=device)
        for i in range(0, len(order), bs):
            if wait:
                time.sleep(wait)  # waiting for the next batch: this trial's device share idles
            idx = order[i:i + bs]
            loss = nn.functional.cross_entropy(model(X_train[idx]), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach()  # no per-step sync
        model.eval()
        acc = _accuracy(model, X_val, y_val)
        if cfg["crash_at_epoch"] and epoch + 1 == cfg["crash_at_epoch"] and state is None:
            raise TrialCrash(f"trial crashed after epoch {epoch + 1} (crash_at_epoch={cfg['crash_at_epoch']})")
        steps = (len(order) + bs - 1) // bs
        metrics = {"accuracy": acc, "loss": total.item() / steps, "epoch": epoch + 1,
                   "epoch_s": time.perf_counter() - t0}
        # copies: state_dict() shares storage with the live model, which keeps training
        report(metrics, copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                       "generator": gen.get_state(), "epoch": epoch + 1}))


def train_classifier(config: dict[str, Any]) -> None:
    """Ray Tune function trainable: :func:`run_trial` reporting to Tune with a checkpoint per
    epoch, and continuing from Tune's checkpoint when the trial is restored.

    Runs in a Ray worker process; it uses one torch thread, so that a trial given one CPU
    (or half of one) does not spread over every core. It trains on the first GPU it can see, else
    the CPU, and reports with its metrics where it trained (``device``) and which GPUs it could
    see (:func:`gpulab.hpo.resources.visible_devices`), for
    :func:`~gpulab.hpo.resources.check_trial_devices` to compare with its resource request.
    """
    from ray import tune

    torch.set_num_threads(1)
    device = default_device()  # Ray has set CUDA_VISIBLE_DEVICES to the GPUs this trial was given
    seen = {"device": str(device), **visible_devices()}
    state = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / "state.pt", weights_only=False)

    def report(metrics: dict[str, float], trial_state: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            torch.save(trial_state, os.path.join(folder, "state.pt"))
            tune.report({**metrics, **seen}, checkpoint=tune.Checkpoint.from_directory(folder))

    run_trial(config, report, state, device=device)
