"""gpulab.data.chunk_cache: the cache model reproduces HDF5's own miss counts, read for read."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from gpulab.data.chunk_cache import (
    CacheConfig,
    compare_reads,
    measure_chunk_cache,
    next_prime,
    simulate_chunk_cache,
    suggest_cache,
    time_reads,
)
from gpulab.data.chunk_sampler import ChunkShuffleSampler
from gpulab.data.hdf5 import make_images, write_h5

N, ROWS = 512, 8
SAMPLE = 3 * 16 * 16
CHUNK = ROWS * SAMPLE


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cache")
    images, labels = make_images(N, (3, 16, 16), seed=0)
    return {
        "contiguous": write_h5(folder / "c.h5", images, labels, disable=True),
        "gzip": write_h5(folder / "g.h5", images, labels, layout="chunked", chunks=(ROWS, 3, 16, 16),
                         compression="gzip", disable=True),
        "raw": write_h5(folder / "r.h5", images, labels, layout="chunked", chunks=(ROWS, 3, 16, 16), disable=True),
        "split": write_h5(folder / "s.h5", images, labels, layout="chunked", chunks=(ROWS, 1, 8, 16),
                          compression="gzip", disable=True),
    }


def _patterns():
    rng = np.random.default_rng(0)
    return {
        "random": rng.integers(0, N, 700),
        "skewed": (rng.zipf(1.4, 700) * 5) % N,  # hot chunks: hits move entries, w0 matters
        "sequential": np.arange(N),
    }


@pytest.mark.parametrize("pattern", ["random", "skewed", "sequential"])
@pytest.mark.parametrize("chunks_in_cache, nslots", [(3, 10007), (12, 10007), (12, 5), (40, 1), (0.5, 521)])
@pytest.mark.parametrize("w0", [0.0, 0.75, 1.0])
def test_model_matches_hdf5_exactly(files, pattern, chunks_in_cache, nslots, w0) -> None:
    indices = _patterns()[pattern]
    nbytes = int(chunks_in_cache * CHUNK)
    measured = measure_chunk_cache(files["gzip"], indices, rdcc_nbytes=nbytes, rdcc_nslots=nslots, rdcc_w0=w0)
    model = simulate_chunk_cache(indices, ROWS, CHUNK, nbytes, nslots, w0)
    assert measured.accesses == model.accesses == len(indices)
    assert measured.misses == model.misses


def test_chunk_larger_than_the_cache_is_never_kept(files) -> None:
    same_chunk = [0, 1, 2, 3] * 10
    stats = measure_chunk_cache(files["gzip"], same_chunk, rdcc_nbytes=CHUNK - 1)
    assert stats.misses == stats.accesses == 40 and stats.hit_rate == 0.0
    assert simulate_chunk_cache(same_chunk, ROWS, CHUNK, CHUNK - 1).misses == 40
    assert measure_chunk_cache(files["gzip"], same_chunk, rdcc_nbytes=CHUNK).misses == 1


def test_chunk_aware_order_reads_each_chunk_once(files) -> None:
    order = list(ChunkShuffleSampler(range(N), ROWS, seed=0))
    stats = measure_chunk_cache(files["gzip"], order, rdcc_nbytes=CHUNK, rdcc_nslots=101)
    assert stats.misses == N // ROWS and stats.hit_rate == pytest.approx(1 - 1 / ROWS)


def test_contiguous_reads_exactly_one_sample_of_bytes(files) -> None:
    stats = measure_chunk_cache(files["contiguous"], _patterns()["random"][:50])
    assert stats.accesses == 0 and math.isnan(stats.hit_rate)
    assert stats.bytes_per_sample == SAMPLE  # an analytic byte count: no amplification


def test_uncompressed_chunks_bypass_a_too_small_cache(files) -> None:
    stats = measure_chunk_cache(files["raw"], [0, 9, 17, 33], rdcc_nbytes=0)
    assert stats.misses == 4 and stats.bytes_per_sample == SAMPLE  # read in place, one sample each
    stats = measure_chunk_cache(files["raw"], [0, 9, 17, 33], rdcc_nbytes=1 << 20)
    assert stats.bytes_per_sample == CHUNK  # through the cache: whole chunks


def test_a_sample_split_across_chunks_touches_each_of_them(files) -> None:
    stats = measure_chunk_cache(files["split"], [0, 100, 200], rdcc_nbytes=0)
    assert stats.accesses == 3 * 3 * 2 and stats.misses == 18  # 3 channels x 2 row blocks per sample


def test_cache_settings_and_primes() -> None:
    primes = [p for p in range(2, 200) if all(p % d for d in range(2, p))]
    assert [next_prime(n) for n in range(190)] == [min(p for p in primes if p >= max(2, n)) for n in range(190)]
    cfg = suggest_cache(768 * 1024, chunks_to_hold=4)
    assert cfg.rdcc_nbytes == 4 * 768 * 1024 and cfg.rdcc_nslots == 401 and cfg.kwargs() == {
        "rdcc_nbytes": 4 * 768 * 1024, "rdcc_nslots": 401}
    for bad, match in [(dict(rdcc_nbytes=-1), "rdcc_nbytes"), (dict(rdcc_nslots=0), "next_prime"),
                       (dict(rdcc_w0=1.5), "between 0 and 1")]:
        with pytest.raises(ValueError, match=match):
            CacheConfig(**bad)


def test_time_reads_stops_after_the_budget_but_not_before_min_samples() -> None:
    calls = []
    us = time_reads(calls.append, list(range(100)), max_seconds=0.0, min_samples=3)
    assert calls == [0, 1, 2] and us >= 0
    calls.clear()
    time_reads(calls.append, list(range(20)), max_seconds=60.0)
    assert calls == list(range(20))
    with pytest.raises(ValueError):
        time_reads(calls.append, [])


def test_compare_reads_takes_turns_and_reports_per_sample_medians() -> None:
    log: list[str] = []
    result = compare_reads(lambda i: log.append("a"), range(100), lambda i: (log.append("b"), time.sleep(0.002)),
                           range(100), repeats=3, max_seconds=0.0)
    a, b = ["a"] * 8, ["b"] * 8  # min_samples each: a first pass each, then turns, rotating who starts
    assert log == a + b + (a + b) + (b + a) + (a + b)
    assert result.candidate_s >= 0.002 > result.baseline_s and result.speedup < 1
