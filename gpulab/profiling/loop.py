"""``profile_loop``: where does each training step's time go? Data wait, copy, sync, compute.

Run the bundled demo from a shell (``python -m gpulab profile --help`` lists the knobs)::

    python -m gpulab profile                      # a data-bound loop: num_workers=0
    python -m gpulab profile --workers 2          # the same loop with two workers
    python -m gpulab profile --sync               # a .item() every step

How the step function relates to the device (the contract students rely on):

1. ``profile_loop`` takes each batch from ``loader`` (host time: **data wait**), moves it to the
   accelerator with ``accel.copy`` (**copy**; on a GPU ``tensor.to(device, non_blocking=...)``),
   then calls ``step_fn(batch)`` with the batch already on the device.
2. ``step_fn`` queues the device work and returns. On a GPU that is any torch code on the device;
   on every machine ``accel.compute(seconds, inputs)`` queues a known amount of device work (see
   :mod:`gpulab.accel`). Anything in ``step_fn`` that waits for the device (``loss.item()``,
   ``print(loss)``, a blocking copy) is a **sync**; the rest of its host time is **host**.
3. The device's busy intervals come from CUDA events (GPU), from the simulated accelerator's exact
   bookkeeping (CPU-only machines), or from the host clock (``device="cpu"``: the host *is* the
   device, nothing overlaps).

Every phase is also a ``torch.profiler.record_function`` range (``gpulab/data_wait``, ``gpulab/copy``,
``gpulab/compute``), so a torch.profiler trace of the loop shows them; ``trace=`` records one (see
:mod:`gpulab.profiling.torch_trace`)::

    python -m gpulab profile --trace loop.json    # then open loop.json in https://ui.perfetto.dev

The host phases are shares of the wall time (they sum to at most 1); ``busy_fraction`` is the
device's share. A data-bound loop shows a large ``data`` share with an idle device; a sync-bound
loop a large ``sync`` share; a compute-bound loop a busy device. The sentence in ``verdict`` is
derived from those numbers and from the loader's ``num_workers`` and ``os.cpu_count()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from time import perf_counter
from typing import Any, Callable, Iterable

import numpy as np
from tqdm.auto import tqdm

from gpulab.accel import Accelerator, StepMarks, as_accelerator
from gpulab.devices.batches import tree_tensors
from gpulab.profiling.result import LoopProfile
from gpulab.profiling.torch_trace import COMPUTE, COPY, DATA_WAIT, NoTrace, TorchTrace, label
from gpulab.profiling.workloads import demo_loader, demo_step

__all__ = ["profile_loop", "LoopProfile", "main"]


def _loader_workers(loader: Any) -> int | None:
    """``num_workers`` of a DataLoader, or of a DataLoader wrapped in ``.loader`` (echo, cache)."""
    for obj in (loader, getattr(loader, "loader", None)):
        n = getattr(obj, "num_workers", None)
        if isinstance(n, int):
            return n
    return None


def _batch_size(batch: Any) -> int | None:
    """Rows in the batch's first tensor, or None (no tensor, or a 0-d one)."""
    tensors = tree_tensors(batch)
    return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else None


def _check_steps(loader: Iterable, num_steps: int | None) -> int:
    try:
        length = len(loader)  # type: ignore[arg-type]
    except TypeError:
        length = None
    if num_steps is None:
        if length is None:
            raise ValueError("this loader has no len(); pass num_steps= (how many batches to profile)")
        return length
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    if length is not None and num_steps > length:
        raise ValueError(f"num_steps={num_steps} but the loader gives only {length} batches per pass; "
                         f"use num_steps<={length}, or epochs= to profile several passes")
    return num_steps


def profile_loop(
    loader: Iterable,
    step_fn: Callable[[Any], Any],
    device: Accelerator | Any = None,
    num_steps: int | None = None,
    *,
    epochs: int = 1,
    non_blocking: bool = False,
    warmup_steps: int | None = None,
    disable: bool = False,
    desc: str = "profile_loop",
    trace: TorchTrace | str | os.PathLike | None = None,
) -> LoopProfile:
    """Run ``step_fn`` on ``num_steps`` batches per epoch and split every step into phases.

    Args:
        loader: any iterable of batches (a DataLoader, a generator, a list); re-iterated each epoch.
        step_fn: called as ``step_fn(batch)`` with the batch already on the device; it queues the
            device work and returns (see the module docstring for the contract).
        device: the accelerator ``step_fn`` uses (:func:`gpulab.accel.pick_accelerator`), a
            ``SimulatedAccelerator``, a ``torch.device`` / string, or None for ``"auto"``.
        num_steps: batches per epoch (default: ``len(loader)``).
        epochs: passes over the loader; each pass calls ``iter(loader)`` again, so DataLoader
            workers start again unless ``persistent_workers=True``.
        non_blocking: passed to the host-to-device copy (it only overlaps from pinned memory).
        warmup_steps: leading steps left out of the figures; the device is drained after them, so
            the window starts with an empty queue (a host that ran ahead leaves no backlog in it).
            Default: 0, or the trace's ``skip`` (``wait + warmup``) when ``trace`` is given, so
            both instruments measure the same steps when ``num_steps * epochs`` equals
            ``trace.steps_needed``.
        disable: turn the progress bar off.
        desc: the progress bar's label.
        trace: also record the loop with torch.profiler: a :class:`~gpulab.profiling.torch_trace.TorchTrace`
            (read it afterwards: ``trace.key_averages()``), or a file path for a trace with the
            default schedule (wait 1, warmup 1, active 3). CUDA activities are recorded on a GPU.

    Returns:
        A :class:`LoopProfile`.

    Raises:
        ValueError: for a bad ``num_steps``/``epochs``, a loader that runs out early, or a trace
            whose schedule needs more steps than the loop runs.
        FileNotFoundError, PermissionError: the trace's folder is missing or not writable (checked
            before the loop starts).
        Exception: whatever ``step_fn`` or the loader raised, with a note giving the step number.
    """
    accel = as_accelerator(device)
    num_steps = _check_steps(loader, num_steps)
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    total = num_steps * epochs
    tracer = NoTrace() if trace is None else trace if isinstance(trace, TorchTrace) else TorchTrace(trace)
    if tracer.steps_needed > total:
        raise ValueError(f"the trace's schedule needs {tracer.steps_needed} steps (wait {tracer.wait} + warmup "
                         f"{tracer.warmup} + active {tracer.active}) but the loop runs {total}; "
                         f"pass num_steps>={tracer.steps_needed} or a smaller active=")
    if warmup_steps is None:
        warmup_steps = tracer.skip
    if not isinstance(warmup_steps, int) or not 0 <= warmup_steps < total:
        raise ValueError(f"warmup_steps must be in [0, {total}), got {warmup_steps!r}")

    steps: list[StepMarks] = []
    batch_size = None
    accel.begin()
    bar = tqdm(total=total, desc=desc, disable=disable, leave=False)
    try:
        with tracer.session(accel.kind) as session:  # torch.profiler, or nothing
            for epoch in range(epochs):
                it = iter(loader)
                for i in range(num_steps):
                    step = epoch * num_steps + i
                    marks, batch = _one_step(it, step_fn, accel, non_blocking, step, epoch, i, num_steps)
                    steps.append(marks)
                    if step + 1 == warmup_steps:
                        accel.synchronize()  # the window starts with an empty queue, not the warm-up's backlog
                    if batch_size is None:
                        batch_size = _batch_size(batch)
                    if step + 1 < total:
                        session.step()  # the profiler's schedule counts steps here (ProfilerStep#<step>)
                    bar.update(1)
            accel.synchronize()
            t_end = perf_counter()
            # the last step's end, after the window closed: when the trace's active steps end here,
            # stopping the profiler and writing the file stay out of profile_loop's figures
            session.step()
    finally:
        bar.close()
    return _build(steps[warmup_steps:], t_end, accel, loader, batch_size, epochs)


def _one_step(it: Any, step_fn: Callable[[Any], Any], accel: Accelerator, non_blocking: bool,
              step: int, epoch: int, i: int, num_steps: int) -> tuple[StepMarks, Any]:
    """One step's three phases (data wait, copy, compute), each a torch.profiler range, and its marks."""
    requested = perf_counter()
    try:
        with label(DATA_WAIT):
            batch = next(it)
    except StopIteration:
        raise ValueError(f"the loader stopped after {i} batches but num_steps={num_steps}; "
                         f"pass num_steps<={i}") from None
    except Exception as err:
        err.add_note(f"profile_loop: the loader raised while fetching batch {i} (step {step}, epoch {epoch})")
        raise
    received = perf_counter()
    with label(COPY):
        copy_start = accel.record()
        batch = accel.copy(batch, non_blocking=non_blocking)
        copy_end = accel.record()
    copied = perf_counter()
    waited_before = accel.waited()
    try:
        with label(COMPUTE):
            step_fn(batch)
    except Exception as err:
        err.add_note(f"profile_loop: step_fn raised at step {step} (epoch {epoch}, batch {i})")
        raise
    step_end = accel.record()
    returned = perf_counter()
    return StepMarks(requested, received, copied, returned, waited_before, accel.waited(),
                     copy_start, copy_end, step_end), batch


def _build(steps: list[StepMarks], t_end: float, accel: Accelerator, loader: Any, batch_size: int | None,
           epochs: int) -> LoopProfile:
    """Split each step's wall time into phases; times become relative to the window's start."""
    t_start = steps[0].requested
    host_times = np.array([(m.requested, m.received, m.copied, m.returned) for m in steps]) - t_start  # (n, 4)
    # a step lasts from its batch request to the next one's (the last one: to the final drain)
    step_s = np.diff(np.append(host_times[:, 0], t_end - t_start))
    data_s, copy_s, sync_s, host_s, compute_s = (np.zeros(len(steps)) for _ in range(5))
    for k, m in enumerate(steps):
        data_s[k] = m.data_wait
        copy_s[k] = accel.copy_seconds(m)
        queue_wait = m.copy_host - copy_s[k]  # a blocking copy first waits for the queued work
        sync_s[k] = queue_wait + accel.step_wait(m)
        host_s[k] = accel.host_work(m)
        compute_s[k] = accel.busy_between(m.copy_end, m.step_end)
    return LoopProfile(
        mode=accel.kind, device=accel.name, step_s=step_s, data_s=data_s, copy_s=copy_s, sync_s=sync_s,
        host_s=host_s, compute_s=compute_s, host_times=host_times,
        device_intervals=accel.busy_intervals(steps, t_start, t_end), wall_s=float(t_end - t_start),
        num_workers=_loader_workers(loader), batch_size=batch_size, epochs=epochs)


def main(argv: list[str] | None = None) -> int:
    """``python -m gpulab profile``: profile the bundled demo loop and print the breakdown."""
    p = argparse.ArgumentParser(prog="python -m gpulab profile", description=main.__doc__)
    p.add_argument("--steps", type=int, default=30, help="batches to profile (default 30)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sample-ms", type=float, default=2.0, help="CPU cost of preparing one sample (ms)")
    p.add_argument("--compute-ms", type=float, default=12.0, help="device work per step (ms)")
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--sync", action="store_true", help="call loss.item() every step (a host-device sync)")
    p.add_argument("--device", default="auto", help="auto | sim | cpu | cuda | cuda:i")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--plot", metavar="PNG", help="save the timeline plot to this file")
    p.add_argument("--trace", metavar="FILE", help="also record the loop with torch.profiler and write a Chrome/Perfetto "
                                                   "trace (JSON) of every step after the first two to FILE")
    args = p.parse_args(argv)

    trace = None
    if args.trace:
        if args.steps < 3:
            p.error(f"--trace needs --steps >= 3 (1 skipped, 1 warm-up, then the recorded ones), got {args.steps}")
        try:  # checked before the loop runs: a bad path costs nothing
            trace = TorchTrace(args.trace, wait=1, warmup=1, active=args.steps - 2)
        except OSError as err:
            print(f"python -m gpulab profile: {err}", file=sys.stderr)
            return 2
    accel = as_accelerator(args.device)
    loader = demo_loader(num_batches=args.steps, batch_size=args.batch_size, sample_cost_s=args.sample_ms / 1e3,
                         num_workers=args.workers)
    step_fn = demo_step(accel, compute_s=args.compute_ms / 1e3, sync=args.sync)
    # a bar only where someone watches: redirected to a file, its \r redraws garble the output
    quiet = args.json or not sys.stderr.isatty()
    prof = profile_loop(loader, step_fn, accel, args.steps, disable=quiet, trace=trace)
    print(json.dumps(prof.to_dict()) if args.json else prof.summary())
    if args.plot:
        prof.plot().savefig(args.plot, dpi=100)
        if not args.json:
            print(f"plot saved to {args.plot}")
    if trace is not None and not args.json:
        device = ("CUDA kernels on the GPU's own rows" if trace.cuda else
                  "host rows only: the simulated device's work is a clock, not kernels" if accel.kind == "simulated"
                  else "host rows only")
        print(f"torch.profiler trace of steps {trace.skip}-{trace.steps_needed - 1} written to {trace.written} "
              f"({device}); open it in https://ui.perfetto.dev or chrome://tracing")
    return 0
