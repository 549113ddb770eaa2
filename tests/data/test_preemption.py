"""gpulab.data.preemption: the hot-and-stream order, where rdcc_w0 changes HDF5's real miss count as
the model predicts; w0=1 evicting nothing when no chunk is fully read; the C heap meter."""

from __future__ import annotations

import pytest
import torch
from h5_fixtures import N, data, gzip_file  # noqa: F401 - pytest fixtures

from gpulab.data.chunk_cache import measure_chunk_cache, simulate_chunk_cache
from gpulab.data.h5dataset import H5Dataset
from gpulab.data.preemption import heap_in_use, hot_and_stream_order

ROWS, CHUNK = 8, 8 * 3 * 16 * 16  # the fixture's chunks: 8 images of 3x16x16 uint8


def test_the_order_streams_every_cold_sample_once_between_hot_draws() -> None:
    order = hot_and_stream_order(96, 8, hot_chunks=2, hot_every=3, seed=1)
    hot = [i for i in order if i < 16]
    assert [i for i in order if i >= 16] == list(range(16, 96))  # the stream, in order, once
    assert len(hot) == 80 // 3 + 1 and order[0] < 16  # one hot draw before every third streamed sample
    assert hot_and_stream_order(96, 8, hot_chunks=2, hot_every=3, seed=1) == order
    for bad in (dict(hot_chunks=12), dict(hot_every=0), dict(chunk_rows=0)):
        with pytest.raises(ValueError):
            hot_and_stream_order(96, **{"chunk_rows": 8, **bad})


def test_w0_changes_hdf5s_misses_as_the_model_says(gzip_file) -> None:  # a fixture
    order = hot_and_stream_order(N, ROWS, hot_chunks=2, hot_every=2, seed=0)
    cache = 3 * CHUNK  # the 2 hot chunks and the one being streamed
    misses = {}
    for w0 in (0.0, 1.0):
        real = measure_chunk_cache(gzip_file, order, rdcc_nbytes=cache, rdcc_nslots=101, rdcc_w0=w0).misses
        assert real == simulate_chunk_cache(order, ROWS, CHUNK, cache, rdcc_nslots=101, rdcc_w0=w0).misses
        misses[w0] = real
    assert misses[1.0] < misses[0.0]  # LRU lets the stream push the hot chunks out; w0=1 evicts the stream first
    assert misses[1.0] >= N // ROWS  # never fewer than one decompression per chunk


def test_w0_one_keeps_partly_read_chunks_past_the_cache_limit(gzip_file) -> None:  # a fixture
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0)).tolist()  # every chunk only partly read
    one_chunk = CHUNK
    for w0, expected in ((0.75, None), (1.0, N // ROWS)):
        real = measure_chunk_cache(gzip_file, order, rdcc_nbytes=one_chunk, rdcc_nslots=101, rdcc_w0=w0).misses
        if expected is None:
            assert real > 2 * (N // ROWS)  # a one-chunk cache: shuffled reads miss most of the time
        else:
            assert real == expected  # each chunk decompressed once: all 12 stayed in a "one-chunk" cache


def test_heap_in_use_sees_a_cache_that_outgrows_its_limit(gzip_file) -> None:  # a fixture
    if heap_in_use() is None:
        pytest.skip("mallinfo2 needs glibc 2.33+")
    order = torch.randperm(N, generator=torch.Generator().manual_seed(0)).tolist()
    grown = {}
    for w0 in (0.75, 1.0):
        ds = H5Dataset(gzip_file, rdcc_nbytes=CHUNK, rdcc_nslots=101, rdcc_w0=w0)
        ds[0]
        before = heap_in_use()
        for i in order:
            ds[i]
        grown[w0] = heap_in_use() - before
        ds.close()
    assert grown[1.0] - grown[0.75] >= 8 * CHUNK  # at least 8 more of the 12 chunks held with w0=1
