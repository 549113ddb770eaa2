"""Model parallel vs pipelined ResNet training steps, measured side by side (lab 07's figures).

    python benchmarks/model_parallel.py                  # ResNet-18, width 16, 64x64 images, batch 128
    python benchmarks/model_parallel.py --depth 50 --width 8 --repeats 7
    flock /tmp/gpulab-cpu.lock python benchmarks/model_parallel.py   # on a shared machine

The PyTorch tutorial "Single-Machine Model Parallel Best Practices" splits ResNet-50 over two GPUs
and measures: the naive split 7 % slower than one GPU, pipelining with ``split_size=20`` 49 %
faster, the best ``split_size=12`` 54 % faster. This script measures the same comparison on
two logical devices: real GPUs when there are two, otherwise stages sharing this machine, each
stage one thread with one intra-op thread (``intra_op_threads(1)`` for *every* variant, so each
logical device is one core). Training steps (forward, cross-entropy, backward, SGD step) of:

- ``single``: the whole model on one device;
- ``naive``: the split model (cut by ``--balance``, default ``time``: each pass balanced), whole batch;
- for each split size: ``seq<k>`` (the same micro-batches one after another) and ``pipe<k>``
  (GPipe, two stages);
- on the CPU, for each split size: ``iseq<k>`` and ``ipipe<k>``, the same with **interleaved
  stages** (``--interleave``, default 2: four stages on devices 0, 1, 0, 1, cut by the same
  ``--balance``): fill and drain take one small stage instead of half the model (Narayanan et al.
  2021, arXiv 2104.04473), which GPipe's bound below does not allow;
- on the CPU, for each split size: ``fseq<k>`` and ``fpipe<k>``, the **fused** step
  (``PipelinedModel.forward_backward``) on the same interleaved devices: each micro-batch's loss
  is computed on the last stage and its backward starts there while later micro-batches still go
  forward, so the step fills and drains once and a device's forward and backward work share its
  time. Its cut is the one whose simulated fused step is shortest
  (``interleaved_boundaries(..., fused=True)``): only forward + backward per device must balance,
  where GPipe's two passes each need their own balance. ``fseq<k>`` is gradient accumulation:
  each micro-batch forward, loss, backward, one after the other.

They run in turns, ``--repeats`` rounds; every figure is a ratio of medians from this run.
``fastest`` is the fastest pipeline of all (schedule and split size): its overlap against the
two-thread ceiling is the figure issue 17 sets at 0.9 (``target_met``); ``schedules`` has every
figure below for each schedule, overlap measured against the schedule's own ``seq`` runs. The
top-level keys are GPipe's, as in earlier runs.
``overlap_speedup`` (seq -> pipe at the best split size) is what overlapping the stages earns;
``pipeline_speedup`` is naive -> pipe, which also contains the micro-batch size effect
(``microbatch_effect`` = naive -> seq: on a CPU a small batch can be faster per sample through the
cache, or slower through per-call overhead; it is not the pipeline's). ``split_speedup`` is
single -> naive (the tutorial's 0.93).

**The ceilings** (CPU only), timed in the same rounds:

- ``two_thread_ceiling``: two threads of plain 256x256 matmuls against the same loops one after the
  other: what this machine gives two threads (a VM's two vCPUs can share one physical core, and
  another program can hold one; 1.16-1.57 was seen on the 2-core VM this kit is tested on);
- ``stage_pair_ceiling``: the model's own work, stage 0's and stage 1's forward + backward of every
  micro-batch (at the middle split size), in two threads with no dependency between them, against
  one after the other: what these ops get from two threads here (memory bandwidth, the GIL).

``overlap_vs_ceiling`` is the overlap measured against ``two_thread_ceiling`` (target 0.9, issue 17).
It can pass 1 where the model's own ops get more from two threads than matmuls do
(``stage_pair_ceiling`` above ``two_thread_ceiling``).
No pipeline can reach it at every ``M``: GPipe fills and drains each pass, so with equal stages, free
hand-offs and threads that together run ``c`` times one thread, the most it earns is
``M / (1 + (M - 1) / c)`` (``overlap_bound_with_ceiling``; with ``c = 2`` it is the textbook
``2M / (M + 1)``). At ``M = 4`` that bound is 0.8 of the ceiling when ``c = 2``, 0.88 when ``c = 1.55``;
0.9 needs ``M >= 9 (c - 1)``. With ``v`` interleaved stages per device the fill and drain shrink to
``1 / v`` of that: ``M / (1 / v + (M - 1 / v) / c)``, 0.94 of the ceiling at ``M = 4``, ``v = 2``,
``c = 1.55``. ``overlap_vs_bound`` is the overlap measured against the schedule's bound: the share of
what a perfect pipeline of that schedule would earn here that this one does.

**Where the rest goes**, read off the timelines of the last ``seq`` and ``pipe`` steps at each
split size (``breakdown``; :mod:`gpulab.parallel.pipeline.bubble`):

- ``bubble_formula`` / ``bubble_replayed`` / ``bubble_measured``: the idle share of the stages by
  the formula (equal stages), by the measured durations with free hand-offs (adds the imbalance
  between stages, per pass), and as measured (adds the hand-offs);
- ``handoff_ms`` (median) and ``handoff_share`` (all hand-off waiting / stage time of the passes);
- ``busy_inflation``: the stages' busy time pipelined / sequential: how much slower the same ops
  run when both stages compute at once (shared cores, memory bandwidth, the GIL);
- ``stage_ms``: each device's forward and backward, sequential (the balance of the cut, per pass;
  for interleaved stages, the sum of each device's stages).

``cores`` says how many cores each variant really had (process CPU time / wall time): a pipelined
run on ~1 core means another program held the second one (``two_free_cores`` is false). Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import threading
import time

import torch

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, bubble_fraction, intra_op_threads, measured_bubble, split_model
from gpulab.parallel.pipeline import handoff_delays, replay
from gpulab.parallel.pipeline.balance import balanced_boundaries, interleaved_boundaries, phase_times
from gpulab.parallel.pipeline.bubble import fused
from gpulab.parallel.pipeline.split import device_lanes, model_layers
from gpulab.parallel.pipeline.timing import time_interleaved, train_step

TARGET_OVERLAP = 1.5
TARGET_VS_CEILING = 0.9  # issue 17


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=18)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--image", type=int, default=64, help="image side in pixels")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--split-sizes", default="8,16,32,64", help="comma-separated micro-batch sizes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="glibc: serve large blocks from the heap and never trim it (mallopt), so freed "
                             "activations are reused instead of page-faulting in again")
    parser.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous",
                        help="the images' and weights' layout: contiguous (NCHW) or channels_last (NHWC, "
                             "oneDNN's own: every variant about 1.3x faster here, the ratios about the same)")
    parser.add_argument("--interleave", type=int, default=2,
                        help="stages per device of the interleaved schedule (1: GPipe's two stages only)")
    parser.add_argument("--balance", choices=["time", "sums", "params"], default="time",
                        help="the cut: time (each pass balanced, split_model's), sums (forward + backward "
                             "balanced per stage, the cut a 1F1B schedule wants), params")
    args = parser.parse_args()
    sizes = [int(s) for s in args.split_sizes.split(",")]
    kept = _keep_freed_memory() if args.keep_freed_memory else False

    torch.manual_seed(0)
    devices = logical_devices(2)
    on_gpu = devices[0].physical.type == "cuda"
    layout = torch.channels_last if args.memory_format == "channels_last" else torch.contiguous_format
    x = torch.randn(args.batch_size, 3, args.image, args.image, device=devices[0].physical).contiguous(
        memory_format=layout)
    y = torch.randint(0, 10, (args.batch_size,), device=devices[-1].physical)
    t_start = time.perf_counter()
    with intra_op_threads(1) if not on_gpu else contextlib.nullcontext():
        single = resnet(args.depth, 10, args.width).to(devices[0].physical, memory_format=layout)
        k_mid = sorted(sizes)[len(sizes) // 2]  # costs depend on the micro-batch: measured on a middle one
        split = _split(copy.deepcopy(single), devices, args.balance, x[:k_mid])
        variants = {"single": _step(single, x, y), "naive": _step(split, x, y)}
        # schedule name -> (its variant prefix, its split); interleaved: CPU threads only (GPU streams
        # give each stage its own stream, so two stages of one GPU would not take turns)
        schedules = {"gpipe": ("", split)}
        if not on_gpu and args.interleave > 1:
            schedules["interleaved"] = ("i", _split(copy.deepcopy(single), devices * args.interleave,
                                                    args.balance, x[:k_mid]))
        if not on_gpu:  # the fused step: the CPU threads' schedule (on GPUs it is GPipe's two passes)
            schedules["fused"] = ("f", _split(copy.deepcopy(single), devices * max(1, args.interleave),
                                              args.balance, x[:k_mid], fused=True))
        pipes: dict[tuple[str, int], PipelinedModel] = {}
        seqs: dict[tuple[str, int], PipelinedModel] = {}
        for name, (prefix, model) in schedules.items():
            for k in sizes:
                seqs[name, k], pipes[name, k] = PipelinedModel(model, k, overlap=False), PipelinedModel(model, k)
                step = _fused_step if name == "fused" else _step
                variants[f"{prefix}seq{k}"] = step(seqs[name, k], x, y)
                variants[f"{prefix}pipe{k}"] = step(pipes[name, k], x, y)
        if not on_gpu:  # what two threads get here, in the same rounds
            variants.update(ceiling_seq=_matmul_pair(sequential=True), ceiling_par=_matmul_pair(sequential=False),
                            stage_pair_seq=_stage_pair(split, x, k_mid, sequential=True),
                            stage_pair_par=_stage_pair(split, x, k_mid, sequential=False))
        timings = time_interleaved(variants, repeats=args.repeats, progress=True, desc="model parallel")
        mode = {name: pipes[name, sizes[0]].mode for name in schedules}  # inside: it reports the intra-op threads
    ceiling = None if on_gpu else timings.speedup("ceiling_seq", "ceiling_par")
    figures = {name: _schedule_figures(name, prefix, model, sizes, args.batch_size, timings, pipes, seqs, ceiling)
               for name, (prefix, model) in schedules.items()}
    gpipe = figures["gpipe"]
    best = gpipe["best_split_size"]
    m = pipes["gpipe", best].num_micro_batches(args.batch_size)
    # the fastest pipeline of all, schedule and split size: the figure the target is about
    fastest_name = min(figures, key=lambda n: figures[n]["step_ms"])
    fastest = figures[fastest_name]
    result = {
        "fastest": {"schedule": fastest_name, "split_size": fastest["best_split_size"],
                    "step_ms": fastest["step_ms"], "overlap_speedup": fastest["overlap_speedup"],
                    "overlap_vs_ceiling": fastest.get("overlap_vs_ceiling"),  # None on GPUs
                    "speedup_over_naive": round(timings.median("naive") / (fastest["step_ms"] / 1e3), 3),
                    "speedup_over_gpipe": round(gpipe["step_ms"] / fastest["step_ms"], 3)},
        "target_vs_ceiling": TARGET_VS_CEILING,
        "target_met": None if on_gpu else fastest["overlap_vs_ceiling"] >= TARGET_VS_CEILING,
        # GPipe's figures (the keys of earlier runs), then each schedule's in full
        "overlap_speedup": gpipe["overlap_speedup"],
        "pipeline_speedup": round(timings.speedup("naive", f"pipe{best}"), 3),
        "split_speedup": round(timings.speedup("single", "naive"), 3),
        "best_split_size": best,
        "microbatch_effect": round(timings.speedup("naive", f"seq{best}"), 3),
        "overlap_by_split_size": gpipe["overlap_by_split_size"],
        # the most overlap can earn at the best split size: S*M / (M+S-1) with S=2 (equal stages)
        "overlap_bound_at_best": round(2 * m / (m + 1), 3),
        "overlap_speedup_max": max(gpipe["overlap_by_split_size"].values()),
        "overlap_max_split_size": max(sizes, key=gpipe["overlap_by_split_size"].__getitem__),
        "target_overlap": TARGET_OVERLAP,
        "two_thread_ceiling": None if on_gpu else round(ceiling, 3),
        "stage_pair_ceiling": None if on_gpu else round(timings.speedup("stage_pair_seq", "stage_pair_par"), 3),
        "overlap_vs_ceiling": gpipe.get("overlap_vs_ceiling"),
        "schedules": figures,
        "median_ms": {n: round(timings.median(n) * 1e3, 2) for n in variants},
        "cores": {n: round(timings.cores(n), 2) for n in variants},
        # a pipeline on two logical CPU devices needs two free cores; with fewer, the overlap
        # figure measures the machine's load, not this code (GPUs: cores do not apply)
        "two_free_cores": None if on_gpu else timings.cores(f"pipe{best}") >= 1.6,
        "balance": args.balance,
        "memory_format": args.memory_format,
        "keep_freed_memory": kept,
        "mode": mode,
        "model": f"resnet{args.depth} width {args.width}, {args.image}x{args.image}, batch {args.batch_size}",
        "device": torch.cuda.get_device_name(0) if on_gpu else f"{platform.processor() or platform.machine()}, "
                                                                  f"{os.cpu_count()} cores",
        "load_before": _loadavg(),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    print(json.dumps(result))


def _schedule_figures(name, prefix, model, sizes, batch_size, timings, pipes, seqs, ceiling) -> dict:
    """One schedule's figures: overlap per split size (its own sequential run -> pipelined), against
    the two-thread ceiling and against the schedule's own bound there, and where the time goes."""
    chunks = len(model.devices) // (max(device_lanes(model.devices)) + 1)  # stages per device
    best = min(sizes, key=lambda k: timings.median(f"{prefix}pipe{k}"))
    overlap = {k: round(timings.speedup(f"{prefix}seq{k}", f"{prefix}pipe{k}"), 3) for k in sizes}
    micro = {k: pipes[name, k].num_micro_batches(batch_size) for k in sizes}
    out = {
        "stages": model.describe().splitlines(),
        "chunks_per_device": chunks,
        "best_split_size": best,
        "step_ms": round(timings.median(f"{prefix}pipe{best}") * 1e3, 2),
        "overlap_speedup": overlap[best],
        "overlap_by_split_size": overlap,
        "bubble_formula": {k: round(bubble_fraction(2, micro[k], chunks), 3) for k in sizes},
    }
    if ceiling is None:  # GPUs: no ceiling, no thread timelines
        return out
    bound = {k: _bound(micro[k], ceiling, chunks) for k in sizes}
    out.update({
        "overlap_vs_ceiling": round(overlap[best] / ceiling, 3),
        "overlap_vs_ceiling_by_split_size": {k: round(v / ceiling, 3) for k, v in overlap.items()},
        # the most this schedule can earn at M micro-batches when two threads run c times one thread
        "overlap_bound_with_ceiling": {k: round(v, 3) for k, v in bound.items()},
        # what this pipeline reaches of that bound: the implementation's share, bubble and ceiling aside
        "overlap_vs_bound": {k: round(overlap[k] / bound[k], 3) for k in sizes},
        "breakdown": {k: _breakdown(seqs[name, k].timeline, pipes[name, k].timeline, chunks) for k in sizes},
    })
    return out


def _split(model, devices, balance, sample, fused=False):
    """The split model, cut by ``balance`` ("sums": forward + backward per stage balanced), or with
    ``fused``, by the shortest simulated fused step (one sweep, ``forward_backward``)."""
    if balance != "sums" and not fused:
        return split_model(model, devices, balance=balance, sample=sample)
    forward, backward = phase_times(model_layers(model), sample)
    if fused:
        cut = interleaved_boundaries(forward, backward, device_lanes(devices), fused=True)
    else:
        cut = balanced_boundaries([f + b for f, b in zip(forward, backward)], len(devices))
    return split_model(model, devices, boundaries=cut)


def _bound(micro_batches: int, ceiling: float, chunks: int = 1) -> float:
    """The best overlap on two devices of equal work: fill and drain (one stage of ``1 / chunks`` of
    a device's share per pass) on one thread, the rest on two threads that run ``ceiling`` times one.
    The fused step has the same bound with equal stages (schedule.fused_step_span): it gains where
    the stages are unequal per pass."""
    return micro_batches / (1 / chunks + (micro_batches - 1 / chunks) / ceiling)


def _breakdown(seq_timeline, pipe_timeline, chunks: int = 1) -> dict:
    """Where the pipelined step's time goes, from the timelines of a sequential and a pipelined step."""
    def busy(tl, phase=None, worker=None):
        return sum(e.duration for e in tl if phase in (None, e.phase) and worker in (None, e.worker))

    def span(tl, phase=None):
        ev = [e for e in tl if phase in (None, e.phase)]
        return max(e.end for e in ev) - min(e.start for e in ev)

    delays = handoff_delays(pipe_timeline)
    # the two devices' time over the passes (over the whole step where it is one sweep)
    stage_time = 2 * (span(pipe_timeline) if fused(pipe_timeline) else
                      sum(span(pipe_timeline, ph) for ph in ("forward", "backward")))
    micro = len({e.micro_batch for e in pipe_timeline})
    return {
        "bubble_formula": round(bubble_fraction(2, micro, chunks), 3),
        "bubble_replayed": round(measured_bubble(replay(pipe_timeline)), 3),
        "bubble_measured": round(measured_bubble(pipe_timeline), 3),
        "handoff_ms": round(statistics.median(delays) * 1e3, 3),
        "handoff_share": round(sum(delays) / stage_time, 4),
        "busy_inflation": round(busy(pipe_timeline) / busy(seq_timeline), 3),
        # each device's forward and backward, sequential (a device: a stage, or its interleaved stages)
        "stage_ms": {ph: [round(busy(seq_timeline, ph, w) * 1e3, 1) for w in (0, 1)] for ph in ("forward", "backward")},
    }


def _matmul_pair(sequential: bool, n: int = 300):
    """Two equal loops of 256x256 matmuls (about 0.15 s each on one core), in turn or in two threads."""
    a = torch.randn(256, 256)

    def work() -> None:
        for _ in range(n):
            a @ a

    return _pair(work, work, sequential)


def _stage_pair(split, x, split_size: int, sequential: bool):
    """Stage 0's and stage 1's forward + backward of every micro-batch, with no dependency between
    them (stage 1 starts from stored inputs), in turn or in two threads: the model's own ceiling."""
    stages = list(split.stages)
    micro = list(x.split(split_size))
    with torch.no_grad():
        inputs = [micro, [stages[0](m) for m in micro]]  # what each stage gets, computed once

    def work(s: int):
        def run() -> None:
            for h in inputs[s]:
                out = stages[s](h.detach().requires_grad_(s > 0))
                out.backward(torch.ones_like(out))  # into .grad: every timed step zeroes them first
        return run

    return _pair(work(0), work(1), sequential)


def _pair(first, second, sequential: bool):
    def run() -> None:
        if sequential:
            first()
            second()
            return
        threads = [threading.Thread(target=fn) for fn in (first, second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    return run


def _keep_freed_memory() -> bool:
    """glibc's malloc hands blocks above a (dynamic) threshold back to the kernel when freed, so the
    next micro-batch's activations page-fault in again, in every stage thread, under one lock on the
    process's memory map. mallopt: no mmap below 32 MiB (glibc's maximum) and no trimming. PyTorch's
    performance tuning guide makes the same point for CPUs by recommending jemalloc or tcmalloc.
    Returns whether it took effect (False off glibc)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from <malloc.h>
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _step(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return lambda: train_step(model, x, y, opt)


def _fused_step(pipe, x, y):
    """train_step's work, with forward, loss and backward in one call (``forward_backward``)."""
    opt = torch.optim.SGD(pipe.parameters(), lr=0.01)

    def run() -> float:
        opt.zero_grad(set_to_none=True)
        loss = pipe.forward_backward(x, y)
        opt.step()
        return loss

    return run


if __name__ == "__main__":
    main()
