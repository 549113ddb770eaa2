"""Checks for lab 07's graded cells: does a student's pipeline overlap its stages, and how much
faster than the same micro-batches run one after the other is it?

The student writes ``pipelined_forward(stages, devices, x, split_size)``. Two things are checked:

- :func:`check_stages_overlap` (deterministic, no clock): two stages that can only finish if
  stage 0 works on micro-batch 1 *while* stage 1 works on micro-batch 0 (they meet at a
  ``threading.Barrier``). A pipeline passes on any machine, however loaded; code that runs the
  stages one after the other never does.
- :func:`check_overlap_speedup` (the clock): the student's pipeline, gpulab's reference
  :class:`~gpulab.parallel.PipelinedModel` and the same micro-batches run sequentially, timed
  interleaved with one intra-op thread each. It passes at ``at_least`` (1.3x). Overlap needs a
  free second core, and on a machine where another program holds it no pipeline can reach 1.3x:
  when the reference had fewer than 1.6 cores in the same measurement, the check says so and
  asks for at least ``0.85 x`` the reference's speedup instead.
  Up to ``attempts`` measurements are made before failing, since load comes and goes.

Each call of the student's code runs in a helper thread with a time limit, so a pipeline whose
stage thread waits forever for a micro-batch fails the check instead of hanging the notebook.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.grading import GradingError
from gpulab.parallel.pipeline import (
    PipelinedModel,
    bubble_fraction,
    measured_bubble,
)
from gpulab.parallel.pipeline.split import SplitModel, split_model
from gpulab.parallel.pipeline.streams import forward_streams
from gpulab.parallel.pipeline.threads import StageThreads
from gpulab.parallel.pipeline.timing import intra_op_threads, time_interleaved

__all__ = ["run_with_timeout", "check_stages_overlap", "check_overlap_speedup", "OverlapResult", "REFERENCES"]

# gpulab's reference implementations of lab 07's exercises (the ``forbidden`` of check_not_calling):
# the pipeline's schedule classes are listed too, so that calling into them is caught as well
REFERENCES: tuple = (split_model, SplitModel, PipelinedModel, StageThreads, forward_streams, bubble_fraction, measured_bubble)

PipelinedForward = Callable[[Sequence[nn.Module], Sequence[LogicalDevice], torch.Tensor, int], torch.Tensor]


def run_with_timeout(fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0, what: str = "your function",
                     grad: bool | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a helper thread; its result, its exception, or a GradingError
    after ``timeout_s`` seconds. ``grad`` sets grad mode in the thread (default: the caller's)."""
    grad = torch.is_grad_enabled() if grad is None else grad
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            with torch.set_grad_enabled(grad):
                box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="gpulab-grading", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise GradingError(f"{what} did not return within {timeout_s:.0f} s. Hint: a stage thread may wait for a "
                           "micro-batch that never comes; when a stage fails, pass the exception on (through the "
                           "queue) so that the next stage and the caller stop too, and join every thread")
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Meet(nn.Module):
    """Identity that waits at a barrier on its ``at_call``-th call (0-based)."""

    def __init__(self, barrier: threading.Barrier, at_call: int) -> None:
        super().__init__()
        self.barrier, self.at_call, self.calls = barrier, at_call, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.calls == self.at_call:
            self.barrier.wait()
        self.calls += 1
        return x + 0.0


def check_stages_overlap(pipelined_forward: PipelinedForward, devices: Sequence[LogicalDevice],
                         timeout_s: float = 5.0) -> None:
    """Fail unless stage 0 and stage 1 of ``pipelined_forward`` work at the same time.

    Raises:
        GradingError: with a message for the student.
    """
    barrier = threading.Barrier(2, timeout=timeout_s)
    split = split_model(nn.Sequential(_Meet(barrier, 1), _Meet(barrier, 0)), list(devices)[:2])
    x = torch.arange(4.0).unsqueeze(1)
    try:
        out = run_with_timeout(pipelined_forward, list(split.stages), split.devices, x, 1,
                               timeout_s=4 * timeout_s + 5, what="pipelined_forward")
    except threading.BrokenBarrierError:
        raise GradingError(
            "pipelined_forward: stage 0 never worked on micro-batch 1 while stage 1 worked on micro-batch 0, "
            "so the stages ran one after the other.\n  Hint: run each stage in its own thread, and hand each "
            "micro-batch to the next stage as soon as it is done (a queue per stage)") from None
    if not isinstance(out, torch.Tensor) or out.shape != x.shape or not torch.equal(out.detach().cpu(), x):
        raise GradingError(f"pipelined_forward: with identity stages the output must equal the input {x.tolist()}, "
                           f"got {out if not isinstance(out, torch.Tensor) else out.tolist()}")


@dataclass
class OverlapResult:
    """The figures behind :func:`check_overlap_speedup`."""

    yours: float  # sequential time / your pipelined time
    reference: float  # sequential time / gpulab's pipelined time, same measurement
    cores_yours: float  # cores your pipelined run had (CPU seconds / wall seconds)
    cores_reference: float
    attempts: int
    against_reference: bool  # passed relative to the reference (the machine could not show 1.3x)
    mode: str

    def __str__(self) -> str:
        how = "relative to the reference (this machine did not give the pipeline two free cores)" \
            if self.against_reference else "against the target"
        return (f"overlap speedup: yours {self.yours:.2f}x ({self.cores_yours:.2f} cores), reference "
                f"{self.reference:.2f}x ({self.cores_reference:.2f} cores), after {self.attempts} "
                f"measurement(s); passed {how}. Mode: {self.mode}")


def check_overlap_speedup(pipelined_forward: PipelinedForward, split: SplitModel, x: torch.Tensor, split_size: int,
                          *, at_least: float = 1.3, repeats: int = 7, attempts: int = 3,
                          relative: float = 0.85) -> OverlapResult:
    """Time the student's pipeline against the same micro-batches run sequentially (no grad).

    Returns:
        The :class:`OverlapResult` of the measurement that passed.

    Raises:
        GradingError: if no measurement passed (the message gives the figures).
    """
    stages, devices = list(split.stages), split.devices
    sequential, reference = PipelinedModel(split, split_size, overlap=False), PipelinedModel(split, split_size)
    with torch.no_grad(), intra_op_threads(1):
        # once first: a stub or a crash fails here, before anything is timed
        run_with_timeout(pipelined_forward, stages, devices, x, split_size, what="pipelined_forward", grad=False)
        variants = {
            "sequential": lambda: sequential(x),
            "yours": lambda: run_with_timeout(pipelined_forward, stages, devices, x, split_size,
                                              what="pipelined_forward", grad=False),
            "reference": lambda: reference(x),
        }
        mode, tried = reference.mode, []
        for attempt in range(1, attempts + 1):
            t = time_interleaved(variants, repeats=repeats, warmup=1)
            res = OverlapResult(t.speedup("sequential", "yours"), t.speedup("sequential", "reference"),
                                t.cores("yours"), t.cores("reference"), attempt, False, mode)
            tried.append(res)
            if res.yours >= at_least:
                return res
            # Fewer than 1.6 cores for the reference: this machine cannot show full overlap, so the
            # fair bar is the reference's own speedup in the same measurement (even when that one
            # scraped past at_least: a correct pipeline 0.94x of it must not fail on the noise).
            if res.cores_reference < 1.6 and res.yours >= relative * res.reference:
                res.against_reference = True
                return res
    figures = "; ".join(f"yours {r.yours:.2f}x vs reference {r.reference:.2f}x ({r.cores_reference:.2f} cores)"
                        for r in tried)
    raise GradingError(f"overlap speedup: needs at least {at_least:.2f}x over the same micro-batches run one after "
                       f"the other (or {relative:.2f} x the reference's when the machine holds it back); measured "
                       f"{figures}. Mode: {mode}.\n  Hint: keep the Python work per micro-batch small (no "
                       "per-micro-batch thread start, no copies to the CPU, no prints) and start every stage "
                       "thread before waiting for any result")
