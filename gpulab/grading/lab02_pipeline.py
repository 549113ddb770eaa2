"""Lab 02's make_pipeline graders: an epoch of the student's ``(loader, step_fn)`` copied through an
accelerator that records what crosses and what the model receives (:class:`PipelineRecorder`),
summed up by :func:`run_epoch` as a result that depends on every sample delivered and on the seed,
but not on the order or on the random augmentation (:func:`canonical_digests`), so that it equals the
reference pipeline's for the same seed.

- :func:`probe_pipeline`: two untimed epochs of a small setup (what crossed, what the model got);
- :func:`timed_setup`: the workload whose epochs the grader times (``grading.check_measured``,
  rule ``measure.wall``): modelled device time, which a busy CPU does not stretch, is its floor.

Re-exported by :mod:`gpulab.grading.lab02`. Nothing here decides a verdict.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

import numpy as np
import torch

from gpulab.accel.base import Accelerator
from gpulab.data.crossing import TransferLog, sample_fingerprints
from gpulab.data.pipelines import PipelineSetup
from gpulab.data.workers import make_loader
from gpulab.devices.batches import tree_tensors
from gpulab.grading.lab02_reuse import outcome

__all__ = ["PAD", "canonical_digests", "PipelineRecorder", "run_epoch", "probe_pipeline", "timed_setup"]

PAD = 4  # SyntheticImages' crop padding: an augmented image is its decoded image shifted by at most 4 pixels


def canonical_digests(images: np.ndarray, pad: int = PAD) -> np.ndarray:
    """One 64-bit digest per augmented image that is the same for every crop and flip of the same
    decoded image.

    ``SyntheticImages`` augments by shifting the image by up to ``pad`` pixels each way (the
    uncovered border is zero; a decoded pixel never is) and flipping it horizontally. The zero
    rows and columns give the shift back, so the central ``(H - 2 pad, W - 2 pad)`` region of the
    decoded image can be cut out of any augmented copy, up to the flip; the digest is the sum of
    the fingerprints of that region and of its mirror image.

    Args:
        images: ``(B, C, H, W)`` uint8.
    """
    u = np.ascontiguousarray(images, dtype=np.uint8)
    b, c, h, w = u.shape
    if b == 0 or h <= 2 * pad or w <= 2 * pad:
        return np.zeros(b, dtype=np.uint64)
    zero = u == 0
    rows, cols = zero.all(axis=(1, 3)), zero.all(axis=(1, 2))  # (B, H), (B, W): padding lines

    def lead(mask: np.ndarray) -> np.ndarray:
        return np.where(mask.all(axis=1), 0, np.argmax(~mask, axis=1))

    dr = np.clip(lead(rows) - lead(rows[:, ::-1]), -pad, pad)  # top zeros - bottom zeros
    dc = np.clip(lead(cols) - lead(cols[:, ::-1]), -pad, pad)
    r_idx = pad + dr[:, None] + np.arange(h - 2 * pad)  # (B, h') rows of the central region
    c_idx = pad + dc[:, None] + np.arange(w - 2 * pad)
    region = np.take_along_axis(u, np.broadcast_to(r_idx[:, None, :, None], (b, c, h - 2 * pad, w)), axis=2)
    region = np.take_along_axis(
        region, np.broadcast_to(c_idx[:, None, None, :], (b, c, h - 2 * pad, w - 2 * pad)), axis=3
    )
    mirror = region[..., ::-1]
    return sample_fingerprints(torch.from_numpy(np.ascontiguousarray(region))) + sample_fingerprints(
        torch.from_numpy(np.ascontiguousarray(mirror))
    )


class PipelineRecorder(TransferLog):
    """The accelerator a graded pipeline gets: everything is delegated to ``accel``; per run it
    records the dtype and shape of the images that cross, the labels that cross, the dtype the
    model receives, and a digest of every image the model receives (un-normalised with the setup's
    mean and std, then :func:`canonical_digests`)."""

    def __init__(self, accel: Accelerator, setup: PipelineSetup, num_classes: int = 10) -> None:
        super().__init__(accel)
        self.setup, self.num_classes = setup, num_classes
        self._mean = torch.tensor(setup.mean, dtype=torch.float32)[:, None, None]  # (C, 1, 1)
        self._std = torch.tensor(setup.std, dtype=torch.float32)[:, None, None]
        self._previous: set[int] = set()
        self.begin_run(0)

    def begin_run(self, seed: int) -> None:
        """Start recording one run; ``seed`` keys the digest (the result differs for every seed)."""
        self._key = np.uint64(random.Random(f"digest:{seed}").getrandbits(64))
        self._digests: list[np.ndarray] = []
        self._labels = np.zeros(self.num_classes + 1, dtype=np.int64)  # the last: labels out of range
        self._crossed: Counter[str] = Counter()
        self._model: Counter[str] = Counter()
        self._shape: tuple[int, ...] | None = None
        self._prints_now: list[np.ndarray] = []
        self._pending: list[tuple[torch.Tensor, Any]] = []  # (pinned host copy, CUDA event), oldest first

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        tensors = tree_tensors(batch)
        if tensors:
            images = max(tensors, key=lambda t: t.numel() * t.element_size())  # (B, C, H, W)
            self._crossed[str(images.dtype).removeprefix("torch.")] += 1
            self._shape = self._shape or tuple(images.shape)
            self._prints_now.append(sample_fingerprints(images))
            for t in tensors:
                if t is not images and not t.is_floating_point() and t.dim() == 1:  # the labels
                    y = t.detach().cpu().long().numpy()
                    self._labels += np.bincount(np.clip(y, 0, self.num_classes), minlength=self.num_classes + 1)
        return super().copy(batch, non_blocking=non_blocking)

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> Any:
        if isinstance(inputs, torch.Tensor):
            self._model[str(inputs.dtype).removeprefix("torch.")] += 1
            if inputs.dim() == 4 and inputs.shape[1] == self._mean.shape[0]:
                if inputs.device.type == "cuda":
                    # .cpu() here would wait for the GPU's queue at every step, so the host could never
                    # run ahead of the device (seen on an H200: every pipeline 0.71x of the device's
                    # time). Queue the copy into pinned memory instead; digest it once it has landed.
                    host = torch.empty(inputs.shape, dtype=inputs.dtype, pin_memory=True)
                    host.copy_(inputs.detach(), non_blocking=True)
                    landed = torch.cuda.Event()
                    landed.record()
                    self._pending.append((host, landed))
                else:
                    self._digest(inputs.detach().cpu())
            self._digest_landed(wait=False)
        else:
            self._model["none"] += 1
        return super().compute(seconds, inputs)

    def _digest(self, x: torch.Tensor) -> None:
        u = x.float() if not x.is_floating_point() else ((x.float() * self._std + self._mean) * 255).round()
        # (uint8 inputs were not normalised: digested as they are)
        self._digests.append(canonical_digests(u.clamp(0, 255).to(torch.uint8).numpy()))

    def _digest_landed(self, wait: bool) -> None:
        """Digest the queued read-backs whose copy has finished (all of them with ``wait``), in order."""
        while self._pending and (wait or self._pending[0][1].query()):
            host, landed = self._pending.pop(0)
            if wait:
                landed.synchronize()
            self._digest(host)

    def end_run(self) -> dict[str, Any]:
        """What this run delivered: a result that depends on every image the model received and on
        the seed, not on their order or on the random crops and flips."""
        self._digest_landed(wait=True)
        digests = np.concatenate(self._digests) if self._digests else np.zeros(0, dtype=np.uint64)
        with np.errstate(over="ignore"):
            mixed = ((digests ^ self._key) * np.uint64(0x9E3779B97F4A7C15)).sum(dtype=np.uint64)
        prints = np.concatenate(self._prints_now) if self._prints_now else np.zeros(0, dtype=np.uint64)
        repeats = int(np.isin(prints, np.fromiter(self._previous, dtype=np.uint64, count=len(self._previous))).sum())
        self._previous = set(prints.tolist())
        return {
            "images the model received": int(len(digests)),
            "digest of those images": int(mixed) >> 11,
            "labels that crossed (count per class)": self._labels.tolist(),
            "dtype of the images that crossed": sorted(self._crossed),
            "dtype the model received": sorted(self._model),
            "most images the same bytes as in the run before": repeats > len(prints) // 4,
        }


def run_epoch(
    pipeline: tuple[Any, Callable[[Any], Any]], recorder: PipelineRecorder, seed: int, non_blocking: bool = True
) -> dict[str, Any]:
    """One epoch of ``(loader, step_fn)`` built on ``recorder``: each batch copied through it
    (``non_blocking`` as the lab's profiles do: False for the baseline), the queue drained at the
    end; returns :meth:`PipelineRecorder.end_run`."""
    loader, step_fn = pipeline
    recorder.begin_run(seed)
    for batch in loader:
        step_fn(recorder.copy(batch, non_blocking=non_blocking))
    recorder.synchronize()
    return recorder.end_run()


def probe_pipeline(
    make_pipeline: Callable[[PipelineSetup, Any], tuple[Any, Callable]],
    setup: PipelineSetup,
    accel: Accelerator,
    epochs: int = 2,
) -> dict[str, Any]:
    """Build ``make_pipeline(setup, recorder)`` and run ``epochs`` epochs, untimed: the shape of the
    first image batch that crossed, and each epoch's :func:`run_epoch` result."""
    recorder = PipelineRecorder(accel, setup)
    pipeline = make_pipeline(setup, recorder)
    if not (isinstance(pipeline, tuple) and len(pipeline) == 2 and callable(pipeline[1])):
        return {"make_pipeline returned": f"{type(pipeline).__name__}, not a tuple (loader, step_fn)"}

    out: dict[str, Any] = {"len(loader)": outcome(len, pipeline[0])}
    for epoch in range(1, epochs + 1):
        out[f"epoch {epoch}"] = run_epoch(pipeline, recorder, epoch)
    out["shape of the first image batch that crossed"] = recorder._shape
    return out


def timed_setup(
    rng: random.Random,
    accel: Accelerator,
    compute_s: float = 0.012,
    device_share: float = 0.25,
    batch_size: int = 64,
    steps: tuple[int, int] = (20, 28),
) -> PipelineSetup:
    """A workload drawn from ``rng`` for the grader's timed epochs: ``steps`` batches (drawn in that
    range), a device step of exactly ``compute_s`` in every kernel (so that an epoch's device time,
    the timed check's floor and the base of its bound, is known), and decoding calibrated here so
    that a baseline batch costs this machine's CPU about ``compute_s / device_share`` (the lab's
    ratio): a pipeline that decodes on every read then takes several times the device's work. On the simulated accelerator the link is
    set as :func:`~gpulab.data.pipelines.calibrate` sets it (a float32 batch takes a sixth of a step).

    The decode work changes nothing the pipelines deliver, so the results stay comparable between
    kernels that calibrate differently.
    """
    n = rng.randint(*steps)  # enough steps that the first batch, before the device has work, is a small share
    setup = PipelineSetup(
        num_samples=n * batch_size, batch_size=batch_size, compute_s=compute_s, seed=rng.randrange(2**20)
    )

    def batch_s(repeats: int) -> float:  # a baseline batch's CPU time at this many decodes per sample
        ds = replace(setup, decode_repeats=repeats).dataset(normalize_on_cpu=True)
        it, times = iter(make_loader(ds, batch_size=batch_size, seed=setup.seed, warn=False)), []
        for _ in range(5):
            t0 = time.perf_counter()
            next(it)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])  # the first warms up

    lo, hi = batch_s(4), batch_s(32)
    per_repeat = max(1e-5, (hi - lo) / 28)
    target = compute_s / device_share
    repeats = max(1, min(1024, round((target - (lo - 4 * per_repeat)) / per_repeat)))
    if getattr(accel, "kind", None) == "simulated":
        float_bytes = batch_size * 4 * 3 * 32 * 32
        accel.h2d_bytes_per_s = float_bytes / (compute_s / 6)
    return replace(setup, decode_repeats=repeats, batch_cpu_s=lo + (repeats - 4) * per_repeat)
