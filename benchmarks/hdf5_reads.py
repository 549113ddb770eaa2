"""Random-read speed of HDF5 layouts x chunk-cache sizes x samplers (lab 03); one JSON line.

    python benchmarks/hdf5_reads.py            # about 40 s on a 2-core laptop

Writes 2048 synthetic 3x64x64 uint8 images (24 MiB) in six layouts to a temporary folder, then
times ``H5Dataset[i]`` (microseconds per sample) over one epoch order of each sampler, with the
chunk cache at 1, 8 and 32 MiB. Each figure is the median of 3 passes, interleaved so every
configuration sees the same machine load.

Targets (ratios measured side by side in this run):
* ``chunk_aware_speedup`` >= 5: ChunkShuffleSampler vs plain random order, gzip chunks of 64
  images (768 KiB), 1 MiB cache;
* ``small_chunk_speedup``: plain random order on gzip, 1-image chunks vs 64-image chunks, 1 MiB
  cache (lab 03 grades the student's layout at a fraction of this);
* ``auto_chunk_slowdown``: ``chunks=True`` auto-chunking vs 1-image chunks, both gzip.
* ``w0``: the chunk preemption policy (lab 03). On ``hot_and_stream_order`` (4 hot chunks revisited
  a sample at a time, the rest streamed) with a 5-chunk cache: chunk decompressions counted from
  HDF5's reads and the µs per sample, w0 = 0 vs 1 (``w0_speedup``). On shuffled reads with a 4 MiB
  cache: the C heap held while the dataset is open (``heap_mib``), w0 = 0.75 vs 1, where w0 = 1
  evicts nothing (``heap_ratio_w0_1``; null where ``mallinfo2`` is missing).

The files are small and sit in the OS page cache, so no disk latency is measured: the figures
are HDF5's own costs (per-read overhead, chunk decompression, read amplification). Bytes read
per sample (``bytes_per_sample``) is the disk-independent measure of the amplification.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpulab.data.chunk_cache import time_reads
from gpulab.data.hdf5 import ChunkShuffleSampler, H5Dataset, make_images, measure_chunk_cache, suggest_chunks, write_h5
from gpulab.data.preemption import heap_in_use, hot_and_stream_order
from gpulab.profiling.interleave import time_interleaved

MiB = 1 << 20
N, SHAPE = 2048, (3, 64, 64)
CACHES = {"1MiB": MiB, "8MiB": 8 * MiB, "32MiB": 32 * MiB}


def layouts(images) -> dict[str, dict]:
    big = suggest_chunks(images.shape, images.dtype, "chunk")      # (64, 3, 64, 64): 768 KiB
    small = suggest_chunks(images.shape, images.dtype, "sample")   # (1, 3, 64, 64): 12 KiB
    return {
        "contiguous": dict(layout="contiguous"),
        "chunked": dict(layout="chunked", chunks=big),
        "gzip": dict(layout="chunked", chunks=big, compression="gzip"),
        "lzf": dict(layout="chunked", chunks=big, compression="lzf"),
        "gzip_1img": dict(layout="chunked", chunks=small, compression="gzip"),
        "gzip_auto": dict(layout="chunked", chunks=True, compression="gzip"),
    }


def w0_figures(path: Path, shuffled: list[int], repeats: int) -> dict:
    """Decompressions, µs/sample (w0 = 0, 0.75, 1) on the hot-and-stream order; heap held on shuffled reads."""
    rows, hot = 64, 4
    chunk_nbytes = rows * 3 * 64 * 64
    mixed = hot_and_stream_order(N, rows, hot_chunks=hot, hot_every=2, seed=0)
    cache = (hot + 1) * chunk_nbytes
    misses = {w0: measure_chunk_cache(path, mixed, rdcc_nbytes=cache, rdcc_nslots=10007, rdcc_w0=w0).misses
              for w0 in (0.0, 0.75, 1.0)}

    def reader(w0: float):
        def run() -> None:
            ds = H5Dataset(path, rdcc_nbytes=cache, rdcc_nslots=10007, rdcc_w0=w0)
            for i in mixed:
                ds[i]
            ds.close()
        return run

    timings = time_interleaved({w0: reader(w0) for w0 in (0.0, 0.75, 1.0)}, repeats=repeats, warmup=0)
    us = {w0: timings.median(w0) / len(mixed) * 1e6 for w0 in (0.0, 0.75, 1.0)}
    heap = {}
    for w0 in (0.75, 1.0):
        ds = H5Dataset(path, rdcc_nbytes=4 * MiB, rdcc_nslots=10007, rdcc_w0=w0)
        ds[0]
        before = heap_in_use()
        for i in shuffled[:400]:
            ds[i]
        after = heap_in_use()
        ds.close()
        heap[w0] = None if before is None else round((after - before) / MiB, 1)
    return {
        "order": f"hot_and_stream_order: {hot} hot chunks, a hot read after every 2 streamed, {len(mixed)} reads, "
                 f"cache {hot + 1} chunks",
        "decompressions": {str(k): v for k, v in misses.items()},
        "us_per_sample": {str(k): round(v, 1) for k, v in us.items()},
        "w0_speedup": round(us[0.0] / us[1.0], 2),
        "decompression_ratio_w0_1": round(misses[1.0] / misses[0.0], 2),
        "heap_mib_shuffled_4MiB_cache": {str(k): v for k, v in heap.items()},
        "heap_ratio_w0_1": None if heap[0.75] is None else round(heap[1.0] / max(heap[0.75], 0.1), 1),
    }


def main(repeats: int = 3, max_seconds: float = 0.3) -> dict:
    images, labels = make_images(N, SHAPE, seed=0)
    folder = Path(tempfile.mkdtemp(prefix="gpulab-hdf5-"))
    paths = {name: write_h5(folder / f"{name}.h5", images, labels, disable=True, **kw)
             for name, kw in layouts(images).items()}
    orders = {"random": torch.randperm(N, generator=torch.Generator().manual_seed(0)).tolist()}
    combos = []
    for name, path in paths.items():
        for cache_name, nbytes in CACHES.items():
            for sampler in ("random", "chunk"):
                combos.append((name, cache_name, sampler))
    times: dict[str, list[float]] = {"/".join(c): [] for c in combos}
    for _ in range(repeats):
        for name, cache_name, sampler in combos:
            ds = H5Dataset(paths[name], rdcc_nbytes=CACHES[cache_name], rdcc_nslots=10007)
            order = orders["random"] if sampler == "random" else \
                list(ChunkShuffleSampler(ds, chunk_size=ds.chunk_rows or 64, seed=0))
            ds[0]  # open the file outside the timed loop
            times[f"{name}/{cache_name}/{sampler}"].append(time_reads(ds.__getitem__, order, max_seconds))
            ds.close()
    us = {k: round(statistics.median(v), 1) for k, v in times.items()}
    gz = H5Dataset(paths["gzip"])
    chunk_order = list(ChunkShuffleSampler(gz, seed=0))
    stats = {f"{name}/{sampler}": measure_chunk_cache(paths[name], order[:512], rdcc_nbytes=MiB, rdcc_nslots=10007)
             for name in ("contiguous", "gzip", "gzip_1img", "gzip_auto")
             for sampler, order in (("random", orders["random"]), ("chunk", chunk_order))}
    return {
        "benchmark": "hdf5_reads",
        "device": f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
        "date": time.strftime("%Y-%m-%d"),
        "samples": N, "sample_shape": list(SHAPE),
        "file_mib": {k: round(p.stat().st_size / MiB, 1) for k, p in paths.items()},
        "chunk_aware_speedup": round(us["gzip/1MiB/random"] / us["gzip/1MiB/chunk"], 2),
        "small_chunk_speedup": round(us["gzip/1MiB/random"] / us["gzip_1img/1MiB/random"], 2),
        "auto_chunk_slowdown": round(us["gzip_auto/1MiB/random"] / us["gzip_1img/1MiB/random"], 2),
        "cache_32MiB_speedup_random_gzip": round(us["gzip/1MiB/random"] / us["gzip/32MiB/random"], 2),
        "hit_rate_1MiB": {k: round(s.hit_rate, 3) if s.accesses else None for k, s in stats.items()},  # None: no chunks
        "bytes_per_sample_1MiB": {k: round(s.bytes_per_sample) for k, s in stats.items()},
        "us_per_sample": us,
        "w0": w0_figures(paths["gzip"], orders["random"], repeats),
    }


if __name__ == "__main__":
    print(json.dumps(main()))
