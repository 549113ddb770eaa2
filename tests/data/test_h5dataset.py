"""gpulab.data.h5dataset: lazy per-process opening, pickling, workers, and bad files."""

from __future__ import annotations

import os
import pickle

import h5py
import numpy as np
import pytest
import torch
from h5_fixtures import N, data, gzip_file  # noqa: F401 - pytest fixtures
from torch.utils.data import DataLoader

from gpulab.data.hdf5 import EagerH5Dataset, H5Dataset, H5FileError, inspect_h5, write_h5


def test_dataset_reads_equal_direct_reads(gzip_file, data) -> None:
    ds = H5Dataset(gzip_file, rdcc_nbytes=1 << 16, rdcc_nslots=101, rdcc_w0=0.5)
    assert len(ds) == N and ds.chunk_rows == 8
    images = torch.stack([ds[i][0] for i in range(N)])
    assert torch.equal(images, torch.from_numpy(data[0]))
    assert ds[np.int64(5)][1] == data[1][5] and ds[torch.tensor(6)][1] == data[1][6]
    with pytest.raises(IndexError):
        ds[N]
    assert ds._file.id.get_access_plist().get_cache()[1:3] == (101, 1 << 16)


def test_construction_does_not_keep_the_file_open(gzip_file) -> None:
    before = h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)
    ds = H5Dataset(gzip_file)
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == before
    ds[0]
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == before + 1
    ds.close()
    assert h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE) == before


def test_pickles_after_use_but_the_eager_version_does_not(gzip_file, data) -> None:
    ds = H5Dataset(gzip_file)
    ds[3]
    copy = pickle.loads(pickle.dumps(ds))
    assert torch.equal(copy[3][0], torch.from_numpy(data[0][3]))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(EagerH5Dataset(gzip_file))


def test_two_spawned_workers_equal_direct_reads(gzip_file, data) -> None:
    ds = H5Dataset(gzip_file)
    ds[0]  # opened in the parent first: the workers must still get a clean, picklable copy
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(ds, batch_size=16, sampler=order, num_workers=2, multiprocessing_context="spawn", timeout=120)
    images, labels = map(torch.cat, zip(*loader))
    assert torch.equal(images, torch.from_numpy(data[0][order]))
    assert torch.equal(labels, torch.from_numpy(data[1][order]))


class _WhoOpened(H5Dataset):
    def __getitem__(self, index):
        image, label = super().__getitem__(index)
        return image, label, self._pid, os.getpid()


def test_forked_workers_reopen_instead_of_sharing_the_parent_handle(gzip_file, data) -> None:
    ds = _WhoOpened(gzip_file)
    ds[0]
    loader = DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=60)
    images, _, opener, reader = map(torch.cat, zip(*loader))
    assert torch.equal(images, torch.from_numpy(data[0]))
    assert torch.equal(opener, reader) and os.getpid() not in reader.tolist()
    assert len(set(reader.tolist())) == 2


def test_missing_file_says_how_to_make_it(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="write_h5"):
        H5Dataset(tmp_path / "nope.h5")


@pytest.mark.parametrize("damage", ["truncate", "garbage", "header"])
def test_truncated_or_corrupt_file_names_the_file_and_the_fix(tmp_path, data, damage) -> None:
    path = write_h5(tmp_path / "bad.h5", *data, disable=True)
    raw = bytearray(path.read_bytes())
    if damage == "truncate":
        raw = raw[: len(raw) // 2]
    elif damage == "garbage":
        raw = bytearray(np.random.default_rng(0).integers(0, 256, len(raw), dtype=np.uint8).tobytes())
    else:
        raw[:64] = b"\0" * 64  # the superblock
    path.write_bytes(bytes(raw))
    with pytest.raises(H5FileError, match="write_h5") as err:
        H5Dataset(path)
    assert str(path) in str(err.value)


def test_missing_dataset_is_named(tmp_path) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as f:
        f["images"] = np.zeros((4, 2), np.uint8)
    with pytest.raises(H5FileError, match=r"no \['labels'\] dataset"):
        inspect_h5(tmp_path / "other.h5")


def _corrupt_chunk(path, k: int) -> None:
    with h5py.File(path, "r") as f:
        info = f["images"].id.get_chunk_info(k)
    with open(path, "r+b") as fh:
        fh.seek(info.byte_offset + 10)
        fh.write(b"\xff" * 40)


@pytest.mark.parametrize("kw", [dict(compression="gzip"), dict(fletcher32=True)])
def test_corrupt_chunk_fails_on_read_naming_the_file_even_in_a_worker(tmp_path, data, kw) -> None:
    path = write_h5(tmp_path / "c.h5", *data, layout="chunked", chunks=(8, 3, 16, 16), disable=True, **kw)
    _corrupt_chunk(path, 5)  # samples 40..47
    ds = H5Dataset(path)  # the ends are fine, so construction passes
    ds[0]
    with pytest.raises(H5FileError, match="reading sample 41 failed"):
        ds[41]
    loader = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="fork", timeout=60)
    with pytest.raises(H5FileError, match=str(path)):
        list(loader)


def test_a_file_damaged_after_construction_fails_in_the_worker_naming_it(tmp_path, data) -> None:
    path = write_h5(tmp_path / "later.h5", *data, disable=True)
    ds = H5Dataset(path)  # valid now
    path.write_bytes(path.read_bytes()[:2000])  # then cut short by a crashed copy
    loader = DataLoader(ds, batch_size=8, num_workers=1, multiprocessing_context="fork", timeout=60)
    with pytest.raises(H5FileError, match=f"{path}: cannot be opened in process .*write_h5"):
        next(iter(loader))


def test_eager_dataset_closes_its_handle(gzip_file) -> None:
    # Watch this dataset's own handle: a global open-file count also moves when garbage from
    # earlier tests is collected in between.
    eager = EagerH5Dataset(gzip_file)
    handle = eager._file.id
    assert handle.valid, "the eager dataset opens the file in __init__"
    eager.close()
    assert not handle.valid, "close() must close the HDF5 file"
