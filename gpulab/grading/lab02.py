"""Lab 02's graders: what a student's input pipeline *does*, measured where it cannot be told.

Nothing here reads an attribute the student's objects expose about themselves (a ``factor``, a
``dataset``, a dtype flag). Each grader builds the probe it reads:

- :func:`check_echo`: a ``BatchEcho`` class is given a counting loader owned by the grader, which
  records every batch it hands out; the echo factor is *yields per load*, and the order must be
  each loaded batch ``factor`` times in a row, loaded lazily, once per epoch.
- :func:`check_cache`: a ``DecodedCache`` class is given a dataset owned by the grader that
  counts ``load`` (decoding) and ``transform`` (augmentation) calls per index.
- :func:`probe_pipeline` / :func:`check_pipeline`: ``make_pipeline(setup, accel)`` receives a
  :class:`~gpulab.data.crossing.TransferLog`, and its batches are copied through one: the dtype
  that crosses to the device, the dtype the model receives, whether the model's inputs are the
  crossed uint8 images normalised (i.e. normalised after the copy, on the device), and how many
  crossed samples were repeats (:attr:`~gpulab.data.crossing.TransferLog.echo`) are all
  measured; then the pipeline is timed beside the baseline by
  :func:`~gpulab.data.pipelines.compare_pipelines`, which counts fresh samples the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from gpulab.data.caching import InMemoryCache
from gpulab.data.crossing import TransferLog
from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import Comparison, PipelineSetup, baseline_pipeline, compare_pipelines, tuned_pipeline
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.transfer import normalize_on_host, to_device_normalize
from gpulab.grading.checks import GradingError, check_not_calling

__all__ = ["REFERENCES", "check_echo", "EchoReport", "check_cache", "probe_pipeline", "PipelineProbe", "check_pipeline",
           "PipelineReport"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (to_device_normalize, normalize_on_host, InMemoryCache, BatchEcho, tuned_pipeline)


def _fail(what: str, detail: str, hint: str = "") -> None:
    raise GradingError(f"{what}: {detail}" + (f"\n  Hint: {hint}" if hint else ""))


# --- BatchEcho ----------------------------------------------------------------------------------

class _CountingLoader:
    """A loader of fresh batches that records every batch it hands out and every pass."""

    def __init__(self, num_batches: int) -> None:
        self._num_batches = num_batches
        self.passes = 0
        self.loaded: list[torch.Tensor] = []

    def __len__(self) -> int:
        return self._num_batches

    def __iter__(self):
        self.passes += 1
        for i in range(self._num_batches):
            batch = torch.full((2,), float(1000 * self.passes + i))  # a new object at every load
            self.loaded.append(batch)
            yield batch


@dataclass
class EchoReport:
    """What :func:`check_echo` measured: loads and yields over every case and epoch."""

    loads: int
    yields: int

    @property
    def factor(self) -> float:
        """Yields per load: the echo factor, measured."""
        return self.yields / max(1, self.loads)


def check_echo(echo_cls: Callable[[Any, int], Any], cases: tuple[tuple[int, int], ...] = ((3, 2), (4, 1), (2, 4), (0, 3)),
               epochs: int = 2, forbidden: tuple = REFERENCES) -> EchoReport:
    """Check ``echo_cls(loader, factor)`` by behaviour, over ``(num_batches, factor)`` cases.

    Per epoch: the loader is iterated once (``iter`` called once), every batch is loaded once,
    and is yielded ``factor`` times in a row (the same object) before the next one is loaded;
    ``len`` is ``num_batches * factor``.

    Raises:
        GradingError: naming the case and what differed.
    """
    loads = yields = 0
    for num_batches, factor in cases:
        loader = _CountingLoader(num_batches)
        echo = check_not_calling(echo_cls, loader, factor, forbidden=forbidden, what="BatchEcho(loader, factor)")
        case = f"BatchEcho over {num_batches} batches, factor {factor}"
        length = check_not_calling(len, echo, forbidden=forbidden, what="len(BatchEcho)")
        if length != num_batches * factor:
            _fail(case, f"len() is {length}, expected {num_batches * factor}", "len(loader) * factor")
        for epoch in range(epochs):
            before = len(loader.loaded)

            def one_epoch() -> tuple[list, int]:
                it = iter(echo)
                if not num_batches:
                    return list(it), 0
                first = next(it)
                ahead = len(loader.loaded) - before  # loads before the first yield
                return [first, *it], ahead

            out, ahead = check_not_calling(one_epoch, forbidden=forbidden, what="iterating BatchEcho")
            if ahead > 1:
                _fail(case, f"{ahead} batches were loaded before the first one was yielded",
                      "take one batch from the loader, yield it factor times, then take the next: no reading ahead")
            got = loader.loaded[before:]
            if loader.passes != epoch + 1:
                _fail(case, f"epoch {epoch + 1} iterated the loader {loader.passes - epoch} times",
                      "iterate the loader once per epoch (each echo reuses the batch, it does not load it again)")
            expected = [b for b in got for _ in range(factor)]
            if len(got) != num_batches or len(out) != len(expected) or any(x is not y for x, y in zip(out, expected)):
                _fail(case, f"epoch {epoch + 1}: {len(got)} loads and {len(out)} yields, expected {num_batches} and "
                      f"{num_batches * factor}, each loaded batch {factor} times in a row (the same object)")
            loads, yields = loads + len(got), yields + len(out)
    return EchoReport(loads, yields)


# --- DecodedCache -------------------------------------------------------------------------------

class _CountingImages(SyntheticImages):
    """SyntheticImages that counts decodes (``load``) per index and augmentations (``transform``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loads: list[int] = []
        self.transforms = 0

    def load(self, index: int) -> tuple[torch.Tensor, int]:
        self.loads.append(int(index))
        return super().load(index)

    def transform(self, img: torch.Tensor) -> torch.Tensor:
        self.transforms += 1
        return super().transform(img)


def check_cache(cache_cls: Callable[[Any], Any], num_samples: int = 48, forbidden: tuple = REFERENCES,
                workers: int = 2) -> None:
    """Check ``cache_cls(dataset)`` by behaviour on a dataset that counts its own calls.

    Construction decodes every index exactly once; reading every sample decodes nothing more and
    augments once per read; a read equals ``transform(load(i))`` under the same random state; the
    labels are right; and a DataLoader with ``workers`` forked workers reads it correctly.

    Raises:
        GradingError: naming what differed.
    """
    ds = _CountingImages(num_samples, decode_repeats=1, seed=11)
    cache = check_not_calling(cache_cls, ds, forbidden=forbidden, what="DecodedCache(dataset)")
    if sorted(ds.loads) != list(range(num_samples)):
        _fail("DecodedCache(dataset)", f"decoded {len(ds.loads)} times ({len(set(ds.loads))} distinct indices) while "
              f"being built, expected each of the {num_samples} indices once", "call dataset.load(i) for every i in __init__")
    if len(cache) != num_samples:
        _fail("len(DecodedCache)", f"{len(cache)}, expected {num_samples}")
    ds.loads.clear()
    ds.transforms = 0
    for i in range(num_samples):
        image, label = cache[i]
        if int(label) != int(ds.labels[i]):
            _fail(f"DecodedCache[{i}]", f"label {label}, expected {int(ds.labels[i])}")
    if ds.loads:
        _fail("reading every sample", f"decoded {len(ds.loads)} more times", "__getitem__ reads the decoded image you kept")
    if ds.transforms != num_samples:
        _fail("reading every sample", f"{ds.transforms} augmentations for {num_samples} reads",
              "call dataset.transform(image) on every access: the random crop and flip must differ every epoch")
    for i in (0, num_samples // 2, num_samples - 1):
        state = random.getstate()
        mine = cache[i][0]
        random.setstate(state)
        expected = SyntheticImages.transform(ds, SyntheticImages.load(ds, i)[0])
        if not isinstance(mine, torch.Tensor) or mine.dtype != torch.uint8 or not torch.equal(mine, expected):
            _fail(f"DecodedCache[{i}]", "the image is not dataset.transform(dataset.load(i)[0]) (uint8)",
                  "keep the decoded uint8 image; augment a copy on every access")
    if workers:
        plain = _CountingImages(num_samples, decode_repeats=1, augment=False, seed=12)
        loader = torch.utils.data.DataLoader(cache_cls(plain), batch_size=16, num_workers=workers,
                                             multiprocessing_context="fork", timeout=60)
        images, labels = (torch.cat(parts) for parts in zip(*loader))
        decoded = torch.stack([SyntheticImages.load(plain, i)[0] for i in range(num_samples)])
        if not (torch.equal(images, decoded) and torch.equal(labels, torch.as_tensor(plain.labels))):
            _fail(f"a DataLoader with {workers} forked workers", "read different images or labels than the dataset holds")


# --- make_pipeline ------------------------------------------------------------------------------

@dataclass
class PipelineProbe:
    """What :func:`probe_pipeline` saw in a few untimed steps of a pipeline."""

    log: TransferLog
    batch_shape: tuple[int, ...]      # the largest tensor that crossed, first step
    crossed_dtype: torch.dtype        # its dtype
    model_dtypes: list[str]           # the dtypes the model (accel.compute) received
    normalise_error: float            # max |model input - normalize(crossed uint8)|, NaN if not comparable
    epoch_labels: list[int] | None    # the labels of one whole epoch, when it was read


def probe_pipeline(make_pipeline: Callable[[PipelineSetup, Any], tuple[Any, Callable]], setup: PipelineSetup, accel: Any,
                   *, steps: int = 2, read_epoch: bool = False, forbidden: tuple = REFERENCES) -> tuple[PipelineProbe, tuple]:
    """Build ``make_pipeline(setup, log)`` and run ``steps`` steps by hand, copying through ``log``.

    Args:
        read_epoch: also iterate one whole epoch of the loader and keep its labels.

    Returns:
        ``(probe, (loader, step_fn))``: the facts, and the pipeline (do not time it: workers it
        forked while the check traced it carry the tracer along).
    """
    log = TransferLog(accel, keep=steps)
    pipeline = check_not_calling(make_pipeline, setup, log, forbidden=forbidden, what="make_pipeline(setup, accel)")
    if not (isinstance(pipeline, tuple) and len(pipeline) == 2 and callable(pipeline[1])):
        _fail("make_pipeline(setup, accel)", f"returned {type(pipeline).__name__}, expected a tuple (loader, step_fn)")
    loader, step_fn = pipeline
    it = check_not_calling(iter, loader, forbidden=forbidden, what="iter(loader)")
    for _ in range(steps):
        host_batch = check_not_calling(next, it, forbidden=forbidden, what="reading a batch from your loader")
        batch = log.copy(host_batch, non_blocking=True)  # what profile_loop does before each step
        check_not_calling(step_fn, batch, forbidden=forbidden, what="step_fn(batch)")
    log.synchronize()
    del it
    if not log.kept_copies:
        _fail("make_pipeline", "the loader yielded no tensors")
    crossed = log.kept_copies[0]
    errors = []
    for images, inputs in zip(log.kept_copies, log.kept_inputs):
        if images.dtype != torch.uint8 or inputs.shape != images.shape or not inputs.is_floating_point():
            errors.append(float("nan"))
            continue
        expected = normalize_on_host(images, setup.mean, setup.std)
        errors.append(float((inputs.float() - expected).abs().max()))
    labels = None
    if read_epoch:
        labels = [int(y) for _, targets in loader for y in torch.as_tensor(targets).reshape(-1)]
    error = max(errors) if errors and not any(np.isnan(errors)) else float("nan")
    probe = PipelineProbe(log, tuple(crossed.shape), crossed.dtype, list(log.compute_dtypes), error, labels)
    return probe, (loader, step_fn)


@dataclass
class PipelineReport:
    """:func:`check_pipeline`'s result: the untimed probe and the timed comparison."""

    probe: PipelineProbe
    comparison: Comparison

    def __str__(self) -> str:
        c = self.comparison
        return (f"{c}\n  crossed to the device: {self.probe.crossed_dtype} {self.probe.batch_shape} "
                f"(float bytes copied while timed: {c.candidate_log.floating_bytes}); the model received "
                f"{', '.join(self.probe.model_dtypes) or 'nothing'}; samples copied per distinct sample: "
                f"{c.candidate_echo:.2f}")


def check_pipeline(make_pipeline: Callable[[PipelineSetup, Any], tuple[Any, Callable]], setup: PipelineSetup, accel: Any,
                   *, attempts: int = 2, forbidden: tuple = REFERENCES, disable: bool = False) -> PipelineReport:
    """Probe ``make_pipeline`` (:func:`probe_pipeline`), then time a fresh one beside gpulab's baseline.

    The probe runs under :func:`~gpulab.grading.check_not_calling`, whose profiler would follow
    any worker process forked meanwhile and slow it down; so the timed pipeline is built again,
    untraced, and timed by :func:`~gpulab.data.pipelines.compare_pipelines` (3 epochs each, the
    first as warm-up, up to ``attempts`` times), which copies it through a
    :class:`~gpulab.data.crossing.TransferLog` of its own and counts fresh samples.
    """
    probe, _ = probe_pipeline(make_pipeline, setup, accel, forbidden=forbidden)
    comparison = compare_pipelines(baseline_pipeline(setup, accel), make_pipeline(setup, accel), accel,
                                   attempts=attempts, disable=disable)
    return PipelineReport(probe, comparison)
