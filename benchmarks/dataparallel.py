"""DataParallel's memory imbalance, the balanced criterion's, and how much larger a batch fits.

    python benchmarks/dataparallel.py                     # 4 logical devices on what this machine has
    python benchmarks/dataparallel.py --budget-mib 256 --batch-size 1024

The workload of labs 04-05 (``gpulab.parallel.dp.step_memory.HeadWorkload``): a 64 -> 30,000
language-model head, cross-entropy loss, 4 logical devices. Measured side by side in this run:

- ``imbalance_dataparallel``: largest / smallest per-device peak of one training step through
  ``gpulab.parallel.DataParallel`` (target >= 2); ``imbalance_output_device_1`` the same with
  ``output_device=devices[1]`` (the load moves, the ratio stays);
- ``imbalance_balanced``: the same with ``DataParallelModel`` + ``DataParallelCriterion`` (target <= 1.25);
- ``max_batch_ratio``: the largest batch that fits a per-device ``MemoryMeter`` budget, balanced over
  plain (target >= 1.5), each found by doubling and bisection on multiples of 4;
- ``replicate``: what DataParallel pays every step and DDP does not: the bytes ``replicate`` copies to
  each device, and its share of one DataParallel training step (interleaved, median of 5; a time on
  whatever this machine is, so a ratio only);
- ``batch_scaling``: lab 05's time to a target loss (``gpulab.parallel.dp.batch_scaling``): steps,
  samples and seconds to a held-out loss of 0.5 at batches 64-4096 with the learning rate scaled
  (linear scaling rule, 10 warmup steps), and ``steps_vs_perfect`` = the steps that perfect scaling
  would need over the steps taken (1.0: a k times larger batch took k times fewer steps). Steps and
  samples are deterministic (one thread, fixed seeds); seconds are this machine's.

Memory figures are bytes of tensor storage counted per logical device by ``MemoryMeter``: exact and
deterministic, the same on any machine. With 2 or more GPUs the script also times a training step
of gpulab's DataParallel, of the balanced pair, and of ``torch.nn.DataParallel`` on the same GPUs
(interleaved, median of ``--repeats``); without them no time is recorded (``torch.nn.DataParallel``
runs on one device there, so there is nothing to compare). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from gpulab.devices import MemoryMeter, cuda_device_count, logical_devices
from gpulab.parallel import DataParallel, DataParallelCriterion, DataParallelModel, comm, replicate
from gpulab.parallel.dp.batch_scaling import ScalingTask, scaled_lr, time_to_target
from gpulab.parallel.dp.step_memory import HeadWorkload, fits_in_budget, largest_batch, step_memory
from gpulab.profiling.interleave import time_interleaved

TARGETS = {"imbalance_dataparallel_min": 2.0, "imbalance_balanced_max": 1.25, "max_batch_ratio_min": 1.5}
MiB = 2**20


def _peaks(report) -> list[float]:
    return [round(r.peak / MiB, 2) for r in report.rows]


def _step_times(work: HeadWorkload, repeats: int) -> dict:
    """Median step time (ms) of the three setups on real GPUs, interleaved so they share conditions."""
    n = min(cuda_device_count(), work.num_devices)
    gpus = logical_devices(n)
    head = work.model(gpus[0].physical)
    x, y = work.batch(device=gpus[0].physical)
    ours, balanced = DataParallel(head, gpus), DataParallelModel(head, gpus)
    criterion = DataParallelCriterion(F.cross_entropy, gpus)
    theirs = torch.nn.DataParallel(head, device_ids=list(range(n)))
    steps = {
        "gpulab_dataparallel": lambda: F.cross_entropy(ours(x), y).backward(),
        "gpulab_balanced": lambda: criterion(balanced(x), y).backward(),
        "torch_dataparallel": lambda: F.cross_entropy(theirs(x), y).backward(),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    for i in range(repeats + 1):
        for name, step in steps.items():
            head.zero_grad(set_to_none=True)
            for k in range(n):
                torch.cuda.synchronize(k)  # GPU work is asynchronous: wait before reading the clock
            t0 = time.perf_counter()
            step()
            for k in range(n):
                torch.cuda.synchronize(k)
            if i:  # the first round warms up (allocator, cuBLAS handles)
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "gpus": n,
        "gpu_name": torch.cuda.get_device_name(0),
        "step_ms": {k: round(v, 2) for k, v in med.items()},
        "gpulab_over_torch": round(med["gpulab_dataparallel"] / med["torch_dataparallel"], 3),
    }


def _replicate_cost(head: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, devices) -> dict:
    """Bytes ``replicate`` puts on each device, and its share of a DataParallel training step."""
    with MemoryMeter(devices=devices) as meter:
        del_me = replicate(head, devices)
        del del_me
    model = DataParallel(head, devices)
    on_gpu = devices[0].physical.type == "cuda"

    def sync() -> None:
        if on_gpu:  # GPU work is asynchronous: wait for every device before reading the clock
            for k in range(cuda_device_count()):
                torch.cuda.synchronize(k)

    def copy_only() -> None:
        replicate(head, devices)
        sync()

    def step() -> None:
        torch.nn.functional.cross_entropy(model(x), comm.to(y, devices[0])).backward()
        sync()
        head.zero_grad(set_to_none=True)
    t = time_interleaved({"replicate": copy_only, "step": step}, repeats=5)
    return {"bytes_per_device_mib": [round(meter.peak(d) / MiB, 2) for d in devices],
            "ms": {"replicate": round(t.median("replicate") * 1e3, 2), "step": round(t.median("step") * 1e3, 2)},
            "share_of_step": round(t.median("replicate") / t.median("step"), 4)}


def _batch_scaling(base_lr: float = 0.04, base_batch: int = 64, target: float = 0.5) -> dict:
    """Lab 05's runs: steps / samples / seconds to ``target`` as the batch grows, the rate scaled."""
    task = ScalingTask()
    runs = {b: time_to_target(task, b, lambda s, b=b: scaled_lr(s, base_lr, base_batch, b, 10), target)
            for b in (64, 256, 1024, 4096)}
    base = runs[base_batch]
    return {
        "target": target, "base_lr": base_lr, "base_batch": base_batch,
        "reached": {b: r.reached for b, r in runs.items()},
        "steps": {b: r.steps for b, r in runs.items()},
        "samples": {b: r.samples for b, r in runs.items()},
        "seconds": {b: round(r.seconds, 3) for b, r in runs.items()},
        "steps_vs_perfect": {b: round(base.steps * base_batch / b / r.steps, 3) for b, r in runs.items() if r.reached},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=HeadWorkload.batch_size)
    parser.add_argument("--budget-mib", type=int, default=HeadWorkload.budget // MiB)
    parser.add_argument("--limit", type=int, default=16384, help="largest batch the search tries")
    parser.add_argument("--repeats", type=int, default=7, help="timed steps per setup (GPUs only)")
    args = parser.parse_args()
    work = HeadWorkload(batch_size=args.batch_size, budget=args.budget_mib * MiB)
    devices = logical_devices(work.num_devices)
    home = devices[0].physical
    head = work.model(home)
    x, y = work.batch(device=home)

    plain = step_memory(DataParallel(head, devices), F.cross_entropy, x, y, devices)
    moved = step_memory(DataParallel(head, devices, output_device=devices[1]), F.cross_entropy, x, y, devices)
    criterion = DataParallelCriterion(F.cross_entropy, devices)
    balanced = step_memory(DataParallelModel(head, devices), criterion, x, y, devices)

    def fits(model, loss_fn):
        return lambda b: fits_in_budget(model, loss_fn, *work.batch(b, device=home), devices, work.budget)

    t0 = time.perf_counter()
    max_plain = largest_batch(fits(DataParallel(head, devices), F.cross_entropy), multiple=4, limit=args.limit)
    max_balanced = largest_batch(fits(DataParallelModel(head, devices), criterion), multiple=4, limit=args.limit)
    search_s = time.perf_counter() - t0

    ratio = max_balanced / max_plain if max_plain else float("inf")
    replication = _replicate_cost(head, x, y, devices)
    scaling = _batch_scaling()
    result = {
        "benchmark": "dataparallel",
        "mode": plain.mode(),
        "devices": [repr(d) for d in devices],
        "torch": torch.__version__,
        "workload": {"hidden": work.hidden, "vocab": work.vocab, "batch_size": work.batch_size,
                     "budget_mib": args.budget_mib},
        "peaks_mib": {"dataparallel": _peaks(plain), "output_device_1": _peaks(moved), "balanced": _peaks(balanced)},
        "imbalance_dataparallel": round(plain.imbalance, 3),
        "imbalance_output_device_1": round(moved.imbalance, 3),
        "imbalance_balanced": round(balanced.imbalance, 3),
        "max_batch_dataparallel": max_plain,
        "max_batch_balanced": max_balanced,
        "max_batch_ratio": round(ratio, 3),
        "search_s": round(search_s, 1),
        "replicate": replication,
        "batch_scaling": scaling,
        "targets": TARGETS,
        "ok": plain.imbalance >= TARGETS["imbalance_dataparallel_min"]
        and balanced.imbalance <= TARGETS["imbalance_balanced_max"] and ratio >= TARGETS["max_batch_ratio_min"],
    }
    if cuda_device_count() >= 2:
        result["step_time"] = _step_times(work, args.repeats)
    else:
        result["step_time"] = f"not measured: needs 2+ GPUs ({cuda_device_count()} visible)"
    print(json.dumps(result))


if __name__ == "__main__":
    main()
