"""Lab 03's graders: the random inputs the hidden tests draw from the grading run's seed, the facts
of an answer that every right design shares, and the reads whose cost the grader measures.

Everything here runs the student's code and returns plain values for ``grading.check_*`` to send;
nothing decides. The measured work (:func:`shuffled_reads`, :func:`chunk_reads`) returns a
checksum of every sample it read, ordered by index, so that the grader can compare it with the
reference run's for the same seed whatever the order of the reads: a read skipped or faked changes
it. What the grader judges of that work is a count the operating system keeps, the bytes HDF5
read from the file (``measure.count``, ``read_chars``): HDF5 decompresses every chunk it reads, so
the bytes read are the lesson's cost, and unlike a time they do not grow on a busy machine.
The facts of a ``ChunkShuffle`` are in :mod:`gpulab.grading.lab03_sampler`, the graders of ``LazyH5``
in :mod:`gpulab.grading.lab03_lazy`; both are re-exported here.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import torch

from gpulab.data.chunk_cache import next_prime, suggest_cache
from gpulab.data.chunk_sampler import ChunkShuffleSampler
from gpulab.data.hdf5 import H5Dataset, rows_for_random_reads, suggest_chunks, write_h5
from gpulab.grading.lab03_lazy import gpulab_bases, h5_opens, lazy_facts, open_h5_files, worker_reads
from gpulab.grading.lab03_sampler import reference_sampler, sampler_cases, sampler_facts, sampler_statistics

__all__ = [
    "REFERENCES",
    "MiB",
    "CACHE_BUDGET",
    "storage_cases",
    "reference_storage",
    "storage_facts",
    "storage_reader",
    "storage_readers",
    "shuffled_reads",
    "read_checksum",
    "chunk_reads",
    "sampler_cases",
    "sampler_facts",
    "sampler_statistics",
    "reference_sampler",
    "lazy_facts",
    "worker_reads",
    "h5_opens",
    "gpulab_bases",
    "open_h5_files",
]

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
    facts["10 KiB to 1 MiB per chunk"] = (
        whole and (chunk_nbytes >= 10 * 1024 or chunks[0] == shape[0]) and (chunk_nbytes <= MiB or chunks[0] == 1)
    )
    nbytes, nslots = choice["rdcc_nbytes"], choice["rdcc_nslots"]
    facts["rdcc_nbytes an int from one chunk to 4 MiB"] = (
        _is_int(nbytes) and nbytes <= CACHE_BUDGET and chunk_nbytes is not None and nbytes >= chunk_nbytes
    )
    held = int(nbytes) // chunk_nbytes if facts["rdcc_nbytes an int from one chunk to 4 MiB"] else 0
    facts["rdcc_nslots a prime, 100x to 200x the chunks the cache holds"] = (
        _is_int(nslots) and held >= 1 and 100 * held <= nslots <= 200 * held and _is_prime(int(nslots))
    )
    return facts


def storage_reader(
    choice: dict[str, Any], images: np.ndarray, labels: np.ndarray, folder: Path, name: str
) -> H5Dataset:
    """``images`` written gzip-compressed as ``choice`` (what ``choose_storage`` returned) says, and
    read with its cache; open (sample 0 read), so that the measured reads do not open the file."""
    chunks = tuple(int(c) for c in choice["chunks"])
    ds = H5Dataset(
        write_h5(Path(folder) / f"{name}-yours.h5", images, labels, "chunked", chunks, "gzip", disable=True),
        rdcc_nbytes=int(choice["rdcc_nbytes"]),
        rdcc_nslots=int(choice["rdcc_nslots"]),
    )
    ds[0]
    return ds


def storage_readers(
    choice: dict[str, Any], images: np.ndarray, labels: np.ndarray, folder: Path, name: str
) -> tuple[H5Dataset, H5Dataset]:
    """The lab's demonstration of ``choose_storage``: ``images`` written twice, gzip-compressed, the
    given way (whole images in chunks of up to 1 MiB, ``suggest_chunks(access="chunk")``, read with
    a 1 MiB cache) and as ``choice`` says (:func:`storage_reader`). Returns ``(baseline, yours)``,
    both open (sample 0 read)."""
    base_chunks = suggest_chunks(images.shape, images.dtype, access="chunk")
    base = H5Dataset(
        write_h5(Path(folder) / f"{name}-given.h5", images, labels, "chunked", base_chunks, "gzip", disable=True),
        rdcc_nbytes=1 * MiB,
        rdcc_nslots=10007,
    )
    base[0]
    return base, storage_reader(choice, images, labels, folder, name)


def read_checksum(read: Callable[[int], Any], indices: Iterable[int]) -> torch.Tensor:
    """Read ``read(i)`` for every ``i``, in that order; return one number per sample read (the sum of
    its pixels, and its label), ordered by index: the same for any order of the same reads."""
    sums: dict[int, int] = {}
    for i in indices:
        image, label = read(int(i))
        sums[int(i)] = int(torch.as_tensor(image).sum(dtype=torch.int64)) * 1000 + int(label)
    return torch.tensor([sums[i] for i in sorted(sums)] + [len(sums)], dtype=torch.int64)


def shuffled_reads(dataset: H5Dataset, count: int) -> Callable[[int], torch.Tensor]:
    """One unit of measured work: ``fn(seed)`` reads ``count`` samples of ``dataset`` in a random order
    drawn from ``seed`` (a shuffled DataLoader's reads), one at a time; returns their checksum."""
    n = len(dataset)

    def work(seed: int) -> torch.Tensor:
        return read_checksum(dataset.__getitem__, random.Random(seed).sample(range(n), min(count, n)))

    return work


# ---- ChunkShuffle ------------------------------------------------------------------------------


def chunk_reads(
    dataset: H5Dataset, num_chunks: int, order: Callable[[int, int, int], Iterable[int]]
) -> Callable[[int], torch.Tensor]:
    """One unit of measured work: ``fn(seed)`` reads every sample of ``num_chunks`` chunks of ``dataset``
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
