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

from gpulab.data.chunk_cache import time_reads  # noqa: E402
from gpulab.data.hdf5 import ChunkShuffleSampler, H5Dataset, make_images, measure_chunk_cache, suggest_chunks, write_h5  # noqa: E402

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
    }


if __name__ == "__main__":
    print(json.dumps(main()))
