"""SyntheticImages: deterministic uint8 images, real decode work, a correct augmentation."""

from __future__ import annotations

import random
import zlib

import pytest
import torch

from gpulab.data import synthetic
from gpulab.data.synthetic import StallingReads, SyntheticImages
from gpulab.data.transfer import normalize_on_host

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def test_deterministic_by_seed_uint8_with_labels() -> None:
    a, b, c = SyntheticImages(16, seed=3), SyntheticImages(16, seed=3), SyntheticImages(16, seed=4)
    for i in range(16):
        img, label = a.load(i)
        assert img.dtype == torch.uint8 and img.shape == (3, 32, 32) and 0 <= label < 10
        assert torch.equal(img, b.load(i)[0]) and label == b.load(i)[1]
    assert any(not torch.equal(a.load(i)[0], c.load(i)[0]) for i in range(16))


def test_each_access_really_inflates_the_buffer(monkeypatch) -> None:
    ds = SyntheticImages(4, decode_repeats=5)
    calls = []
    real = zlib.decompress
    monkeypatch.setattr(synthetic.zlib, "decompress", lambda buf: calls.append(len(buf)) or real(buf))
    ds[2]
    assert len(calls) == 5


def test_augmentation_is_a_random_crop_of_the_padded_image_and_a_flip() -> None:
    ds = SyntheticImages(2)
    img, _ = ds.load(1)
    padded = torch.zeros(3, 40, 40, dtype=torch.uint8)
    padded[:, 4:36, 4:36] = img
    seen = set()
    for k in range(40):
        random.seed(k)
        out = ds.transform(img)
        random.seed(k)
        di, dj, flip = random.randint(-4, 4), random.randint(-4, 4), random.random() < 0.5
        ref = padded[:, 4 + di:36 + di, 4 + dj:36 + dj]
        assert torch.equal(out, ref.flip(-1) if flip else ref)
        seen.add((di, dj, flip))
    assert len(seen) > 10
    ds.augment = False
    assert torch.equal(ds.transform(img), img)


def test_normalize_gives_float32_equal_to_the_reference() -> None:
    raw = SyntheticImages(4, augment=False)
    ds = SyntheticImages(4, augment=False, normalize=(MEAN, STD))
    x, _ = ds[1]
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, normalize_on_host(raw.load(1)[0], MEAN, STD))


@pytest.mark.parametrize("kwargs", [{"num_samples": 0}, {"decode_repeats": 0}, {"image_size": -1}])
def test_bad_sizes(kwargs) -> None:
    with pytest.raises(ValueError, match="must be a positive int"):
        SyntheticImages(**{"num_samples": 4, **kwargs})


def test_normalize_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="3 channels"):
        SyntheticImages(4, normalize=((0.5, 0.5), (0.2, 0.2)))


def test_index_out_of_range() -> None:
    with pytest.raises(IndexError):
        SyntheticImages(4).load(4)


def test_stalling_reads_wait_on_every_stall_every_th_sample() -> None:
    import time

    ds = StallingReads(40, read_s=0.0, stall_s=0.03, stall_every=16)
    assert len(ds) == 40 and [i for i in range(40) if ds.wait_s(i) > 0] == [0, 16, 32]
    t0 = time.perf_counter()
    image, label = ds[16]
    assert time.perf_counter() - t0 >= 0.03  # a sleep lasts at least its time, however loaded the machine
    assert image.dtype == torch.uint8 and image.shape == (3, 8, 8) and label == 6
    assert ds[-1][1] == 9
    with pytest.raises(IndexError):
        ds[40]
    for bad in (dict(stall_s=-1.0), dict(read_s=-0.1), dict(stall_every=0), dict(num_samples=0)):
        with pytest.raises(ValueError):
            StallingReads(**bad)
