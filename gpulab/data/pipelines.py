"""Lab 02's two reference input pipelines, calibrated to the machine that runs them.

- :func:`baseline_pipeline`: what most first training scripts do. ``num_workers=0``, every sample
  decoded, augmented *and normalised to float32 on the CPU*, a blocking float32 copy.
- :func:`tuned_pipeline`: the fixes together. Decoded images cached in memory, uint8 batches, a
  non-blocking copy (from pinned memory on a GPU), normalisation on the device; workers optional.
Both feed the same step, timed by :func:`calibrate` (see the comment below the imports).

    use_one_thread_if_simulated(accel)                 # see below
    setup = calibrate(accel)                           # PipelineSetup with compute_s (+ bandwidth)
    loader, step_fn = baseline_pipeline(setup, accel)
    prof = profile_loop(loader, step_fn, accel, warmup_steps=2)

    .venv/bin/python -m pytest tests/data/test_pipelines.py
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch

from gpulab.accel import as_accelerator
from gpulab.data.caching import InMemoryCache
from gpulab.data.crossing import TransferLog
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.transfer import to_device_normalize
from gpulab.data.workers import LoaderConfig, make_loader
from gpulab.devices.physical import cuda_device_count
from gpulab.profiling import profile_loop
from gpulab.profiling.result import LoopProfile

# Why workers are optional in the tuned pipeline: once decoding is cached, what is left per batch
# is about a millisecond of cropping, less than what handing batches between processes costs on a
# 2-core machine.
#
# Both pipelines feed the same step: ``accel.compute(compute_s, inputs)``, standing for the model.
# ``calibrate`` measures what one baseline batch costs this machine's CPU (median of a few) and
# sets the model's device time to a quarter of it, and, on the simulated accelerator, the
# host-to-device bandwidth so that a float32 batch takes a sixth of the device time. Those ratios,
# not absolute speeds, decide every figure of the lab: the baseline is data-bound on a laptop and
# on a server alike, a float32 transfer alone caps the device at 6/7 busy (below 0.9), and the
# uint8 one at 24/25. On a real GPU only the device time is set; the copy costs what the hardware
# makes it cost.

__all__ = ["PipelineSetup", "use_one_thread_if_simulated", "calibrate", "baseline_pipeline", "tuned_pipeline", "model_step", "compare_pipelines",
           "Comparison"]

MEAN = (0.49, 0.48, 0.45)  # per channel, for images scaled to [0, 1]
STD = (0.25, 0.24, 0.26)


@dataclass(frozen=True)
class PipelineSetup:
    """The workload both pipelines share.

    Attributes:
        num_samples, batch_size: ``num_samples // batch_size`` steps per epoch.
        decode_repeats: CPU cost of decoding one sample (see :class:`SyntheticImages`).
        compute_s: device time of one step (the "model"), set by :func:`calibrate`.
        batch_cpu_s: what one baseline batch cost the CPU when calibrated (for reports).
        mean, std: normalisation constants.
    """

    num_samples: int = 2560
    batch_size: int = 64
    decode_repeats: int = 16
    compute_s: float = 0.010
    batch_cpu_s: float | None = None
    mean: tuple[float, ...] = MEAN
    std: tuple[float, ...] = STD
    seed: int = 0

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    def dataset(self, normalize_on_cpu: bool) -> SyntheticImages:
        """The synthetic images: float32 normalised on the CPU (baseline) or uint8."""
        norm = (self.mean, self.std) if normalize_on_cpu else None
        return SyntheticImages(self.num_samples, decode_repeats=self.decode_repeats, normalize=norm, seed=self.seed)


def use_one_thread_if_simulated(accel: Any) -> int:
    """On the simulated accelerator, run torch's CPU ops on one thread; returns the thread count.

    The simulated device's own work (normalising a batch "on the device") runs on this CPU. A
    torch op on a whole batch (~200 k values) fans out to the intra-op thread pool, and when the
    other core is busy (a DataLoader worker, another process) the op waits milliseconds for the
    second thread: a stall a real GPU kernel would not have, which would show up as host time in
    every step. One thread costs little here (the batch ops take a fraction of a millisecond) and
    keeps the figures about the pipeline. Call it before :func:`calibrate`. On a real GPU nothing
    changes.
    """
    if getattr(accel, "kind", None) == "simulated":
        torch.set_num_threads(1)
    return torch.get_num_threads()


def model_step(accel: Any, compute_s: float) -> Callable[[Any], Any]:
    """The stand-in model: ``compute_s`` of device work on the inputs, no sync."""

    def step(batch: Any) -> Any:
        inputs, _targets = batch
        return accel.compute(compute_s, inputs)

    return step


def calibrate(accel: Any, setup: PipelineSetup | None = None, batches: int = 7, device_share: float = 0.25) -> PipelineSetup:
    """Measure a baseline batch's CPU cost here and size the device work to ``device_share`` of it.

    Args:
        accel: the accelerator the lab uses; a simulated one also gets its link bandwidth set
            (a float32 batch takes a sixth of the device time).
        setup: starting values (default :class:`PipelineSetup`).
        batches: baseline batches timed (the median counts; the first warms up).
        device_share: device time / CPU time of a baseline batch.
            A quarter caps the fixes at about 4x the baseline's throughput, so the lab's graded 2x
            holds even when the calibration catches a slow moment of a shared machine.

    Returns:
        The setup with ``compute_s`` and ``batch_cpu_s`` filled in.
    """
    setup = setup or PipelineSetup()
    ds = setup.dataset(normalize_on_cpu=True)
    loader = make_loader(ds, batch_size=setup.batch_size, seed=setup.seed)
    times, it = [], iter(loader)
    for _ in range(batches + 1):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    cpu_s = statistics.median(times[1:])
    compute_s = max(0.002, device_share * cpu_s)
    if getattr(accel, "kind", None) == "simulated":
        float_bytes = setup.batch_size * 4 * ds.channels * ds.image_size**2
        accel.h2d_bytes_per_s = float_bytes / (compute_s / 6)
    return replace(setup, compute_s=compute_s, batch_cpu_s=cpu_s)


def baseline_pipeline(setup: PipelineSetup, accel: Any) -> tuple[Any, Callable[[Any], Any]]:
    """``num_workers=0``, float32 normalised on the CPU; profile it with ``non_blocking=False``."""
    loader = make_loader(setup.dataset(normalize_on_cpu=True), batch_size=setup.batch_size, seed=setup.seed)
    return loader, model_step(accel, setup.compute_s)


def tuned_pipeline(setup: PipelineSetup, accel: Any, num_workers: int = 0,
                   disable: bool = True) -> tuple[Any, Callable[[Any], Any]]:
    """Cache + uint8 + normalise on the device; profile with ``non_blocking=True``.

    Args:
        num_workers: 0 by default (see the module docstring); workers are persistent.
        disable: hide the cache's fill progress bar.
    """
    cache = InMemoryCache(setup.dataset(normalize_on_cpu=False), fill=True, disable=disable)  # decode once
    cfg = LoaderConfig(num_workers=num_workers, persistent_workers=num_workers > 0, batch_size=setup.batch_size,
                       pin_memory=cuda_device_count() > 0)
    loader = make_loader(cache, cfg, seed=setup.seed)
    compute = model_step(accel, setup.compute_s)
    device = getattr(accel, "torch_device", accel)

    def step(batch: Any) -> Any:
        images, targets = batch
        inputs = to_device_normalize(images, setup.mean, setup.std, device)  # uint8 crossed the link
        return compute((inputs, targets))

    return loader, step


@dataclass
class Comparison:
    """Baseline and candidate profiles measured side by side (see :func:`compare_pipelines`).

    ``baseline_log`` / ``candidate_log`` recorded what each pipeline copied to the device
    (:class:`~gpulab.data.crossing.TransferLog`): the dtypes that crossed, and how many of the
    samples were repeats. Fresh samples per second count each distinct sample once.
    """

    baseline: LoopProfile
    candidate: LoopProfile
    attempts: int
    baseline_log: TransferLog | None = None
    candidate_log: TransferLog | None = None

    @property
    def baseline_echo(self) -> float:
        """Samples the baseline copied per distinct sample (measured; 1.0 without a log)."""
        return self.baseline_log.echo if self.baseline_log is not None else 1.0

    @property
    def candidate_echo(self) -> float:
        """Samples the candidate copied per distinct sample: about k for a batch echoed k times."""
        return self.candidate_log.echo if self.candidate_log is not None else 1.0

    @property
    def baseline_fresh(self) -> float:
        """Baseline samples per second, counting each distinct sample once (echoes are not new data)."""
        return self.baseline.throughput / self.baseline_echo

    @property
    def candidate_fresh(self) -> float:
        return self.candidate.throughput / self.candidate_echo

    @property
    def throughput_ratio(self) -> float:
        """Candidate / baseline fresh samples per second."""
        return self.candidate_fresh / max(self.baseline_fresh, 1e-12)

    def __str__(self) -> str:
        b, c = self.baseline, self.candidate
        echo = f" (each sample copied {self.candidate_echo:.2f}x)" if self.candidate_echo > 1.05 else ""
        return (f"baseline: busy {b.busy_fraction:.2f}, {self.baseline_fresh:.0f} samples/s | candidate{echo}: busy "
                f"{c.busy_fraction:.2f}, {self.candidate_fresh:.0f} fresh samples/s | {self.throughput_ratio:.2f}x "
                f"(attempt {self.attempts})")


def compare_pipelines(baseline: tuple[Any, Callable], candidate: tuple[Any, Callable], accel: Any, *,
                      epochs: int = 3, attempts: int = 2, busy_at_least: float = 0.9, ratio_at_least: float = 2.0,
                      disable: bool = False) -> Comparison:
    """Profile two ``(loader, step_fn)`` pipelines one after the other, the first epoch as warm-up.

    The baseline is copied with ``non_blocking=False`` (the naive default), the candidate with
    ``non_blocking=True``, each through a :class:`~gpulab.data.crossing.TransferLog` around
    ``accel``, which counts what crosses. Throughput counts fresh samples: a pipeline that copies
    the same samples again (batch echoing, or the same batches every epoch) is measured doing so,
    whatever its objects say about themselves. If the candidate misses ``busy_at_least`` or
    ``ratio_at_least`` - a shared machine can stall a process for tens of milliseconds - both are
    measured again, up to ``attempts`` times, and the best attempt is returned. A pipeline that
    cannot reach the targets misses them in every attempt.

    Raises:
        ValueError: ``epochs < 2`` (one is warm-up), or a loader without ``len()``.
    """
    if epochs < 2:
        raise ValueError(f"epochs must be >= 2 (the first one is warm-up), got {epochs}")
    accel = as_accelerator(accel)
    best = None
    for attempt in range(1, attempts + 1):
        profiles, logs = [], []
        for (loader, step_fn), non_blocking, name in ((baseline, False, "baseline"), (candidate, True, "candidate")):
            try:
                n = len(loader)
            except TypeError:
                raise ValueError(f"the {name} loader has no len(); return a DataLoader (or BatchEcho of one)") from None
            logs.append(TransferLog(accel))
            profiles.append(profile_loop(loader, step_fn, logs[-1], n, epochs=epochs, warmup_steps=n,
                                         non_blocking=non_blocking, desc=name, disable=disable))
        result = Comparison(profiles[0], profiles[1], attempt, *logs)
        if best is None or (result.candidate.busy_fraction, result.throughput_ratio) > (
                best.candidate.busy_fraction, best.throughput_ratio):
            best = result
        if best.candidate.busy_fraction >= busy_at_least and best.throughput_ratio >= ratio_at_least:
            break
    return best
