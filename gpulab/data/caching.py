"""``InMemoryCache``: decode each sample once and keep it in RAM, when the data fits.

The source posts split the pipeline into disk -> memory -> CPU preprocessing -> GPU, and note that
when the whole dataset fits in memory the first two steps need to happen only once. The cache
keeps the *decoded* samples; random augmentation must still run on every access, or every epoch
would see the same crops. Datasets that split the two (``load(index)`` and ``transform(sample)``,
like :class:`gpulab.data.synthetic.SyntheticImages`) get exactly that. For other datasets the
whole ``__getitem__`` result is cached (fine for deterministic transforms only). With DataLoader
workers, ``fill()`` first: see the comment below the imports.

    .venv/bin/python -m pytest tests/data/test_caching.py
"""

from __future__ import annotations

from typing import Any

import psutil
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

# Warning: each DataLoader worker is a separate process with its own copy of the cache. Call
# ``fill()`` (or pass ``fill=True``) *before* creating the loader: forked workers then share the
# filled memory (copy-on-write). Images are stored in one contiguous uint8 tensor so that reading
# them does not touch (and copy) per-object pages. Hit/miss counts are per process.

__all__ = ["InMemoryCache"]


class InMemoryCache(Dataset):
    """Wrap ``dataset`` so each sample is decoded at most once.

    Args:
        dataset: a map-style dataset (``len`` and ``[i]``); with ``load``/``transform`` methods the
            decoded part is cached and the transform runs on every access.
        fill: decode everything now (with a progress bar), before any worker is forked.
        disable: turn the progress bar off.

    Raises:
        MemoryError: when the decoded dataset would not fit in the memory available now (names
            the size and the alternatives).
    """

    def __init__(self, dataset: Dataset, fill: bool = False, disable: bool = False) -> None:
        self.dataset = dataset
        self.split = callable(getattr(dataset, "load", None)) and callable(getattr(dataset, "transform", None))
        n = len(dataset)  # type: ignore[arg-type]
        self._images: torch.Tensor | None = None  # (N, C, H, W) uint8, when samples are (tensor, label)
        self._labels = [0] * n
        self._filled = torch.zeros(n, dtype=torch.bool)
        self._items: list[Any] = []  # the generic case
        self.hits = self.misses = 0
        if self.split:
            first, label = dataset.load(0)  # type: ignore[attr-defined]
            if isinstance(first, torch.Tensor):
                need = n * first.numel() * first.element_size()
                free = psutil.virtual_memory().available
                if need > 0.8 * free:
                    raise MemoryError(f"caching {n} decoded samples needs {need / 2**30:.2f} GiB but only "
                                      f"{free / 2**30:.2f} GiB are free; cache a subset (torch.utils.data.Subset), "
                                      "or read from a chunked HDF5 file instead (lab 03)")
                self._images = torch.empty((n, *first.shape), dtype=first.dtype)
                self._store(0, (first, label))
        if self._images is None:
            self._items = [None] * n
        if fill:
            self.fill(disable=disable)

    def __len__(self) -> int:
        return len(self._labels)

    @property
    def nbytes(self) -> int:
        """Bytes held by the cached images (0 in the generic case, which is not measured)."""
        return 0 if self._images is None else self._images.numel() * self._images.element_size()

    @property
    def filled(self) -> int:
        """How many samples are cached (in this process)."""
        if self._images is None:
            return sum(item is not None for item in self._items)
        return int(self._filled.sum())

    def _store(self, index: int, item: Any) -> None:
        if self._images is not None:
            self._images[index] = item[0]
            self._labels[index] = item[1]
            self._filled[index] = True
        else:
            self._items[index] = item

    def _cached(self, index: int) -> Any:
        if self._images is not None:
            if bool(self._filled[index]):
                return self._images[index], self._labels[index]
            return None
        return self._items[index]

    def _load(self, index: int) -> Any:
        return self.dataset.load(index) if self.split else self.dataset[index]  # type: ignore[attr-defined]

    def fill(self, disable: bool = False) -> "InMemoryCache":
        """Decode every sample that is not cached yet."""
        for i in tqdm(range(len(self)), desc="InMemoryCache.fill", disable=disable, leave=False):
            if self._cached(i) is None:
                self._store(i, self._load(i))
        return self

    def __getitem__(self, index: int) -> Any:
        if index < 0:
            index += len(self)
        item = self._cached(index)
        if item is None:
            self.misses += 1
            item = self._load(index)
            self._store(index, item)
        else:
            self.hits += 1
        if self.split:
            img, label = item
            return self.dataset.transform(img), label  # type: ignore[attr-defined]
        return item

    def __repr__(self) -> str:
        return f"InMemoryCache({type(self.dataset).__name__}, {self.filled}/{len(self)} cached, {self.nbytes / 2**20:.1f} MiB)"
