"""HDF5 image storage for lab 03: synthetic images, chunk shapes, atomic writes (and re-exports).

A read of one sample from a chunked dataset loads every chunk that sample overlaps, so the chunk
shape, the chunk cache and the order in which a training loop asks for samples decide the read
speed together. Lab 03 measures this (details and sources: the comment below the imports).

    from gpulab.data.hdf5 import make_images, suggest_chunks, write_h5, H5Dataset, ChunkShuffleSampler
    images, labels = make_images(2048)
    chunks = suggest_chunks(images.shape, images.dtype, access="chunk")
    write_h5("train.h5", images, labels, layout="chunked", chunks=chunks, compression="gzip")
    ds = H5Dataset("train.h5", rdcc_nbytes=1 << 20)
    loader = DataLoader(ds, batch_size=64, sampler=ChunkShuffleSampler(ds), num_workers=2)

    .venv/bin/python -m pytest tests/data/test_hdf5.py
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from tqdm.auto import tqdm

from gpulab.data.chunk_cache import (
    CacheConfig,
    ChunkCacheStats,
    measure_chunk_cache,
    simulate_chunk_cache,
    suggest_cache,
)
from gpulab.data.chunk_sampler import ChunkShuffleSampler
from gpulab.data.h5dataset import (
    EagerH5Dataset,
    H5Dataset,
    H5FileError,
    H5Info,
    inspect_h5,
)

# How HDF5 stores a dataset, and what decides the read speed.
# An HDF5 dataset is stored either *contiguous* (one flat run of bytes, like a C array) or
# *chunked* (cut into equal blocks that are stored, compressed and cached independently). A read
# of one sample from a chunked dataset loads every chunk that sample overlaps, so the chunk shape,
# the chunk cache (``rdcc_nbytes``, ``rdcc_nslots``, ``rdcc_w0``) and the order in which a
# training loop asks for samples decide the read speed together.
#
# This module also re-exports the rest of lab 03's API: ``H5Dataset`` and ``inspect_h5``
# (``h5dataset.py``), ``ChunkShuffleSampler`` (``chunk_sampler.py``) and the chunk-cache tools
# (``chunk_cache.py``).
#
# Sources: HDF5's chunking guidance (10 KiB to 1 MiB per chunk), h5py's ``guess_chunk`` (what
# ``chunks=True`` does) and its ``File(rdcc_*)`` documentation.

__all__ = [
    "make_images", "suggest_chunks", "rows_for_random_reads", "write_h5", "inspect_h5", "H5Info", "H5FileError",
    "H5Dataset", "EagerH5Dataset", "ChunkShuffleSampler", "CacheConfig", "suggest_cache",
    "ChunkCacheStats", "measure_chunk_cache", "simulate_chunk_cache",
]

KiB, MiB = 1024, 1024 * 1024
CHUNK_MIN_BYTES = 10 * KiB  # below this, per-chunk overhead (index lookup, filter call) dominates
CHUNK_MAX_BYTES = 1 * MiB   # above this, one sample read drags in (and decompresses) too much


def make_images(n: int, shape: tuple[int, int, int] = (3, 64, 64), seed: int = 0,
                num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic photo-like uint8 images: smooth colour fields plus sensor noise.

    Smooth content makes gzip behave as on real photos (it shrinks them a little, not 100x,
    as it would all-zero arrays), so decompression costs what it costs on real data.

    Returns:
        ``(images, labels)``: ``(n, C, H, W)`` uint8 and ``(n,)`` int64; the class sets the tint.
    """
    if n < 1 or len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"make_images needs n >= 1 and shape=(C, H, W), got n={n}, shape={shape}")
    g = torch.Generator().manual_seed(seed)
    c, h, w = shape
    labels = torch.randint(0, num_classes, (n,), generator=g)
    coarse = torch.rand(n, c, 8, 8, generator=g) * 160 + 40
    tint = torch.linspace(-30, 30, num_classes)[labels].view(n, 1, 1, 1)
    img = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False)
    img = img + tint + torch.randn(n, c, h, w, generator=g) * 3.0
    return img.clamp_(0, 255).to(torch.uint8).numpy(), labels.numpy()


def rows_for_random_reads(sample_nbytes: int) -> int:
    """Samples per chunk for reads of one sample at a time in random order (``suggest_chunks``'s
    ``access="sample"``): the fewest whole samples that reach the 10 KiB floor, so that a random
    read decompresses little it does not need.

    It is a function of its own so that lab 03's grader can mask this rule (the answer to its
    ``choose_storage`` exercise) while ``suggest_chunks(access="chunk")`` keeps working.
    """
    return max(1, math.ceil(CHUNK_MIN_BYTES / max(1, int(sample_nbytes))))


def suggest_chunks(shape: tuple[int, ...], dtype: Any, access: str = "sample") -> tuple[int, ...]:
    """A chunk shape for a ``(num_samples, *sample_shape)`` dataset, by how it will be read.

    Chunks hold whole samples (split along axis 0 only), so one sample is in exactly one chunk.
    Access patterns:

    * ``"sample"``: one sample at a time in random order (a plain shuffled DataLoader). The
      fewest whole samples that reach the 10 KiB floor: a random read decompresses little it
      does not need.
    * ``"chunk"``: whole chunks at a time (sequential scans, :class:`ChunkShuffleSampler`). The
      largest power-of-two number of samples within the 1 MiB ceiling: fewer, bigger chunks.

    A sample bigger than 1 MiB is split along its own leading axes until a chunk fits.

    Raises:
        ValueError: an unknown ``access`` or an empty ``shape``.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 1 or min(shape) < 1:
        raise ValueError(f"shape must be (num_samples, *sample_shape) with positive sizes, got {shape}")
    sample_bytes = math.prod(shape[1:]) * np.dtype(dtype).itemsize
    if access == "sample":
        rows = rows_for_random_reads(sample_bytes)
    elif access == "chunk":
        rows = 2 ** max(0, int(math.floor(math.log2(max(1, CHUNK_MAX_BYTES // sample_bytes)))))
    else:
        raise ValueError(f"access must be 'sample' (random single samples) or 'chunk' (whole chunks), got {access!r}")
    chunks = [min(rows, shape[0]), *shape[1:]]
    axis = 1  # a sample larger than the ceiling: halve its leading axes in turn
    while math.prod(chunks) * np.dtype(dtype).itemsize > CHUNK_MAX_BYTES and axis < len(chunks):
        chunks[axis] = math.ceil(chunks[axis] / 2)
        if chunks[axis] == 1:
            axis += 1
    return tuple(chunks)


def _check_write_args(images: Any, labels: Any, layout: str, chunks: Any, compression: Any) -> None:
    if layout not in ("contiguous", "chunked"):
        raise ValueError(f"layout must be 'contiguous' or 'chunked', got {layout!r}")
    if compression not in (None, "gzip", "lzf"):
        raise ValueError(f"compression must be None, 'gzip' or 'lzf', got {compression!r}")
    if layout == "contiguous" and (chunks is not None or compression is not None):
        raise ValueError("chunks= and compression= need layout='chunked' (a contiguous dataset is one "
                         "uncompressed block)")
    if len(images.shape) < 2 or images.shape[0] < 1:
        raise ValueError(f"images must be (num_samples, *sample_shape), got shape {tuple(images.shape)}")
    if tuple(labels.shape) != (images.shape[0],):
        raise ValueError(f"labels must have shape ({images.shape[0]},) to match images, got {tuple(labels.shape)}")
    if isinstance(chunks, tuple) and (len(chunks) != len(images.shape)
                                      or any(not 1 <= c <= s for c, s in zip(chunks, images.shape))):
        raise ValueError(f"chunks={chunks} must have one size per axis of images {tuple(images.shape)}, "
                         "each between 1 and that axis' length (see suggest_chunks)")


def write_h5(path: str | os.PathLike, images: Any, labels: Any, layout: str = "contiguous",
             chunks: tuple[int, ...] | bool | None = None, compression: str | None = None, *,
             fletcher32: bool = False, disable: bool = False) -> Path:
    """Write ``images`` and ``labels`` to an HDF5 file, atomically, with a progress bar.

    The data goes to a temporary file in the same folder, which is renamed over ``path`` only
    once it is complete and flushed (``os.replace`` is atomic on one file system). An interrupted
    write (an exception, Ctrl-C) removes the temporary file and leaves any old ``path`` as it was.

    Args:
        path: the ``.h5`` file to create or replace.
        images: ``(N, *sample_shape)`` numpy array or tensor (or any sliceable array-like).
        labels: ``(N,)`` integer labels.
        layout: ``"contiguous"`` or ``"chunked"``.
        chunks: for ``"chunked"``: a chunk shape, ``True`` for h5py's auto-chunking, or ``None``
            for :func:`suggest_chunks` ``(access="sample")``.
        compression: ``None``, ``"gzip"`` or ``"lzf"`` (chunked only).
        fletcher32: store a checksum per chunk, so corrupt chunks raise on read (chunked only).
        disable: hide the progress bar.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Warning:
        ``chunks=True`` lets h5py guess a shape from the whole array. For images it cuts every
        sample across several chunks that each span hundreds of samples, so a per-sample read
        touches many chunks: a trap for random access (lab 03 measures it).
    """
    if isinstance(images, torch.Tensor):
        images = images.detach().cpu().numpy()
    labels = np.asarray(labels.cpu() if isinstance(labels, torch.Tensor) else labels)
    _check_write_args(images, labels, layout, chunks, compression)
    if layout == "chunked" and chunks is None:
        chunks = suggest_chunks(images.shape, images.dtype, "sample")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".tmp-", dir=path.parent)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            dset = f.create_dataset("images", shape=images.shape, dtype=images.dtype,
                                    chunks=chunks if layout == "chunked" else None, compression=compression,
                                    fletcher32=fletcher32 if layout == "chunked" else False)
            f.create_dataset("labels", data=labels.astype(np.int64))
            f.attrs.update(layout=layout, compression=compression or "none", writer="gpulab.data.hdf5.write_h5")
            step = dset.chunks[0] * max(1, 256 // dset.chunks[0]) if dset.chunks else 256  # chunk-aligned
            with tqdm(total=images.shape[0], unit="img", desc=f"write {path.name}", disable=disable) as bar:
                for start in range(0, images.shape[0], step):
                    block = np.asarray(images[start:start + step])
                    dset[start:start + len(block)] = block
                    bar.update(len(block))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
