"""Lab 03's graders for ``LazyH5`` (exercise 2): the files a lazy HDF5 dataset leaves open, what a
pickled copy reads, and which process opens the file while forked DataLoader workers read.

Re-exported by :mod:`gpulab.grading.lab03`, which the test cells import. Everything here runs the
student's class and returns plain values for ``grading.check_*`` to send; nothing decides.
"""

from __future__ import annotations

import collections
import gc
import os
import pickle
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import h5py
import torch
from torch.utils.data import DataLoader

__all__ = ["open_h5_files", "gpulab_bases", "lazy_facts", "h5_opens", "worker_reads"]


def open_h5_files() -> int:
    """How many HDF5 files this process has open."""
    gc.collect()  # a dataset dropped earlier closes its file now, not in the middle of a count
    return h5py.h5f.get_obj_count(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_FILE)


def gpulab_bases(cls: type) -> list[str]:
    """The classes of gpulab that ``cls`` derives from (LazyH5 must be written from torch's Dataset)."""
    return [f"{c.__module__}.{c.__qualname__}" for c in cls.__mro__[1:] if c.__module__.split(".")[0] == "gpulab"]


def lazy_facts(make: Callable[[Any], Any], path: Path, indices: Sequence[int]) -> dict[str, Any]:
    """What a lazy HDF5 dataset class ``make`` does on ``path``: the files its constructor leaves
    open, its length, the samples at ``indices`` (images stacked, labels), and what a pickled
    copy, made after use, reads."""
    before = open_h5_files()
    ds = make(path)
    facts: dict[str, Any] = {"HDF5 files left open by the constructor": open_h5_files() - before, "len": len(ds)}
    items = [ds[i] for i in indices]
    facts["images"] = torch.stack([torch.as_tensor(image) for image, _ in items])
    facts["labels"] = [int(label) for _, label in items]
    copy = pickle.loads(pickle.dumps(ds))
    facts["images read by a copy pickled after use"] = torch.stack([torch.as_tensor(copy[i][0]) for i in indices[:4]])
    return facts


@contextmanager
def h5_opens(log: Path) -> Iterator[None]:
    """While inside, every ``h5py.File(...)`` call, in this process or a forked one, appends the
    calling process' id to ``log``."""
    real = h5py.File
    log = Path(log)
    log.write_text("")

    def recording(*args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    h5py.File = recording
    try:
        yield
    finally:
        h5py.File = real


def worker_reads(make: Callable[[Any], Any], path: Path, indices: Sequence[int], log: Path) -> dict[str, Any]:
    """Read ``indices`` of ``make(path)`` through a DataLoader with 2 forked workers, after the
    parent has read one sample (its file is open when the workers fork). Returns the images and
    labels read, how many times each process opened the file while the workers ran (sorted), and
    whether the parent was one of them."""
    ds = make(path)
    ds[int(indices[0])]
    with h5_opens(log):
        loader = DataLoader(
            ds, batch_size=16, sampler=list(indices), num_workers=2, multiprocessing_context="fork", timeout=60
        )
        images, labels = map(torch.cat, zip(*loader))
    pids = [int(p) for p in Path(log).read_text().split()]
    return {
        "images": images,
        "labels": labels,
        "opens per process": sorted(collections.Counter(pids).values()),
        "the parent opened it again": os.getpid() in pids,
    }
