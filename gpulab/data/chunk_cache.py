"""HDF5's chunk cache: settings, a model of it, and chunk hits counted from real reads.

Every open chunked dataset has a *raw data chunk cache* of decompressed chunks, set per file
with ``h5py.File(path, rdcc_nbytes=, rdcc_nslots=, rdcc_w0=)`` (the comment below the imports
says what each setting does). h5py does not expose HDF5's hit counters (they exist only in debug
builds of the library), so :func:`measure_chunk_cache` counts misses where they happen: it opens
the file through a Python file object and maps every read HDF5 issues to the chunk whose bytes it
touches. A chunk access that causes no read was a hit. :func:`simulate_chunk_cache` is the model
(LRU by bytes plus slot collisions, as in HDF5's source) that predicts the same counts without
touching a file.

    .venv/bin/python -m pytest tests/data/test_chunk_cache.py
"""

from __future__ import annotations

import bisect
import io
import itertools
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import h5py

from gpulab.profiling.interleave import SpeedComparison, time_interleaved

# The chunk cache's three settings (h5py.File(path, rdcc_nbytes=, rdcc_nslots=, rdcc_w0=)):
# - ``rdcc_nbytes``: its size in bytes. Default 1 MiB before HDF5 2.0, 8 MiB from HDF5 2.0. A
#   chunk larger than this is never kept: every access re-reads (and re-decompresses) it.
# - ``rdcc_nslots``: slots of its hash table. A chunk goes to slot ``index % nslots`` and evicts
#   whatever is there, so too few slots evict chunks long before the bytes run out. h5py's advice:
#   a prime, about 100x the number of chunks that fit in ``rdcc_nbytes``.
# - ``rdcc_w0``: 0..1, how strongly chunks whose bytes were all read are evicted before others
#   (0: plain LRU order; 1: always first). Default 0.75.

__all__ = ["CacheConfig", "suggest_cache", "next_prime", "ChunkCacheStats", "measure_chunk_cache",
           "simulate_chunk_cache", "time_reads", "compare_reads"]


@dataclass(frozen=True)
class CacheConfig:
    """Chunk-cache settings for ``h5py.File``; ``None`` keeps the library default."""

    rdcc_nbytes: int | None = None
    rdcc_nslots: int | None = None
    rdcc_w0: float | None = None

    def __post_init__(self) -> None:
        if self.rdcc_nbytes is not None and (not isinstance(self.rdcc_nbytes, int) or self.rdcc_nbytes < 0):
            raise ValueError(f"rdcc_nbytes must be an int >= 0 (bytes), got {self.rdcc_nbytes!r}")
        if self.rdcc_nslots is not None and (not isinstance(self.rdcc_nslots, int) or self.rdcc_nslots < 1):
            raise ValueError(f"rdcc_nslots must be an int >= 1, got {self.rdcc_nslots!r}; try next_prime(100 * chunks_in_cache)")
        if self.rdcc_w0 is not None and not 0.0 <= self.rdcc_w0 <= 1.0:
            raise ValueError(f"rdcc_w0 must be between 0 and 1, got {self.rdcc_w0!r}")

    def kwargs(self) -> dict[str, Any]:
        """The settings that are set, as ``h5py.File`` keyword arguments."""
        return {k: v for k, v in vars(self).items() if v is not None}


def next_prime(n: int) -> int:
    """The smallest prime >= ``n`` (hash-table sizes: a prime spreads chunk indices evenly)."""
    n = max(2, int(n))
    while any(n % d == 0 for d in range(2, math.isqrt(n) + 1)):
        n += 1
    return n


def suggest_cache(chunk_nbytes: int, chunks_to_hold: int = 1) -> CacheConfig:
    """A cache that holds ``chunks_to_hold`` chunks, with h5py's slot rule (a prime ~100x that).

    Args:
        chunk_nbytes: bytes of one *uncompressed* chunk (the cache holds decompressed chunks).
        chunks_to_hold: how many chunks the access pattern revisits before it is done with them
            (1 for chunk-aware shuffling; the whole dataset for plain random sampling).

    ``rdcc_w0`` is left at the library default (0.75); see :func:`simulate_chunk_cache` for why
    ``w0=1`` is risky with partly read chunks.
    """
    if chunk_nbytes < 1 or chunks_to_hold < 1:
        raise ValueError(f"chunk_nbytes and chunks_to_hold must be >= 1, got {chunk_nbytes}, {chunks_to_hold}")
    return CacheConfig(int(chunk_nbytes * chunks_to_hold), next_prime(100 * chunks_to_hold))


@dataclass
class ChunkCacheStats:
    """Chunk accesses of a read sequence, split into hits (no file read) and misses."""

    samples: int
    accesses: int       # chunk touches: each sample touches every chunk it overlaps
    misses: int         # of those, the ones HDF5 had to read from the file
    bytes_read: int     # everything read from the file meanwhile (chunks and metadata)

    @property
    def hits(self) -> int:
        return self.accesses - self.misses

    @property
    def hit_rate(self) -> float:
        """Hits per chunk access (NaN for a contiguous dataset, which has no chunks)."""
        return self.hits / self.accesses if self.accesses else float("nan")

    @property
    def bytes_per_sample(self) -> float:
        """Bytes read from the file per sample: the read amplification, whatever the disk."""
        return self.bytes_read / max(1, self.samples)


class _CountingFile(io.FileIO):
    """A read-only file whose reads are logged as (offset, size) while ``log`` is a list."""

    log: list[tuple[int, int]] | None = None

    def readinto(self, buffer: Any) -> int:
        offset = self.tell()
        n = super().readinto(buffer)
        if self.log is not None:
            self.log.append((offset, n or 0))
        return n


def _chunks_per_sample(shape: Sequence[int], chunks: Sequence[int]) -> int:
    return math.prod(math.ceil(s / c) for s, c in zip(shape[1:], chunks[1:]))


def measure_chunk_cache(path: str | os.PathLike, indices: Iterable[int], rdcc_nbytes: int | None = None,
                        rdcc_nslots: int | None = None, rdcc_w0: float | None = None,
                        key: str = "images") -> ChunkCacheStats:
    """Read ``dataset[i]`` for each ``i`` in order and count chunk hits and misses from real reads.

    A miss is a chunk from which HDF5 read bytes while serving that sample (found by mapping
    each read's file offset onto the chunks' stored extents). The file is opened through a
    Python file object, so this is for counting, not for timing.
    """
    raw = _CountingFile(os.fspath(path), "rb")
    cache = CacheConfig(rdcc_nbytes, rdcc_nslots, rdcc_w0).kwargs()
    with h5py.File(raw, "r", **cache) as f:
        dset = f[key]
        starts, ends = [], []
        if dset.chunks:
            extents = sorted((info.byte_offset, info.byte_offset + info.size)
                             for info in (dset.id.get_chunk_info(k) for k in range(dset.id.get_num_chunks())))
            starts, ends = [s for s, _ in extents], [e for _, e in extents]
        per_sample = _chunks_per_sample(dset.shape, dset.chunks) if dset.chunks else 0
        samples = accesses = misses = nbytes = 0
        raw.log = []
        for i in indices:
            del raw.log[:]
            dset[int(i)]
            touched = set()
            for offset, size in raw.log:
                k = bisect.bisect_right(starts, offset) - 1
                if k >= 0 and offset < ends[k]:
                    touched.add(k)
                nbytes += size
            samples, accesses, misses = samples + 1, accesses + per_sample, misses + len(touched)
        raw.log = None
    raw.close()
    return ChunkCacheStats(samples, accesses, misses, nbytes)


def simulate_chunk_cache(indices: Iterable[int], chunk_rows: int, chunk_nbytes: int, rdcc_nbytes: int,
                         rdcc_nslots: int = 521, rdcc_w0: float = 0.75) -> ChunkCacheStats:
    """Replay HDF5's chunk-cache policy for per-sample reads of a dataset chunked along axis 0.

    The policy (HDF5's ``H5Dchunk.c``, which this reproduces count for count in our tests):

    * sample ``i`` is in chunk ``c = i // chunk_rows``; a chunk larger than the cache is read,
      used and dropped (never kept);
    * a hit moves the chunk *one place* toward the newest end of the list (not to the end);
    * a miss first evicts the chunk sitting in slot ``c % rdcc_nslots`` (a collision), then
      prunes from the oldest end until the new chunk fits: one pointer evicts only chunks whose
      bytes were all read (counted in bytes accessed), and a second pointer, which starts
      ``w0 x (chunks cached)`` places later, evicts anything.

    Warning:
        With ``rdcc_w0=1`` and chunks that are only partly read (random single samples), the
        second pointer never starts, nothing is evicted, and the cache grows past
        ``rdcc_nbytes`` (measured with HDF5 2.0). Use ``w0=1`` only for chunks read completely.
    """
    if chunk_rows < 1 or chunk_nbytes < 1 or rdcc_nslots < 1:
        raise ValueError("chunk_rows, chunk_nbytes and rdcc_nslots must be >= 1")
    sample_nbytes = chunk_nbytes // chunk_rows
    order: list[int] = []        # cached chunk ids, oldest (evicted first) .. newest
    unread: dict[int, int] = {}  # chunk id -> bytes not read yet (HDF5's rd_count)
    slots: dict[int, int] = {}   # hash slot -> chunk id
    samples = misses = 0

    def evict(c: int) -> None:
        order.remove(c)
        del unread[c], slots[c % rdcc_nslots]

    def after(c: int | None) -> int | None:
        if c is None:
            return None
        j = order.index(c) + 1
        return order[j] if j < len(order) else None

    for i in indices:
        samples += 1
        c = int(i) // chunk_rows
        if c in unread:
            j = order.index(c)
            if j + 1 < len(order):
                order[j], order[j + 1] = order[j + 1], order[j]
            unread[c] -= min(unread[c], sample_nbytes)
            continue
        misses += 1
        if chunk_nbytes > rdcc_nbytes:
            continue
        if c % rdcc_nslots in slots:
            evict(slots[c % rdcc_nslots])
        head = order[0] if order else None
        pointers, wait = [head, None], int(len(order) * rdcc_w0)
        while (pointers[0] is not None or pointers[1] is not None) and (len(order) + 1) * chunk_nbytes > rdcc_nbytes:
            if wait == 0:
                pointers[1] = order[0] if order else None
            nexts = [after(p) for p in pointers]
            for k in (0, 1):
                if (len(order) + 1) * chunk_nbytes <= rdcc_nbytes:
                    break
                p = pointers[k]
                if p is None or (k == 0 and unread[p] not in (0, chunk_nbytes)):
                    continue
                successor = after(p)
                pointers = [None if q == p else q for q in pointers]
                nexts = [successor if q == p else q for q in nexts]
                evict(p)
            pointers, wait = nexts, wait - 1
        order.append(c)
        unread[c], slots[c % rdcc_nslots] = chunk_nbytes - sample_nbytes, c
    return ChunkCacheStats(samples, samples, misses, misses * chunk_nbytes)


def _timed_pass(read: Callable[[int], Any], indices: Sequence[int], max_seconds: float,
                min_samples: int) -> tuple[float, int]:
    """(seconds, reads) of one pass over ``indices`` in order, stopping after ``max_seconds`` once
    ``min_samples`` reads are done."""
    t0 = time.perf_counter()
    n = 0
    for i in indices:
        read(int(i))
        n += 1
        if n >= min_samples and time.perf_counter() - t0 > max_seconds:
            break
    return time.perf_counter() - t0, n


def time_reads(read: Callable[[int], Any], indices: Sequence[int], max_seconds: float = 0.5,
               min_samples: int = 8) -> float:
    """Microseconds per ``read(i)`` over ``indices`` in order, stopping early after ``max_seconds``.

    Slow configurations (a chunk decompressed per sample) then cost a bounded time, and fast
    ones are averaged over all of ``indices``. At least ``min_samples`` reads are always timed.
    """
    if not len(indices):
        raise ValueError("time_reads needs at least one index")
    seconds, n = _timed_pass(read, indices, max_seconds, min_samples)
    return seconds / n * 1e6


def _read_all(read: Callable[[int], Any], indices: list[int]) -> Callable[[], None]:
    def run() -> None:
        for i in indices:
            read(i)

    return run


def compare_reads(baseline: Callable[[int], Any], baseline_indices: Sequence[int],
                  candidate: Callable[[int], Any], candidate_indices: Sequence[int],
                  repeats: int = 3, max_seconds: float = 0.3, min_samples: int = 8) -> SpeedComparison:
    """Per-sample read time of two readers, timed in turns, medians of ``repeats`` turns each.

    A short first pass over each reader (a quarter of ``max_seconds``; it also opens the file and
    warms the cache) sets how many samples it reads per turn, so that a turn takes about
    ``max_seconds`` (at least ``min_samples``, at most all of its indices). The turns are then timed
    by :func:`gpulab.profiling.interleave.time_interleaved` (A B, B A, ...), so both readers see the
    same machine load and the ratio can be graded on any machine.

    Raises:
        ValueError: if either reader has no indices.
    """
    turns = {}
    for name, read, indices in (("baseline", baseline, baseline_indices), ("candidate", candidate, candidate_indices)):
        if not len(indices):
            raise ValueError(f"compare_reads needs at least one {name} index")
        seconds, n = _timed_pass(read, indices, max_seconds / 4, min_samples)
        per_read = max(seconds / n, 1e-9)
        count = min(len(indices), max(min_samples, int(max_seconds / per_read)))
        turns[name] = (read, [int(i) for i in itertools.islice(indices, count)])
    timings = time_interleaved({name: _read_all(read, chosen) for name, (read, chosen) in turns.items()},
                               repeats=repeats, warmup=0)
    return SpeedComparison(timings.median("baseline") / len(turns["baseline"][1]),
                           timings.median("candidate") / len(turns["candidate"][1]))
