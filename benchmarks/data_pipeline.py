"""Lab 02's claim, measured: the tuned input pipeline keeps the device busy and is >= 2x faster.

    .venv/bin/python benchmarks/data_pipeline.py [--epochs 2] [--repeats 3]

Targets: ``busy_fraction_tuned >= 0.9`` and ``throughput_ratio >= 2`` (tuned / baseline samples
per second), measured side by side in one run (baseline, tuned, baseline, tuned, ...; the
medians count). The workload is calibrated first (``gpulab.data.pipelines.calibrate``): the
model's device time is a quarter of this machine's CPU time for one baseline batch. On a CPU-only
machine the device is the simulated accelerator and its figures are simulated; on a GPU it is
the real GPU. Every epoch after the first counts (the first one starts the workers). Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpulab.accel import pick_accelerator  # noqa: E402
from gpulab.data.pipelines import baseline_pipeline, calibrate, tuned_pipeline, use_one_thread_if_simulated  # noqa: E402
from gpulab.profiling import profile_loop  # noqa: E402


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
        "targets": {"busy_fraction_tuned": 0.9, "throughput_ratio": 2.0},
    }))


if __name__ == "__main__":
    main()
