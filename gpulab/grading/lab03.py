"""Lab 03's graders: the references the HDF5 exercises are judged against, the random inputs the
hidden tests draw from the grading run's seed, and the reads the grader times.

Everything here runs the student's code and returns plain values for ``grading.check_*`` to send;
nothing decides. The timed work (:func:`shuffled_reads`, :func:`chunk_reads`) returns a checksum
of every sample it read, ordered by index, so that the grader can compare it with the reference
run's for the same seed whatever the order of the reads: a read skipped or faked changes it.
"""

from __future__ import annotations

import collections
import gc
import math
import os
import pickle
import random
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader

from gpulab.data.chunk_cache import next_prime, suggest_cache
from gpulab.data.chunk_sampler import ChunkShuffleSampler
from gpulab.data.hdf5 import H5Dataset, rows_for_random_reads, suggest_chunks, write_h5

__all__ = ["REFERENCES", "MiB", "CACHE_BUDGET", "storage_cases", "reference_storage", "storage_facts",
           "storage_readers", "shuffled_reads", "read_checksum", "chunk_reads", "random_order", "sampler_cases",
           "sampler_facts", "sampler_statistics", "reference_sampler", "lazy_facts", "worker_reads", "h5_opens",
           "gpulab_bases", "open_h5_files"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the chunk rule for random reads and the cache rule behind choose_storage
# (suggest_chunks(access="chunk"), which the demos and the baseline use, keeps working), and the
# chunk-aware sampler behind ChunkShuffle (the lab's demo of groups of chunks is skipped while
# graded). H5Dataset, the reference of LazyH5, stays: every demo and test reads through it.
REFERENCES: tuple = (rows_for_random_reads, suggest_cache, next_prime, ChunkShuffleSampler)

MiB = 1 << 20
CACHE_BUDGET = 4 * MiB  # choose_storage's chunk cache, at most
DTYPES = ("uint8", "int16", "float16", "float32", "float64")


# ---- choose_storage ----------------------------------------------------------------------------

def storage_cases(rng: random.Random, n: int) -> list[tuple[int, tuple[int, ...], str]]:
    """``n`` random ``(num_samples, sample_shape, dtype)`` arguments of ``choose_storage``: samples of
    1 to 4 axes from a few bytes to 1 MiB, datasets from 1 sample to 100,000, five dtypes, and the
    edge cases (fewer samples than a 10 KiB chunk needs, one sample bigger than the floor)."""
    cases = [(3, (7,), "uint8"), (1, (2, 2), "float64"), (50, (3, 64, 64), "uint8"), (10, (256, 256), "float32")]
    while len(cases) < n:
        dtype = rng.choice(DTYPES)
        itemsize = np.dtype(dtype).itemsize
        shape: list[int] = []
        for _ in range(rng.randint(1, 4)):
            room = max(1, MiB // (itemsize * math.prod(shape or [1])))
            shape.append(rng.randint(1, min(room, rng.choice([4, 32, 256, 4096]))))
        cases.append((rng.choice([1, 2, rng.randint(3, 100), rng.randint(100, 100_000)]), tuple(shape), dtype))
    rng.shuffle(cases)
    return cases[:n]


def reference_storage(num_samples: int, sample_shape: Sequence[int], dtype: Any) -> dict[str, Any]:
    """gpulab's answer to ``choose_storage``: chunks of the fewest whole samples that reach 10 KiB,
    and a cache of as many of them as fit in 4 MiB, with h5py's slot rule."""
    chunks = suggest_chunks((num_samples, *sample_shape), dtype, access="sample")
    chunk_nbytes = math.prod(chunks) * np.dtype(dtype).itemsize
    cache = suggest_cache(chunk_nbytes, max(1, CACHE_BUDGET // chunk_nbytes))
    return {"chunks": tuple(chunks), "rdcc_nbytes": cache.rdcc_nbytes, "rdcc_nslots": cache.rdcc_nslots}


def _is_prime(n: int) -> bool:  # not next_prime: that reference is masked in a graded kernel
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def storage_facts(choice: Any, shape: Sequence[int], dtype: Any) -> dict[str, Any]:
    """What the exercise asks of a ``choose_storage`` answer for an array of ``shape`` and ``dtype``,
    as values (the same for every correct answer, whichever design reached it):

    - its keys, the number of chunk axes, each chunk size within its axis;
    - chunks of whole samples (split along axis 0 only: a shuffled read then touches one chunk);
    - 10 KiB to 1 MiB per chunk, h5py's guidance for chunk sizes (fewer bytes cost an index entry and
      a filter call per few samples; more cost decompression per read), except that a chunk may hold
      every sample when all of them are under 10 KiB, or a single sample over 1 MiB;
    - a cache of at least one whole chunk and at most 4 MiB, with a prime number of hash slots
      between 100x and 200x the chunks it holds (h5py's "about 100 times", a prime for even hashing).

    A near-constant answer (one sample per chunk, a fixed cache) misses the size band or the slot
    rule on some of the hidden test's arrays, which range from a few bytes to 1 MiB per sample."""
    wanted = ("chunks", "rdcc_nbytes", "rdcc_nslots")
    keys = [k for k in wanted if k in choice] if isinstance(choice, dict) else f"a {type(choice).__name__}"
    facts: dict[str, Any] = {"keys (of chunks, rdcc_nbytes, rdcc_nslots)": keys}
    if keys != list(wanted):
        return facts
    try:
        chunks = tuple(int(c) for c in choice["chunks"])
    except (TypeError, ValueError):
        chunks = None
    facts["axes of chunks"] = None if chunks is None else len(chunks)
    fits = chunks is not None and len(chunks) == len(shape) and all(1 <= c <= n for c, n in zip(chunks, shape))
    facts["each chunk size between 1 and its axis' length"] = fits
    whole = fits and tuple(chunks[1:]) == tuple(shape[1:])
    facts["chunks hold whole samples"] = whole
    sample_nbytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    chunk_nbytes = chunks[0] * sample_nbytes if whole else None
    facts["10 KiB to 1 MiB per chunk"] = whole and (chunk_nbytes >= 10 * 1024 or chunks[0] == shape[0]) \
        and (chunk_nbytes <= MiB or chunks[0] == 1)
    nbytes, nslots = choice["rdcc_nbytes"], choice["rdcc_nslots"]
    facts["rdcc_nbytes an int from one chunk to 4 MiB"] = _is_int(nbytes) and nbytes <= CACHE_BUDGET \
        and chunk_nbytes is not None and nbytes >= chunk_nbytes
    held = int(nbytes) // chunk_nbytes if facts["rdcc_nbytes an int from one chunk to 4 MiB"] else 0
    facts["rdcc_nslots a prime, 100x to 200x the chunks the cache holds"] = _is_int(nslots) and held >= 1 \
        and 100 * held <= nslots <= 200 * held and _is_prime(int(nslots))
    return facts


def storage_readers(choice: dict[str, Any], images: np.ndarray, labels: np.ndarray, folder: Path,
                    name: str) -> tuple[H5Dataset, H5Dataset]:
    """Write ``images`` twice, gzip-compressed: the given way (whole images in chunks of up to 1 MiB,
    ``suggest_chunks(access="chunk")``, read with a 1 MiB cache) and as ``choice`` (what
    ``choose_storage`` returned) says. Returns ``(baseline, yours)``, both open (sample 0 read)."""
    folder = Path(folder)
    base_chunks = suggest_chunks(images.shape, images.dtype, access="chunk")
    base = H5Dataset(write_h5(folder / f"{name}-given.h5", images, labels, "chunked", base_chunks, "gzip", disable=True),
                     rdcc_nbytes=1 * MiB, rdcc_nslots=10007)
    chunks = tuple(int(c) for c in choice["chunks"])
    mine = H5Dataset(write_h5(folder / f"{name}-yours.h5", images, labels, "chunked", chunks, "gzip", disable=True),
                     rdcc_nbytes=int(choice["rdcc_nbytes"]), rdcc_nslots=int(choice["rdcc_nslots"]))
    base[0], mine[0]  # open both outside the timed reads
    return base, mine


def read_checksum(read: Callable[[int], Any], indices: Iterable[int]) -> torch.Tensor:
    """Read ``read(i)`` for every ``i``, in that order; return one number per sample read (the sum of
    its pixels, and its label), ordered by index: the same for any order of the same reads."""
    sums: dict[int, int] = {}
    for i in indices:
        image, label = read(int(i))
        sums[int(i)] = int(torch.as_tensor(image).sum(dtype=torch.int64)) * 1000 + int(label)
    return torch.tensor([sums[i] for i in sorted(sums)] + [len(sums)], dtype=torch.int64)


def shuffled_reads(dataset: H5Dataset, count: int) -> Callable[[int], torch.Tensor]:
    """One unit of timed work: ``fn(seed)`` reads ``count`` samples of ``dataset`` in a random order
    drawn from ``seed`` (a shuffled DataLoader's reads), one at a time; returns their checksum."""
    n = len(dataset)

    def work(seed: int) -> torch.Tensor:
        return read_checksum(dataset.__getitem__, random.Random(seed).sample(range(n), min(count, n)))

    return work


# ---- ChunkShuffle ------------------------------------------------------------------------------

def random_order(n: int, k: int, seed: int) -> list[int]:
    """A plain shuffled epoch of ``n`` samples (``RandomSampler``'s order), from ``seed``."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def reference_sampler(n: int, k: int, seed: int = 0) -> ChunkShuffleSampler:
    """gpulab's ``ChunkShuffle``: one chunk per group."""
    return ChunkShuffleSampler(n, k, seed=seed)


def chunk_reads(dataset: H5Dataset, num_chunks: int, order: Callable[[int, int, int], Iterable[int]]
                ) -> Callable[[int], torch.Tensor]:
    """One unit of timed work: ``fn(seed)`` reads every sample of ``num_chunks`` chunks of ``dataset``
    (drawn from ``seed``) in the order ``order(n, chunk_rows, seed)`` gives over a dataset of just
    those chunks (index ``j`` is sample ``j % chunk_rows`` of the ``j // chunk_rows``-th chosen
    chunk); returns the checksum of what was read."""
    k = int(dataset.chunk_rows)
    full = len(dataset) // k

    def work(seed: int) -> torch.Tensor:
        chosen = random.Random(seed).sample(range(full), min(num_chunks, full))
        n = len(chosen) * k
        picked = []
        for j in order(n, k, seed):
            j = int(j)
            picked.append(chosen[j // k] * k + j % k if 0 <= j < n else -1)
        return read_checksum(lambda i: dataset[i] if i >= 0 else (torch.zeros(()), -1), picked)

    return work


def sampler_cases(rng: random.Random, n: int) -> list[tuple[int, int, int, int]]:
    """``n`` random ``(num_samples, chunk_size, seed, epoch)``: a few edge cases (one chunk, one
    sample per chunk, a chunk bigger than the dataset, a short last chunk) and random ones."""
    cases = [(64, 64, rng.randrange(100), rng.randrange(10)), (5, 1, rng.randrange(100), rng.randrange(10)),
             (7, 10, rng.randrange(100), rng.randrange(10))]
    while len(cases) < n:
        size = rng.randint(2, 1200)
        cases.append((size, rng.randint(1, max(1, size // rng.choice([1, 2, 5, 20]))), rng.randrange(1000),
                      rng.randrange(50)))
    rng.shuffle(cases)
    return cases


def _epoch(make: Callable[..., Any], n: int, k: int, seed: int, epoch: int) -> list[int]:
    sampler = make(n, k, seed=seed)
    sampler.set_epoch(epoch)
    return [int(i) for i in sampler]


def _runs(order: Sequence[int], k: int) -> list[list[int]]:
    """``order`` cut where the chunk changes: one list of indices per run over one chunk."""
    runs: list[list[int]] = []
    for n, i in enumerate(order):
        if n == 0 or i // k != order[n - 1] // k:
            runs.append([])
        runs[-1].append(i)
    return runs


@contextmanager
def _other_global_state(seed: int) -> Iterator[None]:
    """Torch's, Python's and numpy's global random state set from ``seed``, and restored after."""
    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


def sampler_facts(make: Callable[..., Any], cases: Sequence[tuple[int, int, int, int]]) -> dict[str, Any]:
    """For each case, what the exercise fixes about ``make(n, k, seed=seed)``'s epoch: its runs over
    chunks, each sorted and in chunk order (one run per chunk, every index once), its ``len``, and
    whether another global random state gives the same order."""
    facts = {}
    for n, k, seed, epoch in cases:
        got = _epoch(make, n, k, seed, epoch)
        with _other_global_state(seed + epoch + 99):
            again = _epoch(make, n, k, seed, epoch)
        facts[f"ChunkShuffle({n}, {k}, seed={seed}) at epoch {epoch}"] = {
            "runs over chunks, each sorted": sorted(sorted(run) for run in _runs(got, k)),
            "len": len(make(n, k, seed=seed)),
            "the same order in another global random state": again == got,
        }
    return facts


def sampler_statistics(make: Callable[..., Any], seed: int, epochs: int = 200) -> dict[str, bool]:
    """Whether ``make``'s orders are random where the exercise says: another seed and another epoch
    give another order, and over ``epochs`` epochs of 40 samples in chunks of 4, every chunk comes
    first sometimes (expected 20 times each) and every index of chunk 0 starts its run sometimes
    (expected 50 times each)."""
    first_chunk, first_in_chunk = [0] * 10, [0] * 4
    for epoch in range(epochs):
        got = _epoch(make, 40, 4, seed, epoch)
        first_chunk[got[0] // 4 % 10] += 1
        start = got.index(0) - got.index(0) % 4 if 0 in got else 0
        first_in_chunk[got[start] % 4] += 1
    base = _epoch(make, 100, 10, seed, 0)
    return {"another seed gives another order": _epoch(make, 100, 10, seed + 1, 0) != base,
            "another epoch gives another order": _epoch(make, 100, 10, seed, 1) != base,
            f"over {epochs} epochs every chunk comes first at least 3 times": min(first_chunk) >= 3,
            f"over {epochs} epochs every index of chunk 0 starts its run at least 15 times": min(first_in_chunk) >= 15}


# ---- LazyH5 ------------------------------------------------------------------------------------

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
        loader = DataLoader(ds, batch_size=16, sampler=list(indices), num_workers=2, multiprocessing_context="fork",
                            timeout=60)
        images, labels = map(torch.cat, zip(*loader))
    pids = [int(p) for p in Path(log).read_text().split()]
    return {"images": images, "labels": labels, "opens per process": sorted(collections.Counter(pids).values()),
            "the parent opened it again": os.getpid() in pids}
