"""Lab 10's claims, measured side by side in one Ray session: ASHA's saving and packing's gain.

    .venv/bin/python benchmarks/hpo.py              # prints ONE JSON line (about 1-2 minutes on 2 cores)
    .venv/bin/python benchmarks/hpo.py --trials 27 --epochs 9

Three Tune searches over the same sampled configurations (random search draws them once, with a
seed; the other two get them through ``points_to_evaluate``), every trial being
``gpulab.hpo.train_classifier`` with a 1 ms wait for each batch (a slightly slow input pipeline):

1. **random search**: every trial runs ``--epochs`` epochs, one CPU core per trial, or on a GPU
   machine one whole GPU per trial;
2. **ASHA** (``ASHAScheduler``, grace period 1, reduction factor 3) on the same configurations;
3. **packed**: random search again, two trials per core (``{"cpu": 0.5}``), or four per GPU.

Each search's request comes from ``gpulab.hpo.search_resources`` (as in lab 10), and after each
search ``check_trial_devices`` confirms that every trial saw the GPUs it was given and no other.

Figures:

- ``asha_iteration_saving``: trial-epochs of random search / trial-epochs of ASHA (target >= 3);
- ``asha_best_gap``: best accuracy of random search - best of ASHA (target <= 0.02);
- ``packing_throughput_ratio``: trials per hour packed / unpacked, in steady state (from the first
  trial's start to the last one's end, so the one-off worker start-up is left out; target > 1
  when trials wait for data); ``packing_wall_ratio`` is the same with start-up included;
- wall times of Ray's start-up and of each search; in the steady window, the share of the CPU
  the search used (this process and its Ray workers) and how busy the cores were (anyone's work:
  on a shared machine other jobs take the idle time packing would fill, and the gain shrinks).

Sources: Li et al. 2020 (ASHA, arXiv 1810.05934); Ray Tune's guide to fractional resources.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gpulab.devices import cuda_device_count
from gpulab.hpo import (
    check_trial_devices,
    ray_session,
    search_resources,
    summarize,
    train_classifier,
    trial_configs,
)
from gpulab.hpo.timing import TrialTimer, mean_utilization
from gpulab.monitor import UtilizationMonitor


def _search(session, resources, space, name, **tune_kw):
    """One timed ``tuner.fit()`` of ``train_classifier`` asking Ray for ``resources`` per trial,
    under the utilisation monitor."""
    from ray import tune

    timer = TrialTimer()
    num_gpus = cuda_device_count()
    with UtilizationMonitor(interval=0.2, nvml=num_gpus > 0) as monitor:
        t0 = time.perf_counter()
        results = tune.Tuner(tune.with_resources(train_classifier, resources), param_space=space,
                             tune_config=tune.TuneConfig(metric="accuracy", mode="max", reuse_actors=True, **tune_kw),
                             run_config=session.run_config(name=name, callbacks=[timer])).fit()
        summary = summarize(results, time.perf_counter() - t0, name)
    if summary.errors:
        raise RuntimeError(f"{name}: {len(summary.errors)} trial(s) failed: {next(iter(summary.errors.values()))}")
    check_trial_devices(results, resources, num_gpus)  # each trial saw the GPUs it was given, no other
    window = timer.steady_window
    return results, summary, timer, (mean_utilization(monitor, window), mean_utilization(monitor, window, kind="cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=27, help="configurations sampled (default 27)")
    parser.add_argument("--epochs", type=int, default=9, help="epochs of a full trial, ASHA's max_t (default 9)")
    parser.add_argument("--io-wait-ms", type=float, default=1.0, help="wait per training step (default 1 ms)")
    args = parser.parse_args()

    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    num_cpus, num_gpus = os.cpu_count() or 1, cuda_device_count()
    space = {"lr": tune.loguniform(1e-3, 1.0), "width": tune.lograndint(8, 129), "epochs": args.epochs,
             "io_wait_ms": args.io_wait_ms}
    t_all, load_before = time.perf_counter(), os.getloadavg()[0]
    with ray_session(num_cpus=num_cpus, num_gpus=num_gpus) as session:
        requests = {name: search_resources(name, num_cpus, num_gpus) for name in ("random", "asha", "packed")}
        rand, rand_s, rand_t, rand_util = _search(
            session, requests["random"], space, "random", num_samples=args.trials,
            search_alg=BasicVariantGenerator(random_state=0))
        configs = list(trial_configs(rand).values())
        _, asha_s, _, _ = _search(
            session, requests["asha"], space, "asha", num_samples=len(configs),
            search_alg=BasicVariantGenerator(points_to_evaluate=configs),
            scheduler=ASHAScheduler(max_t=args.epochs, grace_period=1, reduction_factor=3))
        _, pack_s, pack_t, pack_util = _search(
            session, requests["packed"], space, "packed", num_samples=len(configs),
            search_alg=BasicVariantGenerator(points_to_evaluate=configs))
        startup_s = session.startup_s
    leftovers = session.leftovers

    saving = rand_s.trial_epochs / asha_s.trial_epochs
    gap = rand_s.best_accuracy - asha_s.best_accuracy
    ratio = pack_t.trials_per_hour / rand_t.trials_per_hour
    print(json.dumps({
        "benchmark": "hpo",
        "device": "cuda" if num_gpus else "cpu",
        "cpu_cores": num_cpus,
        "gpus": num_gpus,
        "machine": platform.machine(),
        "torch": torch.__version__,
        "ray": __import__("ray").__version__,
        "trials": args.trials,
        "epochs": args.epochs,
        "io_wait_ms": args.io_wait_ms,
        "asha_iteration_saving": round(saving, 2),
        "asha_best_gap": round(gap, 4),
        "packing_throughput_ratio": round(ratio, 2),
        "packing_wall_ratio": round(rand_s.wall_s / pack_s.wall_s, 2),
        "trial_epochs": {"random": rand_s.trial_epochs, "asha": asha_s.trial_epochs, "packed": pack_s.trial_epochs},
        "best_accuracy": {"random": round(rand_s.best_accuracy, 4), "asha": round(asha_s.best_accuracy, 4),
                          "packed": round(pack_s.best_accuracy, 4)},
        "packed_resources": requests["packed"],
        "unpacked_resources": requests["random"],
        "max_concurrent": {"unpacked": rand_t.max_concurrent, "packed": pack_t.max_concurrent},
        "search_cpu_pct": {"unpacked": round(rand_util[0], 1), "packed": round(pack_util[0], 1)},
        "machine_cpu_busy_pct": {"unpacked": round(rand_util[1], 1), "packed": round(pack_util[1], 1)},
        "load_average_1min": {"start": round(load_before, 1), "end": round(os.getloadavg()[0], 1)},
        "trials_per_hour_steady": {"unpacked": round(rand_t.trials_per_hour), "packed": round(pack_t.trials_per_hour)},
        "wall_s": {"ray_start": round(startup_s, 1), "random": round(rand_s.wall_s, 1), "asha": round(asha_s.wall_s, 1),
                   "packed": round(pack_s.wall_s, 1), "total": round(time.perf_counter() - t_all, 1)},
        "ray_processes_killed_on_shutdown": len(leftovers),
        "target": "asha_iteration_saving >= 3 and asha_best_gap <= 0.02 and packing_throughput_ratio > 1",
        "ok": bool(saving >= 3 and gap <= 0.02 and ratio > 1),
    }))


if __name__ == "__main__":
    main()
