"""HDF5's chunk preemption policy, ``rdcc_w0``: a read order where it matters, and what it costs.

When the chunk cache is full, HDF5 must evict a chunk to make room. ``rdcc_w0`` (0 to 1, default
0.75; ``h5py.File(path, rdcc_w0=...)``) says how strongly chunks that were *fully read* go first:
0 is least-recently-used order, 1 evicts fully read chunks before any other (HDF5 reference
manual, ``H5Pset_chunk_cache``). The HDF5 User's Guide ("Data Caching") advises a large w0 when
reads do not overlap (each chunk read once, in pieces), a small one when they do.

Two details of the implementation (``H5D__chunk_cache_prune`` in HDF5's ``H5Dchunk.c``, which
:func:`gpulab.data.chunk_cache.simulate_chunk_cache` reproduces count for count) decide what
you will measure:

* "fully read" counts **bytes**: a cached chunk is fully read once as many bytes as it holds have
  been read from it, even if some samples were read twice;
* two pointers walk the cache from its oldest end: one evicts only fully read (or untouched)
  chunks, the other anything, and the second starts ``w0 x (chunks cached)`` places late. With
  ``w0 = 1`` it never starts: if no cached chunk is fully read, nothing is evicted, and the cache
  grows past ``rdcc_nbytes``.

:func:`hot_and_stream_order` is a read order where w0 matters: most chunks are streamed through
once, each read completely, while a few "hot" chunks are revisited, a sample at a time. With LRU
(w0 = 0) the stream pushes the hot chunks out; with w0 = 1 the fully read stream chunks go first.
:func:`heap_in_use` measures the other side: how much memory the cache really holds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import random

__all__ = ["hot_and_stream_order", "heap_in_use"]


def hot_and_stream_order(num_samples: int, chunk_rows: int, hot_chunks: int = 4, hot_every: int = 2,
                         seed: int = 0) -> list[int]:
    """Stream the dataset chunk by chunk, with a random "hot" sample after every ``hot_every``.

    The story: a file sorted by class whose first ``hot_chunks`` chunks hold a rare class that is
    oversampled (class-balanced sampling), while the common classes are streamed in order.

    Args:
        num_samples: samples in the dataset, chunked ``chunk_rows`` along axis 0.
        chunk_rows: samples per chunk.
        hot_chunks: the first chunks, whose samples are drawn again and again.
        hot_every: one hot sample after every ``hot_every`` streamed samples.
        seed: for the hot draws.

    Returns:
        The indices, in reading order: every streamed sample once, plus the hot draws.

    Raises:
        ValueError: sizes below 1, or hot chunks that leave nothing to stream.
    """
    for name, value in (("num_samples", num_samples), ("chunk_rows", chunk_rows), ("hot_chunks", hot_chunks),
                        ("hot_every", hot_every)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    hot_end = hot_chunks * chunk_rows
    if hot_end >= num_samples:
        raise ValueError(f"{hot_chunks} hot chunks of {chunk_rows} rows cover all {num_samples} samples; "
                         "leave some chunks to stream")
    rng = random.Random(seed)
    order = []
    for k, i in enumerate(range(hot_end, num_samples)):
        if k % hot_every == 0:
            order.append(rng.randrange(hot_end))  # a rare-class sample, partly reading its chunk again
        order.append(i)  # the stream: each chunk read completely, once
    return order


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def heap_in_use() -> int | None:
    """Bytes this process holds through C's ``malloc`` now, or None where that cannot be read.

    HDF5 allocates its chunk cache with ``malloc``, outside Python's and torch's accounting; glibc's
    ``mallinfo2()`` (glibc 2.33 and later: Linux) reports the bytes in use, including large blocks
    served by ``mmap``. The difference before and after a read loop is what the loop left allocated,
    e.g. the chunks an open dataset keeps cached. None on macOS, Windows, musl or older glibc.
    """
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        libc = ctypes.CDLL(path)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)
