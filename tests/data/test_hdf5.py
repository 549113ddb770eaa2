"""gpulab.data.hdf5: synthetic images, exact round trips, atomic writes, chunk shapes."""

from __future__ import annotations

import math
import os

import h5py
import numpy as np
import pytest
import torch
from h5_fixtures import N, data, gzip_file  # noqa: F401 - pytest fixtures

from gpulab.data.hdf5 import H5Dataset, inspect_h5, make_images, suggest_chunks, write_h5


def test_make_images_is_deterministic_and_photo_like() -> None:
    a, la = make_images(10, (3, 8, 8), seed=1)
    b, lb = make_images(10, (3, 8, 8), seed=1)
    c, _ = make_images(10, (3, 8, 8), seed=2)
    assert a.shape == (10, 3, 8, 8) and a.dtype == np.uint8 and la.dtype == np.int64
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(a, c)
    assert 10 < a.std() < 100  # neither constant nor saturated


@pytest.mark.parametrize("kw", [
    dict(layout="contiguous"),
    dict(layout="chunked"),
    dict(layout="chunked", chunks=(5, 3, 16, 16), compression="gzip"),
    dict(layout="chunked", chunks=(7, 1, 8, 16), compression="lzf"),
    dict(layout="chunked", chunks=True, compression="gzip"),
    dict(layout="chunked", fletcher32=True),
])
def test_round_trip_is_exact(tmp_path, data, kw) -> None:
    images, labels = data
    path = write_h5(tmp_path / "d.h5", torch.from_numpy(images), torch.from_numpy(labels), disable=True, **kw)
    with h5py.File(path, "r") as f:
        np.testing.assert_array_equal(f["images"][:], images)
        np.testing.assert_array_equal(f["labels"][:], labels)
        assert f["images"].dtype == np.uint8
        assert (f["images"].chunks is None) == (kw["layout"] == "contiguous")
        assert f["images"].compression == kw.get("compression")
    ds = H5Dataset(path)
    for i in (0, 41, N - 1):
        image, label = ds[i]
        assert torch.equal(image, torch.from_numpy(images[i])) and label == labels[i]
    assert sorted(os.listdir(tmp_path)) == ["d.h5"]  # no temporary file left behind


def test_default_chunks_follow_suggest_chunks(tmp_path, data) -> None:
    path = write_h5(tmp_path / "c.h5", *data, layout="chunked", disable=True)
    assert inspect_h5(path).chunks == suggest_chunks((N, 3, 16, 16), np.uint8, "sample")


@pytest.mark.parametrize("kw, match", [
    (dict(layout="striped"), "layout must be"),
    (dict(compression="gzip"), "need layout='chunked'"),
    (dict(layout="chunked", compression="zstd"), "compression must be"),
    (dict(layout="chunked", chunks=(4, 3, 16)), "one size per axis"),
    (dict(layout="chunked", chunks=(0, 3, 16, 16)), "between 1 and"),
])
def test_bad_write_arguments_name_the_fix(tmp_path, data, kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        write_h5(tmp_path / "x.h5", *data, disable=True, **kw)
    assert not os.listdir(tmp_path)


def test_labels_must_match_images(tmp_path, data) -> None:
    with pytest.raises(ValueError, match="labels must have shape"):
        write_h5(tmp_path / "x.h5", data[0], data[1][:-1], disable=True)


class _FailingImages:
    """An array-like that raises after ``ok`` rows have been handed out (a crash mid-write)."""

    def __init__(self, images: np.ndarray, ok: int, exc: BaseException) -> None:
        self.images, self.ok, self.exc = images, ok, exc
        self.shape, self.dtype = images.shape, images.dtype

    def __getitem__(self, sl: slice) -> np.ndarray:
        if sl.start >= self.ok:
            raise self.exc
        return self.images[sl]


@pytest.mark.parametrize("exc", [RuntimeError("disk full"), KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing_and_keeps_the_old_file(tmp_path, data, exc) -> None:
    images, labels = make_images(600, (3, 8, 8), seed=0)
    with pytest.raises(type(exc)):
        write_h5(tmp_path / "new.h5", _FailingImages(images, 300, exc), labels, disable=True)
    assert not os.listdir(tmp_path), "an interrupted write must not leave a file behind"

    old = write_h5(tmp_path / "d.h5", images[:10], labels[:10], disable=True)
    before = old.read_bytes()
    with pytest.raises(type(exc)):
        write_h5(old, _FailingImages(images, 300, exc), labels, layout="chunked", compression="gzip", disable=True)
    assert sorted(os.listdir(tmp_path)) == ["d.h5"] and old.read_bytes() == before


def test_suggest_chunks_follows_the_10kib_to_1mib_guidance() -> None:
    for sample_shape in [(3, 8, 8), (3, 32, 32), (3, 64, 64), (1, 28, 28), (3, 224, 224), (100,)]:
        shape = (100_000, *sample_shape)
        sample_bytes = math.prod(sample_shape)
        small = suggest_chunks(shape, np.uint8, "sample")
        assert small[1:] == sample_shape
        assert small[0] * sample_bytes >= 10 * 1024 and (small[0] - 1) * sample_bytes < 10 * 1024
        big = suggest_chunks(shape, np.uint8, "chunk")
        assert big[1:] == sample_shape and big[0] & (big[0] - 1) == 0  # a power of two
        assert big[0] * sample_bytes <= 1 << 20 < 2 * big[0] * sample_bytes
    assert suggest_chunks((5, 3, 8, 8), np.float32, "chunk")[0] == 5  # never more rows than samples
    huge = suggest_chunks((10, 3, 1024, 1024), np.float32, "sample")  # a 12 MiB sample is split
    assert huge[0] == 1 and math.prod(huge) * 4 <= 1 << 20
    with pytest.raises(ValueError, match="access must be"):
        suggest_chunks((10, 3), np.uint8, "random")
