"""Chunk-aware shuffling: random chunk order, random order inside each chunk.

Plain shuffling (``RandomSampler``) asks for samples in an order that ignores storage. On a
compressed, chunked HDF5 file each request then lands in a different chunk, which is read and
decompressed whole to serve one sample, unless the chunk cache holds most of the dataset.
:class:`ChunkShuffleSampler` visits the chunks in a random order and shuffles the samples of
each chunk (or of a group of ``chunks_per_group`` chunks) among themselves, so every chunk is
decompressed once per epoch while a cache of one chunk (or one group) is enough. The price is
randomness (the comment below the imports).

    sampler = ChunkShuffleSampler(dataset, seed=0, num_replicas=world_size, rank=rank)
    sampler.set_epoch(epoch)  # every epoch, then: DataLoader(dataset, batch_size=64, sampler=sampler)

    .venv/bin/python -m pytest tests/data/test_chunk_sampler.py
"""

from __future__ import annotations

from typing import Iterator, Sized

import torch
from torch.utils.data import Sampler

# The price is randomness: a batch comes from one or two chunks instead of from the whole
# dataset. Shuffling groups of several chunks buys randomness back at the cost of a cache that
# holds the group. This is the same trade as the shuffle buffers of streaming loaders (e.g.
# WebDataset's shard shuffling).

__all__ = ["ChunkShuffleSampler"]


class ChunkShuffleSampler(Sampler[int]):
    """Shuffle chunk order, then the order inside each chunk; every index once per epoch.

    The order of an epoch is fixed by ``seed + epoch`` through one ``torch.Generator``: first
    ``torch.randperm(num_chunks)`` gives the chunk order; then, for each group of
    ``chunks_per_group`` chunks in that order, ``torch.randperm(group_size)`` shuffles the
    group's indices (chunk ``c`` holds indices ``c * chunk_size`` up to ``(c + 1) * chunk_size``,
    the last chunk may be shorter).

    With several ranks (distributed training), every rank builds the same epoch order and
    takes a *contiguous* slice of it, so ranks read disjoint runs of whole chunks (interleaving
    ``rank::num_replicas`` as ``DistributedSampler`` does would make every rank touch every
    chunk). Like ``DistributedSampler``, the order is padded by repeating its start so that all
    ranks get the same number of indices, or cut short with ``drop_last=True``.

    Args:
        dataset: a sized dataset; its ``chunk_rows`` (e.g. :class:`~gpulab.data.hdf5.H5Dataset`)
            is the default ``chunk_size``. Or the number of samples, an int (then ``chunk_size``
            is needed): ``ChunkShuffleSampler(2048, 64)``.
        chunk_size: samples per chunk along axis 0.
        seed: the base seed; the same on every rank.
        num_replicas, rank: the distributed world size and this rank (defaults: one process).
        drop_last: cut the order to a multiple of ``num_replicas`` instead of padding it.
        chunks_per_group: chunks whose indices are shuffled together (the cache must hold them).

    Raises:
        ValueError: a contiguous dataset without ``chunk_size``, or a bad argument.
    """

    def __init__(self, dataset: Sized | int, chunk_size: int | None = None, seed: int = 0, *,
                 num_replicas: int = 1, rank: int = 0, drop_last: bool = False,
                 chunks_per_group: int = 1) -> None:
        if chunk_size is None:
            chunk_size = getattr(dataset, "chunk_rows", None)
            if chunk_size is None:
                raise ValueError("this dataset has no chunks (contiguous layout, or no chunk_rows attribute); "
                                 "pass chunk_size= explicitly, or use torch's RandomSampler")
        for name, value, low in (("chunk_size", chunk_size, 1), ("num_replicas", num_replicas, 1),
                                 ("chunks_per_group", chunks_per_group, 1)):
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas - 1}] for num_replicas={num_replicas}, got {rank!r}")
        is_count = isinstance(dataset, int) and not isinstance(dataset, bool)
        self.num_samples_total = dataset if is_count else len(dataset)
        if self.num_samples_total < 1:
            raise ValueError("the dataset is empty")
        self.chunk_size, self.seed, self.epoch = chunk_size, int(seed), 0
        self.num_replicas, self.rank, self.drop_last = num_replicas, rank, drop_last
        self.chunks_per_group = chunks_per_group

    @property
    def num_chunks(self) -> int:
        return -(-self.num_samples_total // self.chunk_size)

    def set_epoch(self, epoch: int) -> None:
        """Use a new order for ``epoch`` (call before each epoch, as with ``DistributedSampler``)."""
        self.epoch = int(epoch)

    def epoch_order(self) -> torch.Tensor:
        """The whole epoch's order over all ranks (before padding and slicing), shape ``(N,)``."""
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.num_chunks, generator=g)
        n, k = self.num_samples_total, self.chunk_size
        pieces = []
        for start in range(0, self.num_chunks, self.chunks_per_group):
            group = torch.cat([torch.arange(c * k, min((c + 1) * k, n))
                               for c in order[start:start + self.chunks_per_group].tolist()])
            pieces.append(group[torch.randperm(len(group), generator=g)])
        return torch.cat(pieces)

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples_total // self.num_replicas
        return -(-self.num_samples_total // self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        order = self.epoch_order()
        per_rank = len(self)
        total = per_rank * self.num_replicas
        if total > len(order):  # pad by repeating the start (as DistributedSampler does)
            order = torch.cat([order, order[: total - len(order)]])
        return iter(order[self.rank * per_rank:(self.rank + 1) * per_rank].tolist())
