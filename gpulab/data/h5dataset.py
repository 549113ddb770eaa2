"""Reading lab 03's HDF5 files: validation with a useful error, and a fork/spawn-safe Dataset.

``H5Dataset`` opens its file lazily, in the process that reads (each DataLoader worker), and
never carries an open handle across ``fork`` or ``pickle``. ``EagerH5Dataset`` is the naive
version, kept to demonstrate the bug. Import both from :mod:`gpulab.data.hdf5`.

    ds = H5Dataset("train.h5", rdcc_nbytes=1 << 20)   # validates the file, keeps nothing open
    loader = DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context="spawn")

The bug: an h5py file opened before the DataLoader starts its workers cannot be pickled for
spawned workers, and is shared, mid-use, by forked ones (pytorch/pytorch#11887 and #11929).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import Dataset

from gpulab.data.chunk_cache import CacheConfig

__all__ = ["H5FileError", "H5Info", "inspect_h5", "H5Dataset", "EagerH5Dataset"]

_REGENERATE = "Regenerate it with gpulab.data.hdf5.write_h5(path, images, labels, ...)."


class H5FileError(OSError):
    """An HDF5 file that is missing pieces, truncated or corrupt; the message names the file."""


@dataclass(frozen=True)
class H5Info:
    """What :func:`inspect_h5` found: the shape, dtype and storage of the ``images`` dataset."""

    path: Path
    num_samples: int
    sample_shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...] | None
    compression: str | None

    @property
    def sample_nbytes(self) -> int:
        """Bytes of one uncompressed sample."""
        return math.prod(self.sample_shape) * self.dtype.itemsize

    @property
    def chunk_nbytes(self) -> int | None:
        """Bytes of one uncompressed chunk (what the chunk cache holds), or None if contiguous."""
        return math.prod(self.chunks) * self.dtype.itemsize if self.chunks else None


def inspect_h5(path: str | os.PathLike) -> H5Info:
    """Open ``path``, check it holds matching ``images``/``labels`` datasets, read its ends, close it.

    Raises:
        FileNotFoundError: no file at ``path``.
        H5FileError: not HDF5, truncated, missing a dataset, or a sample cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such HDF5 file. Create it with gpulab.data.hdf5.write_h5(path, images, labels).")
    try:
        with h5py.File(path, "r") as f:
            missing = [k for k in ("images", "labels") if not isinstance(f.get(k), h5py.Dataset)]
            if missing:
                raise H5FileError(f"{path}: no {missing} dataset(s); it was not written by write_h5. {_REGENERATE}")
            images, labels = f["images"], f["labels"]
            if images.ndim < 2 or images.shape[0] < 1 or labels.shape != (images.shape[0],):
                raise H5FileError(f"{path}: images {images.shape} and labels {labels.shape} do not match. {_REGENERATE}")
            images[0], images[-1], labels[-1]  # raw data at both ends (catches a cut-off tail)
            return H5Info(path, images.shape[0], tuple(images.shape[1:]), images.dtype, images.chunks,
                          images.compression)
    except H5FileError:
        raise
    except (OSError, KeyError, ValueError, RuntimeError) as err:
        raise H5FileError(f"{path}: cannot be read as HDF5 (truncated or corrupt: {err}). {_REGENERATE}") from err


class H5Dataset(Dataset):
    """Samples ``(image, label)`` from a ``write_h5`` file, opened lazily in each process.

    The constructor only validates the file (open, check, close); the handle is opened on the
    first ``__getitem__`` *in the process that reads*, and re-opened if the object finds itself
    in a new process (a forked DataLoader worker). Pickling drops the handle, so spawned
    workers get a picklable object and open their own.

    Args:
        path: a file written by :func:`gpulab.data.hdf5.write_h5`.
        rdcc_nbytes, rdcc_nslots, rdcc_w0: the chunk cache of this process' handle (bytes,
            hash slots, preemption weight); ``None`` keeps the HDF5 library default
            (1 MiB before HDF5 2.0, 8 MiB from 2.0). Each worker has its own cache.

    Raises:
        FileNotFoundError, H5FileError: at construction, or in a worker, naming the file.
    """

    def __init__(self, path: str | os.PathLike, rdcc_nbytes: int | None = None,
                 rdcc_nslots: int | None = None, rdcc_w0: float | None = None) -> None:
        self.path = Path(path)
        self.cache = CacheConfig(rdcc_nbytes, rdcc_nslots, rdcc_w0)
        self.info = inspect_h5(self.path)
        self._file: h5py.File | None = None
        self._pid: int | None = None

    @property
    def chunk_rows(self) -> int | None:
        """Samples per chunk along axis 0 (what :class:`ChunkShuffleSampler` groups by), or None."""
        return self.info.chunks[0] if self.info.chunks else None

    def __len__(self) -> int:
        return self.info.num_samples

    def _open_file(self) -> h5py.File:
        return h5py.File(self.path, "r", **self.cache.kwargs())

    def _ensure_open(self) -> None:
        if self._file is None or self._pid != os.getpid():
            try:
                self._file = self._open_file()
                self._images, self._labels = self._file["images"], self._file["labels"][:]
            except (OSError, KeyError) as err:
                raise H5FileError(f"{self.path}: cannot be opened in process {os.getpid()} ({err}). {_REGENERATE}") from err
            self._pid = os.getpid()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        index = int(index)  # numpy and 0-d tensor indices too
        self._ensure_open()
        try:
            image = self._images[index]  # one hyperslab read: every chunk it overlaps is loaded
        except (OSError, ValueError) as err:
            raise H5FileError(f"{self.path}: reading sample {index} failed ({err}); the file is corrupt. "
                              f"{_REGENERATE}") from err
        return torch.from_numpy(image), int(self._labels[index])

    def close(self) -> None:
        """Close this process' handle (the next read re-opens it)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = self._pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()  # h5py handles cannot be pickled: the copy re-opens lazily
        for key in ("_file", "_pid", "_images", "_labels"):
            state.pop(key, None)
        state["_file"] = state["_pid"] = None
        return state


class EagerH5Dataset(H5Dataset):
    """The naive version: opens the file in ``__init__`` and shares that handle with every worker.

    Kept to show the bug, never to use. Under spawn, the DataLoader cannot pickle it
    (``TypeError: h5py objects cannot be pickled``). Under fork, every worker inherits the
    parent's handle: the same open file, one HDF5 library state copied mid-use; whether reads
    come back right then depends on the HDF5 build and driver (lab 03 measures it).
    """

    def __init__(self, path: str | os.PathLike, rdcc_nbytes: int | None = None,
                 rdcc_nslots: int | None = None, rdcc_w0: float | None = None) -> None:
        super().__init__(path, rdcc_nbytes, rdcc_nslots, rdcc_w0)
        self._file, self._pid = self._open_file(), os.getpid()
        self._images, self._labels = self._file["images"], self._file["labels"][:]

    def _ensure_open(self) -> None:
        pass  # the bug: whatever handle this object carries is used, in whichever process

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()  # contains the h5py handle: pickling raises
