"""Lab 02's claim, measured: the tuned input pipeline keeps the device busy and is >= 2x faster.

    .venv/bin/python benchmarks/data_pipeline.py [--epochs 2] [--repeats 3]

Targets: ``busy_fraction_tuned >= 0.9`` and ``throughput_ratio >= 2`` (tuned / baseline samples
per second), measured side by side in one run (baseline, tuned, baseline, tuned, ...; the
medians count). The workload is calibrated first (``gpulab.data.pipelines.calibrate``): the
model's device time is a quarter of this machine's CPU time for one baseline batch. On a CPU-only
machine the device is the simulated accelerator and its figures are simulated; on a GPU it is
the real GPU. Every epoch after the first counts (the first one starts the workers).

Also measured, for lab 02's other claims:
* ``prefetch``: ``StallingReads`` (one read in 64 waits 60 ms; a sleep, so the figure does not
  depend on free cores) consumed by a 10 ms step, steady samples/s with 1 worker at
  ``prefetch_factor`` 1 and 8 and without stalls, interleaved over ``--repeats``;
  ``prefetch_8_vs_1`` is the ratio (lab 02 says a deeper queue hides stalls).
* ``fingerprint_ms_per_batch``: what ``TransferLog`` adds per copied batch (a 64-image uint8 batch
  and the baseline's float32 one), so that grading through it stays fair.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpulab.accel import pick_accelerator
from gpulab.data.crossing import sample_fingerprints
from gpulab.data.pipelines import baseline_pipeline, calibrate, tuned_pipeline, use_one_thread_if_simulated
from gpulab.data.synthetic import StallingReads
from gpulab.data.workers import LoaderWarning, make_loader, measure_loader
from gpulab.profiling import profile_loop


def prefetch_figures(repeats: int) -> dict:
    """Steady samples/s of stalling reads behind a 10 ms step: prefetch_factor 1 vs 8, and no stalls."""
    variants = {"prefetch_1": (0.060, 1), "prefetch_8": (0.060, 8), "no_stalls": (0.0, 2)}
    rates: dict[str, list[float]] = {k: [] for k in variants}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LoaderWarning)
        for _ in range(repeats):
            for name, (stall_s, pf) in variants.items():
                loader = make_loader(StallingReads(256, stall_s=stall_s, stall_every=64), num_workers=1,
                                     prefetch_factor=pf, batch_size=8)
                rates[name].append(measure_loader(loader, step_s=0.010)["steady_samples_per_s"])
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {"samples_per_s": {k: round(v) for k, v in med.items()},
            "prefetch_8_vs_1": round(med["prefetch_8"] / med["prefetch_1"], 2),
            "consumer_limit_8_per_10ms": 800}


def fingerprint_ms(reps: int = 200) -> dict:
    out = {}
    for name, batch in (("uint8_64x3x32x32", torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8)),
                        ("float32_64x3x32x32", torch.rand(64, 3, 32, 32))):
        t0 = time.perf_counter()
        for _ in range(reps):
            sample_fingerprints(batch)
        out[name] = round((time.perf_counter() - t0) / reps * 1e3, 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs per measurement (the first is warm-up)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    accel = pick_accelerator()
    threads = use_one_thread_if_simulated(accel)  # the simulated device's work must not wait for a busy core
    setup = calibrate(accel)
    base_loader, base_step = baseline_pipeline(setup, accel)
    tuned_loader, tuned_step = tuned_pipeline(setup, accel)
    n = setup.steps_per_epoch
    base, tuned = [], []
    for _ in range(args.repeats):
        base.append(profile_loop(base_loader, base_step, accel, n, epochs=args.epochs, warmup_steps=n, disable=True))
        tuned.append(profile_loop(tuned_loader, tuned_step, accel, n, epochs=args.epochs, warmup_steps=n,
                                  non_blocking=True, disable=True))
    med = statistics.median
    ratios = [t.throughput / b.throughput for b, t in zip(base, tuned)]
    print(json.dumps({
        "benchmark": "data_pipeline",
        "device": accel.name,
        "mode": accel.kind,
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "busy_fraction_baseline": round(med(b.busy_fraction for b in base), 3),
        "busy_fraction_tuned": round(med(t.busy_fraction for t in tuned), 3),
        "throughput_ratio": round(med(ratios), 2),
        "throughput_ratio_min": round(min(ratios), 2),
        "busy_fraction_tuned_min": round(min(t.busy_fraction for t in tuned), 3),
        "baseline_samples_per_s": round(med(b.throughput for b in base)),
        "tuned_samples_per_s": round(med(t.throughput for t in tuned)),
        "compute_ms": round(setup.compute_s * 1e3, 2),
        "baseline_batch_cpu_ms": round(setup.batch_cpu_s * 1e3, 2),
        "repeats": args.repeats,
        "prefetch": prefetch_figures(args.repeats),
        "fingerprint_ms_per_batch": fingerprint_ms(),
        "targets": {"busy_fraction_tuned": 0.9, "throughput_ratio": 2.0},
    }))


if __name__ == "__main__":
    main()
