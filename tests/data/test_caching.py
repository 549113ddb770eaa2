"""gpulab.data.caching: InMemoryCache decodes once and still augments; a cache that does not fit is refused."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gpulab.data import caching
from gpulab.data.loading import InMemoryCache
from gpulab.data.synthetic import SyntheticImages


def test_cache_decodes_once_and_still_augments(monkeypatch) -> None:
    ds = SyntheticImages(8)
    loads = []
    real = ds.load
    monkeypatch.setattr(ds, "load", lambda i: loads.append(i) or real(i))
    cache = InMemoryCache(ds)
    img, label = cache[5]
    img2, _ = cache[5]
    assert loads.count(5) == 1 and cache.hits == 1 and cache.misses == 1
    assert label == real(5)[1]
    crops = {tuple(cache[5][0].flatten()[:64].tolist()) for _ in range(20)}
    assert len(crops) > 1, "the augmentation must run on every access, not be cached"
    ds.augment = False
    torch.testing.assert_close(cache[3][0], real(3)[0])


def test_cache_fill_and_a_plain_dataset() -> None:
    cache = InMemoryCache(SyntheticImages(6), fill=True, disable=True)
    assert cache.filled == 6 and cache.nbytes == 6 * 3 * 32 * 32
    plain = InMemoryCache([(torch.ones(2) * i, i) for i in range(3)], fill=True, disable=True)
    assert not plain.split and plain.filled == 3 and plain[2][1] == 2


def test_cache_that_does_not_fit_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(caching.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    with pytest.raises(MemoryError, match="GiB are free"):
        InMemoryCache(SyntheticImages(8))
