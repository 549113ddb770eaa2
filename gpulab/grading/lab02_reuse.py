"""Lab 02's graders for the two exercises that reuse work: ``BatchEcho`` (a loaded batch reused) and
``DecodedCache`` (a decoded image reused). Each runs the student's class over a loader or a dataset
that records what is asked of it, and returns what it saw; nothing decides a verdict. Re-exported by
:mod:`gpulab.grading.lab02`, which masks their references.

- :func:`observe_echo`, :func:`observe_echo_loader`, :func:`bad_factors`: a ``BatchEcho`` class
  over loaders that record every batch they hand out;
- :func:`observe_cache`: a ``DecodedCache`` class over a dataset that counts ``load`` (decoding)
  and ``transform`` (augmentation) calls, and what forked DataLoader workers read through it.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

import torch

from gpulab.data.caching import InMemoryCache
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.workers import make_loader

__all__ = ["echo_cases", "observe_echo", "observe_echo_loader", "bad_factors", "reference_cache", "observe_cache"]


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


def observe_echo(
    echo_cls: Callable[[Any, int], Any], cases: Iterable[tuple[int, int]], epochs: int = 2
) -> dict[str, Any]:
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
                record[f"epoch {epoch}"] = {
                    "passes over the loader so far": loader.passes,
                    "loads before the first yield": ahead,
                    "which loaded batch each yield is": [ids.get(id(b), -1) for b in yielded],
                }
        except Exception as err:  # the student's code raised: that is what is sent
            record["raised"] = f"{type(err).__name__}: {err}"[:300]
        out[f"{num_batches} batches, factor {factor}"] = record
    return out


def observe_echo_loader(
    echo_cls: Callable[[Any, int], Any], num_samples: int, batch_size: int, factor: int, seed: int
) -> dict[str, Any]:
    """``echo_cls`` over a real DataLoader of ``SyntheticImages`` (not shuffled), for two epochs: the
    number of yields, whether each batch came ``factor`` times in a row as the same object, and the
    labels yielded."""
    loader = make_loader(SyntheticImages(num_samples, seed=seed), batch_size=batch_size, shuffle=False)
    echo = echo_cls(loader, factor)
    out: dict[str, Any] = {}
    for epoch in (1, 2):
        batches = list(echo)
        runs = [batches[i : i + factor] for i in range(0, len(batches), factor)]
        out[f"epoch {epoch}"] = {
            "yields": len(batches),
            "each batch factor times in a row": all(len(r) == factor and all(b is r[0] for b in r) for r in runs),
            "labels": [int(y) for b in batches for y in b[1]],
        }
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


def observe_cache(
    cache_cls: Callable[[Any], Any], num_samples: int, seed: int, reads: Iterable[int] = (), workers: int = 0
) -> dict[str, Any]:
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
            out["images read (fixed random states)"] = (
                torch.stack(images)
                if all(isinstance(x, torch.Tensor) and x.shape == images[0].shape for x in images)
                else [str(x)[:80] for x in images]
            )
    finally:
        random.setstate(state)
    if workers:
        plain = _CountingImages(num_samples, decode_repeats=1, augment=False, seed=seed + 1)
        loader = torch.utils.data.DataLoader(
            cache_cls(plain), batch_size=16, num_workers=workers, multiprocessing_context="fork", timeout=60
        )
        parts = list(zip(*loader))
        out[f"read by {workers} forked workers"] = {
            "images": torch.cat(parts[0]),
            "labels": torch.cat([torch.as_tensor(y) for y in parts[1]]).tolist(),
        }
    return out
