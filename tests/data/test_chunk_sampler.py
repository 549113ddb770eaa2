"""ChunkShuffleSampler: a permutation per epoch, chunk-local, reproducible, and rank-aware."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpulab.data.chunk_sampler import ChunkShuffleSampler


class _Chunked:
    def __init__(self, n: int, chunk_rows: int | None) -> None:
        self.n, self.chunk_rows = n, chunk_rows

    def __len__(self) -> int:
        return self.n


def _runs(order: list[int], chunk_size: int) -> list[int]:
    """The chunk of each maximal run of consecutive indices from the same chunk."""
    chunks = [i // chunk_size for i in order]
    return [c for k, c in enumerate(chunks) if k == 0 or c != chunks[k - 1]]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), chunk_size=st.integers(1, 40), seed=st.integers(0, 10), epoch=st.integers(0, 5))
def test_every_index_once_and_each_chunk_read_in_one_run(n, chunk_size, seed, epoch) -> None:
    sampler = ChunkShuffleSampler(range(n), chunk_size, seed=seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    assert sorted(order) == list(range(n)) and len(sampler) == n
    runs = _runs(order, chunk_size)
    assert len(runs) == len(set(runs)) == -(-n // chunk_size)  # each chunk visited exactly once


def test_matches_the_documented_recipe() -> None:
    n, k, seed, epoch = 103, 10, 7, 3
    sampler = ChunkShuffleSampler(range(n), k, seed=seed)
    sampler.set_epoch(epoch)
    g = torch.Generator().manual_seed(seed + epoch)
    expected = []
    for c in torch.randperm(11, generator=g).tolist():
        size = min(k, n - c * k)
        expected += (c * k + torch.randperm(size, generator=g)).tolist()
    assert list(sampler) == expected


def test_differs_per_epoch_and_repeats_per_seed() -> None:
    a = ChunkShuffleSampler(range(256), 16, seed=1)
    e0 = list(a)
    a.set_epoch(1)
    e1 = list(a)
    assert e0 != e1 and _runs(e0, 16) != _runs(e1, 16)
    b = ChunkShuffleSampler(range(256), 16, seed=1)
    assert list(b) == e0
    assert list(ChunkShuffleSampler(range(256), 16, seed=2)) != e0
    within = [sorted(e0[j:j + 16]) == list(range(e0[j] // 16 * 16, e0[j] // 16 * 16 + 16)) for j in range(0, 256, 16)]
    assert all(within) and e0[:16] != sorted(e0[:16])  # shuffled inside the chunk too


def test_groups_mix_several_chunks() -> None:
    order = list(ChunkShuffleSampler(range(400), 10, seed=0, chunks_per_group=4))
    assert sorted(order) == list(range(400))
    for start in range(0, 400, 40):
        assert len({i // 10 for i in order[start:start + 40]}) == 4  # a group = 4 whole chunks
    assert len(_runs(order, 10)) > 40  # the chunks of a group are interleaved


def test_defaults_to_the_dataset_chunk_rows_and_refuses_contiguous() -> None:
    assert ChunkShuffleSampler(_Chunked(100, 25)).chunk_size == 25
    with pytest.raises(ValueError, match="pass chunk_size="):
        ChunkShuffleSampler(_Chunked(100, None))


@pytest.mark.parametrize("kw, match", [
    (dict(chunk_size=0), "chunk_size must be"), (dict(chunk_size=4, num_replicas=0), "num_replicas must be"),
    (dict(chunk_size=4, num_replicas=2, rank=2), "rank must be"), (dict(chunk_size=4, chunks_per_group=0), "chunks_per_group"),
])
def test_bad_arguments(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        ChunkShuffleSampler(range(10), **kw)


@pytest.mark.parametrize("n, replicas", [(100, 4), (103, 4), (10, 3), (7, 8)])
def test_ranks_split_one_epoch_order_into_contiguous_slices(n, replicas) -> None:
    samplers = [ChunkShuffleSampler(range(n), 8, seed=5, num_replicas=replicas, rank=r) for r in range(replicas)]
    for s in samplers:
        s.set_epoch(2)
    parts = [list(s) for s in samplers]
    per_rank = -(-n // replicas)
    assert all(len(p) == len(s) == per_rank for p, s in zip(parts, samplers))
    full = samplers[0].epoch_order().tolist()
    padded = (full * (1 + per_rank * replicas // n))[: per_rank * replicas]
    assert sum(parts, []) == padded  # contiguous slices of the same order, padded from its start
    assert set(sum(parts, [])) == set(range(n))
    dropped = [list(ChunkShuffleSampler(range(n), 8, seed=5, num_replicas=replicas, rank=r, drop_last=True))
               for r in range(replicas)]
    flat = sum(dropped, [])
    assert len(flat) == len(set(flat)) == n // replicas * replicas
