"""Model parallel vs pipelined ResNet training steps, measured side by side (lab 07's figures).

    python benchmarks/model_parallel.py                  # ResNet-18, width 16, 64x64 images, batch 128
    python benchmarks/model_parallel.py --depth 50 --width 8 --repeats 7

The PyTorch tutorial "Single-Machine Model Parallel Best Practices" splits ResNet-50 over two GPUs
and measures: the naive split 7 % slower than one GPU, pipelining with ``split_size=20`` 49 %
faster, the best ``split_size=12`` 54 % faster. This script measures the same comparison on
two logical devices: real GPUs when there are two, otherwise stages sharing this machine, each
stage one thread with one intra-op thread (``intra_op_threads(1)`` for *every* variant, so each
logical device is one core). Training steps (forward, cross-entropy, backward, SGD step) of:

- ``single``: the whole model on one device;
- ``naive``: the split model (time-balanced cut), whole batch;
- for each split size: ``seq<k>`` (the same micro-batches one after another) and ``pipe<k>``.

They run interleaved, ``--repeats`` rounds; every figure is a ratio of medians from this run.
``overlap_speedup`` (seq -> pipe at the best split size) is what overlapping the stages earns,
target >= 1.5 on 2 free cores; ``pipeline_speedup`` is naive -> pipe, which also contains the
micro-batch size effect (``microbatch_effect`` = naive -> seq: on a CPU a small batch can be
faster per sample through the cache, or slower through per-call overhead; it is not the
pipeline's). ``split_speedup`` is single -> naive (the tutorial's 0.93).

At the best split size the overlap can earn at most ``S*M/(M+S-1)`` (``overlap_bound_at_best``;
1.33 for M=2 micro-batches). A 1-thread CPU runs small micro-batches slowly per sample, which
pushes the best split size up, so the batch is 128 by default (M >= 4 at split sizes <= 32).
``overlap_speedup_max`` is the largest overlap at any split size. ``cores`` says how many cores
each variant really had (process CPU time / wall time): a pipelined run on ~1 core means another
program held the second one, and the overlap figure is then not this code's (``two_free_cores``
is false). ``two_thread_ceiling`` is what this machine gives two threads of plain matmul work
over running them one after the other, timed in the same rounds: the most any two-stage overlap
can reach here (a VM's two vCPUs can share one physical core; 1.16-1.57 was seen on the 2-core
VM this kit is tested on). ``overlap_vs_ceiling`` is the overlap measured against it. Prints one
JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import threading
import time

import torch

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, bubble_fraction, intra_op_threads, measured_bubble, split_model
from gpulab.parallel.pipeline.timing import time_interleaved, train_step

TARGET_OVERLAP = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=18)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--image", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--split-sizes", default="8,16,32,64", help="comma-separated micro-batch sizes")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.split_sizes.split(",")]

    torch.manual_seed(0)
    devices = logical_devices(2)
    on_gpu = devices[0].physical.type == "cuda"
    x = torch.randn(args.batch_size, 3, args.image, args.image, device=devices[0].physical)
    y = torch.randint(0, 10, (args.batch_size,), device=devices[-1].physical)
    t_start = time.perf_counter()
    with intra_op_threads(1) if not on_gpu else contextlib.nullcontext():
        single = resnet(args.depth, 10, args.width).to(devices[0].physical)
        # cut where a training step's measured time splits evenly, timed on a middle-sized micro-batch
        k_mid = sorted(sizes)[len(sizes) // 2]
        split = split_model(copy.deepcopy(single), devices, balance="time", sample=x[:k_mid])
        variants = {"single": _step(single, x, y), "naive": _step(split, x, y)}
        pipes = {}
        for k in sizes:
            variants[f"seq{k}"] = _step(PipelinedModel(split, k, overlap=False), x, y)
            pipes[k] = PipelinedModel(split, k)
            variants[f"pipe{k}"] = _step(pipes[k], x, y)
        if not on_gpu:  # the machine's own two-thread speedup, in the same rounds
            variants.update(ceiling_seq=_matmul_pair(sequential=True), ceiling_par=_matmul_pair(sequential=False))
        timings = time_interleaved(variants, repeats=args.repeats, progress=True, desc="model parallel")
        mode = pipes[sizes[0]].mode  # inside: it reports the intra-op threads in use
    best = min(sizes, key=lambda k: timings.median(f"pipe{k}"))
    m = pipes[best].num_micro_batches(args.batch_size)
    overlap = {k: round(timings.speedup(f"seq{k}", f"pipe{k}"), 3) for k in sizes}
    result = {
        "overlap_speedup": round(timings.speedup(f"seq{best}", f"pipe{best}"), 3),
        "pipeline_speedup": round(timings.speedup("naive", f"pipe{best}"), 3),
        "split_speedup": round(timings.speedup("single", "naive"), 3),
        "best_split_size": best,
        "microbatch_effect": round(timings.speedup("naive", f"seq{best}"), 3),
        "overlap_by_split_size": overlap,
        # the most overlap can earn at the best split size: S*M / (M+S-1) with S=2 (equal stages)
        "overlap_bound_at_best": round(2 * m / (m + 1), 3),
        "overlap_speedup_max": max(overlap.values()),
        "overlap_max_split_size": max(sizes, key=overlap.__getitem__),
        "target_overlap": TARGET_OVERLAP,
        "two_thread_ceiling": None if on_gpu else round(timings.speedup("ceiling_seq", "ceiling_par"), 3),
        "overlap_vs_ceiling": None if on_gpu else round(timings.speedup(f"seq{best}", f"pipe{best}")
                                                        / timings.speedup("ceiling_seq", "ceiling_par"), 3),
        "bubble_theory": round(bubble_fraction(2, m), 3),
        "bubble_measured": round(measured_bubble(pipes[best].timeline), 3) if not on_gpu else None,
        "median_ms": {n: round(timings.median(n) * 1e3, 2) for n in variants},
        "cores": {n: round(timings.cores(n), 2) for n in variants},
        # a pipeline on two logical CPU devices needs two free cores; with fewer, the overlap
        # figure measures the machine's load, not this code (GPUs: cores do not apply)
        "two_free_cores": None if on_gpu else timings.cores(f"pipe{best}") >= 1.6,
        "stages": split.describe().splitlines(),
        "mode": mode,
        "model": f"resnet{args.depth} width {args.width}, {args.image}x{args.image}, batch {args.batch_size}",
        "device": torch.cuda.get_device_name(0) if on_gpu else f"{platform.processor() or platform.machine()}, "
                                                                  f"{os.cpu_count()} cores",
        "torch": torch.__version__,
        "repeats": args.repeats,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    print(json.dumps(result))


def _matmul_pair(sequential: bool, n: int = 300):
    """Two equal loops of 256x256 matmuls (about 0.15 s each on one core), in turn or in two threads."""
    a = torch.randn(256, 256)

    def work() -> None:
        for _ in range(n):
            a @ a

    def run() -> None:
        if sequential:
            work()
            work()
            return
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return run


def _step(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return lambda: train_step(model, x, y, opt)


if __name__ == "__main__":
    main()
