"""Lab 02's graders: what a student's input pipeline *does*, observed where it cannot be told.

Nothing here reads an attribute the student's objects expose about themselves (a ``factor``, a
``dataset``, a dtype flag), and nothing decides a verdict: each function runs the student's code
on inputs drawn from the grading run's seed and returns what it saw, as plain values, for a test
cell to send; the expected values are the same observations of gpulab's references, computed
only in the reference kernel (``grading.by_reference``).

- :func:`observe_echo`: a ``BatchEcho`` class over loaders that record every batch they hand out:
  which loaded batch each yield is, loads before the first yield, passes per epoch.
- :func:`observe_cache`: a ``DecodedCache`` class over a dataset that counts ``load`` (decoding)
  and ``transform`` (augmentation) calls, its reads under fixed random states, and what forked
  DataLoader workers read through it.
- :func:`observe_normalize`: ``to_device_normalize``'s values and the dtype that crossed.
- :class:`PipelineRecorder`, :func:`run_epoch`, :func:`probe_pipeline`, :func:`timed_setup`: an
  epoch of a ``make_pipeline(setup, accel)`` pipeline, copied through an accelerator that records
  what crosses and what the model receives, summed up as a result that depends on every sample
  delivered but not on the order or on the random augmentation (:func:`canonical_digests`); the
  grader times such epochs itself (``grading.check_speedup``).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Iterable

import numpy as np
import torch

from gpulab.accel.base import Accelerator
from gpulab.data.caching import InMemoryCache
from gpulab.data.crossing import TransferLog, sample_fingerprints
from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import PipelineSetup, tuned_pipeline
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.transfer import normalize_on_host, record_moves, to_device_normalize
from gpulab.data.worker_sweep import pick_workers, sweep_workers
from gpulab.data.workers import make_loader, measure_loader
from gpulab.devices.batches import tree_tensors

__all__ = ["REFERENCES", "outcome", "WorkerCensus", "observe_sweep", "pick_cases", "loader_epoch", "observe_echo",
           "echo_cases", "observe_echo_loader", "bad_factors", "observe_cache", "reference_cache", "normalize_cases", "observe_normalize", "canonical_digests", "PipelineRecorder",
           "run_epoch", "device_only", "probe_pipeline", "timed_setup", "PAD"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the normalisation (on the device, and the naive host version it must match),
# the cache, the echo, the tuned pipeline that assembles them, and the worker sweep and choice. The
# baseline pipeline and the instruments (sweep_loader, tune_loader, TransferLog, record_moves,
# profile_loop) stay: the demos and these graders use them.
REFERENCES: tuple = (to_device_normalize, normalize_on_host, InMemoryCache, BatchEcho, tuned_pipeline, sweep_workers,
                     pick_workers)

PAD = 4  # SyntheticImages' crop padding: an augmented image is its decoded image shifted by at most 4 pixels


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``"raises <ExceptionType>"`` (any ValueError or TypeError counts as
    its base class), so that a case whose answer is an error is sent beside the others."""
    try:
        return fn(*args, **kwargs)
    except ValueError:
        return "raises ValueError"
    except TypeError:
        return "raises TypeError"
    except Exception as err:  # the student's code raised: that is the answer sent
        return f"raises {type(err).__name__}"


# --- the num_workers sweep ----------------------------------------------------------------------

class WorkerCensus(torch.utils.data.Dataset):
    """``n`` samples ``(4 numbers, label)`` that note, in shared memory, which process read each one:
    for each DataLoader worker id (the main process in the last row), the reads and up to 8 distinct
    pids, so that a worker id served by a new process every epoch shows as several pids."""

    MAX_WORKERS = 16

    def __init__(self, n: int) -> None:
        self.n = n
        self.table = torch.zeros(self.MAX_WORKERS + 1, 9, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        info = torch.utils.data.get_worker_info()
        row = self.table[min(info.id, self.MAX_WORKERS - 1) if info is not None else self.MAX_WORKERS]
        row[0] += 1
        pid = os.getpid()
        for j in range(1, 9):  # one process per worker id at a time: no race on its row
            if int(row[j]) in (0, pid):
                row[j] = pid
                break
        return torch.full((4,), float(i)), i

    def facts(self, needed: int) -> dict[str, Any]:
        pids = {int(p) for p in self.table[:-1, 1:].flatten() if p}
        return {"worker processes that read": len(pids), "read in the main process": bool(self.table[-1, 0] > 0),
                f"read at least {needed} samples": int(self.table[:, 0].sum()) >= needed}


def observe_sweep(sweep: Callable[..., Any], counts: Iterable[int], batch_size: int = 4, num_batches: int = 3,
                  epochs: int = 2) -> dict[str, Any]:
    """``sweep(census, [k], batch_size=, num_batches=, epochs=)`` for each ``k`` of ``counts``, on a fresh
    :class:`WorkerCensus` each time: what it returned (its keys, whether the rate is a positive
    number) and who read the samples (``k`` worker processes for the whole run, so persistent; the
    main process only without workers; at least ``epochs x num_batches x batch_size`` samples)."""
    out: dict[str, Any] = {}
    for k in counts:
        census = WorkerCensus(2 * batch_size * num_batches)
        got = outcome(sweep, census, [k], batch_size=batch_size, num_batches=num_batches, epochs=epochs)
        rate = got.get(k) if isinstance(got, dict) else None
        out[f"num_workers={k}"] = {
            "returned": sorted(got) if isinstance(got, dict) else got if isinstance(got, str) else f"a {type(got).__name__}",
            "rate a positive number": isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < float("inf"),
            **census.facts(epochs * num_batches * batch_size)}
    return out


def pick_cases(rng: random.Random, n: int = 12) -> list[tuple[dict[int, float], float]]:
    """``n`` random ``(rates, slack)`` arguments of ``pick_workers`` (1 to 7 counts in a shuffled key
    order, and a smaller count within the slack of the best in about half of them), then two fixed ones."""
    cases = []
    for _ in range(n):
        counts = rng.sample(range(0, 17), rng.randint(1, 7))
        rates = {k: round(rng.uniform(100.0, 2000.0), 1) for k in counts}
        slack = rng.choice([0.0, 0.05, 0.1, 0.25])
        best = max(rates, key=rates.get)
        smaller = [k for k in counts if k < best]
        if smaller and rng.random() < 0.5:  # a cheaper count just inside the slack
            rates[rng.choice(smaller)] = round(rates[best] * (1 - slack * rng.uniform(0.1, 0.9)), 1)
        cases.append((rates, slack))
    # whatever the seed drew: the fastest is not the choice, nor is the first key within the slack
    return cases + [({4: 1000.0, 2: 980.0, 0: 500.0}, 0.05), ({3: 990.0, 1: 985.0, 5: 1000.0}, 0.05)]


def loader_epoch(dataset: Any, num_workers: int, batch_size: int, num_batches: int) -> Callable[[int], int]:
    """One unit of timed work: ``fn(seed)`` reads ``num_batches`` shuffled batches through a new
    ``DataLoader`` with ``num_workers`` (their start-up included), and returns the samples read."""
    def work(seed: int) -> int:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                             generator=torch.Generator().manual_seed(seed))
        return measure_loader(loader, num_batches=num_batches)["samples"]
    return work


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


def echo_cases(rng: random.Random, n: int = 5) -> list[tuple[int, int]]:
    """``n`` random ``(num_batches, factor)`` cases, an empty loader and a factor of 1 among them."""
    cases = [(0, rng.randint(1, 4)), (rng.randint(1, 6), 1)]
    cases += [(rng.randint(1, 8), rng.randint(2, 5)) for _ in range(max(0, n - 2))]
    rng.shuffle(cases)
    return cases


def observe_echo(echo_cls: Callable[[Any, int], Any], cases: Iterable[tuple[int, int]], epochs: int = 2) -> dict[str, Any]:
    """What ``echo_cls(loader, factor)`` does over a loader that records what it hands out.

    Returns:
        For each case ``"<num_batches> batches, factor <factor>"``: ``len()``, and per epoch the
        passes over the loader so far, the loads before the first yield, and for each yield the
        number of the batch loaded that epoch that it is (the same object), or -1 if it is none.
    """
    out: dict[str, Any] = {}
    for num_batches, factor in cases:
        loader = _CountingLoader(num_batches)
        record: dict[str, Any] = {}
        try:
            echo = echo_cls(loader, factor)
            record["len"] = outcome(len, echo)
            for epoch in range(1, epochs + 1):
                before = len(loader.loaded)
                it = iter(echo)
                first = [next(it)] if num_batches else []
                ahead = len(loader.loaded) - before  # loads before the first yield
                yielded = first + list(it)
                ids = {id(b): k for k, b in enumerate(loader.loaded[before:])}
                record[f"epoch {epoch}"] = {"passes over the loader so far": loader.passes,
                                            "loads before the first yield": ahead,
                                            "which loaded batch each yield is": [ids.get(id(b), -1) for b in yielded]}
        except Exception as err:  # the student's code raised: that is what is sent
            record["raised"] = f"{type(err).__name__}: {err}"[:300]
        out[f"{num_batches} batches, factor {factor}"] = record
    return out


def observe_echo_loader(echo_cls: Callable[[Any, int], Any], num_samples: int, batch_size: int, factor: int,
                        seed: int) -> dict[str, Any]:
    """``echo_cls`` over a real DataLoader of ``SyntheticImages`` (not shuffled), for two epochs: the
    number of yields, whether each batch came ``factor`` times in a row as the same object, and the
    labels yielded."""
    loader = make_loader(SyntheticImages(num_samples, seed=seed), batch_size=batch_size, shuffle=False)
    echo = echo_cls(loader, factor)
    out: dict[str, Any] = {}
    for epoch in (1, 2):
        batches = list(echo)
        runs = [batches[i:i + factor] for i in range(0, len(batches), factor)]
        out[f"epoch {epoch}"] = {"yields": len(batches),
                                 "each batch factor times in a row": all(len(r) == factor and all(b is r[0] for b in r)
                                                                         for r in runs),
                                 "labels": [int(y) for b in batches for y in b[1]]}
    return out


def bad_factors(echo_cls: Callable[[Any, int], Any], factors: Iterable[Any]) -> dict[str, Any]:
    """``{repr(factor): what echo_cls([batch], factor) did}`` ("raises ValueError" or "accepted")."""
    out = {}
    for factor in factors:
        got = outcome(echo_cls, [torch.zeros(2)], factor)
        out[repr(factor)] = got if isinstance(got, str) and got.startswith("raises") else "accepted"
    return out


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


def reference_cache(dataset: Any) -> InMemoryCache:
    """gpulab's cache the way the exercise asks for it: filled up front."""
    return InMemoryCache(dataset, fill=True, disable=True)


def observe_cache(cache_cls: Callable[[Any], Any], num_samples: int, seed: int, reads: Iterable[int] = (),
                  workers: int = 0) -> dict[str, Any]:
    """What ``cache_cls(dataset)`` does over a dataset that counts its own calls.

    Returns:
        The indices decoded while it was built (sorted), ``len()``, the labels of a read of every
        sample, the decodes and augmentations during that read, the images read at ``reads`` under
        a fixed random state each (a uint8 tensor), and with ``workers`` the images and labels a
        DataLoader with that many forked workers read through it (from an un-augmented dataset).
    """
    ds = _CountingImages(num_samples, decode_repeats=1, seed=seed)
    cache = cache_cls(ds)
    out: dict[str, Any] = {"indices decoded while built": sorted(ds.loads), "len": outcome(len, cache)}
    ds.loads.clear()
    ds.transforms = 0
    labels = []
    for i in range(num_samples):
        _, label = cache[i]
        labels.append(int(label))
    out["labels read"] = labels
    out["decodes while reading every sample"] = len(ds.loads)
    out["augmentations while reading every sample"] = ds.transforms
    state = random.getstate()
    try:
        images = []
        for i in reads:
            random.seed(f"{seed}:{i}")  # the same crop and flip as the reference's read
            images.append(cache[i][0])
        if images:
            out["images read (fixed random states)"] = torch.stack(images) if all(
                isinstance(x, torch.Tensor) and x.shape == images[0].shape for x in images) else [str(x)[:80] for x in images]
    finally:
        random.setstate(state)
    if workers:
        plain = _CountingImages(num_samples, decode_repeats=1, augment=False, seed=seed + 1)
        loader = torch.utils.data.DataLoader(cache_cls(plain), batch_size=16, num_workers=workers,
                                             multiprocessing_context="fork", timeout=60)
        parts = list(zip(*loader))
        out[f"read by {workers} forked workers"] = {"images": torch.cat(parts[0]), "labels": torch.cat(
            [torch.as_tensor(y) for y in parts[1]]).tolist()}
    return out


# --- to_device_normalize ------------------------------------------------------------------------

def normalize_cases(rng: random.Random, n: int = 6) -> dict[str, tuple]:
    """``n`` random ``(batch_uint8, mean, std)`` cases (1 to 4 channels, odd shapes, mean and std as
    lists or tensors), and two with the wrong number of values (a ValueError)."""
    cases: dict[str, tuple] = {}
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for i in range(n):
        c = rng.randint(1, 4)
        shape = (rng.randint(1, 5), c, rng.randint(1, 9), rng.randint(1, 9))
        x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        m, s = torch.rand(c, generator=gen), 0.1 + torch.rand(c, generator=gen)
        if rng.random() < 0.5:
            m, s = m.tolist(), s.tolist()
        cases[f"case {i}: a {tuple(shape)} batch"] = (x, m, s)
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8, generator=gen)
    cases["3 channels, 2 means"] = (x, [0.5, 0.5], [0.2, 0.2, 0.2])
    cases["3 channels, 4 stds"] = (x, [0.5] * 3, [0.2] * 4)
    return cases


def observe_normalize(fn: Callable[..., Any], cases: dict[str, tuple], dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """For each case: ``fn(x, mean, std, "cpu", dtype=dtype)`` (or the error it raised), and the
    dtype that crossed in its largest ``tensor.to(<device>)`` (``record_moves``): the requested
    dtype, or the tensor's own when none was requested."""
    out: dict[str, Any] = {}
    for name, (x, m, s) in cases.items():
        got, moves = record_moves(outcome, fn, x, m, s, torch.device("cpu"), dtype=dtype)
        largest = max(moves, key=lambda mv: mv[2]) if moves else None
        crossed = "nothing crossed" if largest is None else str(largest[1] or largest[0]).removeprefix("torch.")
        out[name] = got if isinstance(got, str) else {"values": got, "crossed as": crossed}
    return out


# --- make_pipeline ------------------------------------------------------------------------------

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
    region = np.take_along_axis(region, np.broadcast_to(c_idx[:, None, None, :], (b, c, h - 2 * pad, w - 2 * pad)), axis=3)
    mirror = region[..., ::-1]
    return sample_fingerprints(torch.from_numpy(np.ascontiguousarray(region))) + \
        sample_fingerprints(torch.from_numpy(np.ascontiguousarray(mirror)))


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
        return {"images the model received": int(len(digests)), "digest of those images": int(mixed) >> 11,
                "labels that crossed (count per class)": self._labels.tolist(),
                "dtype of the images that crossed": sorted(self._crossed),
                "dtype the model received": sorted(self._model),
                "most images the same bytes as in the run before": repeats > len(prints) // 4}


def run_epoch(pipeline: tuple[Any, Callable[[Any], Any]], recorder: PipelineRecorder, seed: int,
              non_blocking: bool = True) -> dict[str, Any]:
    """One epoch of ``(loader, step_fn)`` built on ``recorder``: each batch copied through it
    (``non_blocking`` as the lab's profiles do: False for the baseline), the queue drained at the
    end; returns :meth:`PipelineRecorder.end_run`."""
    loader, step_fn = pipeline
    recorder.begin_run(seed)
    for batch in loader:
        step_fn(recorder.copy(batch, non_blocking=non_blocking))
    recorder.synchronize()
    return recorder.end_run()


def device_only(accel: Accelerator, setup: PipelineSetup, seed: int) -> int:
    """The device's own work for an epoch of ``setup`` and nothing else: for each of the
    ``steps_per_epoch`` steps, a uint8 batch's copy and the model step, with no data to prepare;
    returns the number of steps. An epoch of a pipeline that keeps the device busy takes little
    longer than this."""
    batch = torch.zeros((setup.batch_size, 3, 32, 32), dtype=torch.uint8)  # what a uint8 pipeline copies
    for _ in range(setup.steps_per_epoch):
        accel.compute(setup.compute_s, accel.copy(batch, non_blocking=True))
    accel.synchronize()
    return setup.steps_per_epoch


def probe_pipeline(make_pipeline: Callable[[PipelineSetup, Any], tuple[Any, Callable]], setup: PipelineSetup,
                   accel: Accelerator, epochs: int = 2) -> dict[str, Any]:
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


def timed_setup(rng: random.Random, accel: Accelerator, compute_s: float = 0.012, device_share: float = 0.25,
                batch_size: int = 64) -> PipelineSetup:
    """A workload drawn from ``rng`` for a timed comparison, whose device step is exactly
    ``compute_s`` in every kernel (so that an epoch's device time, the timed check's floor, is
    known), and whose decoding is calibrated here so that a baseline batch costs this machine's CPU
    about ``compute_s / device_share`` (the lab's ratio). On the simulated accelerator the link is
    set as :func:`~gpulab.data.pipelines.calibrate` sets it (a float32 batch takes a sixth of a step).

    The decode work changes nothing the pipelines deliver, so the results stay comparable between
    kernels that calibrate differently.
    """
    steps = rng.randint(8, 12)
    setup = PipelineSetup(num_samples=steps * batch_size, batch_size=batch_size, compute_s=compute_s,
                          seed=rng.randrange(2**20))

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


