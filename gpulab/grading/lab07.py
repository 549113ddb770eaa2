"""Checks for lab 07's graded cells: does a student's pipeline overlap its stages, and how much
faster than the same micro-batches run one after the other is it?

The student writes ``pipelined_forward(stages, devices, x, split_size)`` (inference; autograd
back-propagates through it in one thread), then ``pipelined_train_step(stages, devices, inputs,
targets, split_size, loss_fn, timeline=None)``: GPipe's forward *and* backward, one thread per
stage. For the forward, two things are checked:

- :func:`check_stages_overlap` (deterministic, no clock): two stages that can only finish if
  stage 0 works on micro-batch 1 *while* stage 1 works on micro-batch 0 (they meet at a
  ``threading.Barrier``). A pipeline passes on any machine, however loaded; code that runs the
  stages one after the other never does.
- :func:`check_overlap_speedup` (the clock): the student's pipeline, gpulab's reference
  :class:`~gpulab.parallel.PipelinedModel` and the same micro-batches run sequentially, timed
  interleaved with one intra-op thread each. It passes at ``at_least`` (1.3x). Overlap needs a
  free second core, and on a machine where another program holds it no pipeline can reach 1.3x:
  so ``0.85 x`` the reference's speedup in the same measurement passes too, and the result says
  which bar was met and how many cores each run had.
  Up to ``attempts`` measurements are made before failing, since load comes and goes.

For the training step, the same two things, in both passes:

- :func:`check_train_step_overlap`: the forward barrier above, and a backward one that stage 0
  can only pass while back-propagating micro-batch a *while* stage 1 back-propagates micro-batch b
  (the gradients and the loss are checked too); :func:`check_train_step_schedule` reads the
  student's timeline: every micro-batch forward and backward on every stage, each hand-off after
  the work that feeds it, and each stage's backward after its forward pass (GPipe's flush);
- :func:`check_train_step_speedup`: the same measurement as the forward's, for training steps.

Each call of the student's code runs in a helper thread with a time limit, so a pipeline whose
stage thread waits forever for a micro-batch fails the check instead of hanging the notebook.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.grading import GradingError
from gpulab.grading.speedup import SpeedupMeasurement, check_speedup
from gpulab.parallel.pipeline import (
    PipelinedModel,
    bubble_fraction,
    gpipe_train_step,
    measured_bubble,
)
from gpulab.parallel.pipeline.split import SplitModel, split_model
from gpulab.parallel.pipeline.streams import forward_streams
from gpulab.parallel.pipeline.threads import StageThreads
from gpulab.parallel.pipeline.timing import intra_op_threads, time_interleaved

__all__ = ["run_with_timeout", "check_stages_overlap", "check_overlap_speedup", "OverlapResult",
           "check_train_step_overlap", "check_train_step_schedule", "check_train_step_speedup", "REFERENCES"]

# gpulab's reference implementations of lab 07's exercises (the ``forbidden`` of check_not_calling):
# the pipeline's schedule classes are listed too, so that calling into them is caught as well
REFERENCES: tuple = (split_model, SplitModel, PipelinedModel, StageThreads, forward_streams, gpipe_train_step,
                     bubble_fraction, measured_bubble)

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
    """The figures behind :func:`check_overlap_speedup` and :func:`check_train_step_speedup`."""

    yours: float  # sequential time / your pipelined time
    reference: float  # sequential time / gpulab's pipelined time, same measurement
    cores_yours: float  # cores your pipelined run had (CPU seconds / wall seconds)
    cores_reference: float
    attempts: int
    against_reference: bool  # passed relative to the reference, not at the target
    mode: str

    def __str__(self) -> str:
        how = "relative to the reference measured in the same run (this machine held the pipelines back)" \
            if self.against_reference else "against the target"
        return (f"overlap speedup: yours {self.yours:.2f}x ({self.cores_yours:.2f} cores), reference "
                f"{self.reference:.2f}x ({self.cores_reference:.2f} cores), after {self.attempts} "
                f"measurement(s); passed {how}. Mode: {self.mode}")


def _same_run_speedup(variants: dict[str, Callable[[], Any]], mode: str, what: str, *, at_least: float,
                      repeats: int, attempts: int, relative: float) -> OverlapResult:
    """Time ``variants`` ("sequential", "yours", "reference") interleaved until yours passes.

    Yours passes at ``at_least`` x the sequential run, or at ``relative`` x gpulab's pipeline in the
    same measurement, whatever the cores: a machine that holds every pipeline back (another program on
    the second core, a VM whose two vCPUs are not two free cores) caps the reference too, and a correct
    pipeline within noise of it must not fail. (CI once measured the reference at 1.37x on 1.45 cores
    and a correct solution at 1.29x.) That the stages overlap at all is checked without a clock. The
    rule is :func:`gpulab.grading.speedup.check_speedup`'s, with no floor on the cores.
    """
    def measure() -> SpeedupMeasurement:
        t = time_interleaved(variants, repeats=repeats, warmup=1)
        return SpeedupMeasurement(t.speedup("sequential", "yours"), t.speedup("sequential", "reference"),
                                  t.cores("reference"), detail=f"yours on {t.cores('yours'):.2f} cores",
                                  times={"yours_cores": t.cores("yours")})

    result = check_speedup(
        measure, at_least=at_least, relative=relative, min_cores=math.inf, attempts=attempts,
        what=f"{what}: overlap speedup (over the same micro-batches run one after the other)",
        hint="keep the Python work per micro-batch small (no per-micro-batch thread start, no copies to the CPU, "
             "no prints, no lock held while a stage computes) and start every stage thread before waiting for "
             f"any result. Mode: {mode}")
    m = result.passed
    return OverlapResult(m.yours, m.reference, m.times["yours_cores"], m.cores, len(result.tried),
                         result.against_reference, mode)


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
        return _same_run_speedup(variants, reference.mode, "pipelined_forward", at_least=at_least, repeats=repeats,
                                 attempts=attempts, relative=relative)


# --- the training step: forward and backward --------------------------------------------------

TrainStep = Callable[..., float]  # (stages, devices, inputs, targets, split_size, loss_fn, timeline=None)


class _WaitInBackward(torch.autograd.Function):
    """Identity whose backward waits at its module's backward barrier on the chosen call."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, meet: "_MeetBoth") -> torch.Tensor:
        ctx.meet = meet
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        meet = ctx.meet
        if meet.backward_calls == meet.at_backward:
            meet.backward_barrier.wait()
        meet.backward_calls += 1
        return grad, None


class _MeetBoth(_Meet):
    """``x * weight`` (weight 1) that waits at a forward barrier on its ``at_call``-th forward and at
    a backward barrier on its ``at_backward``-th backward (0-based, in the order they happen)."""

    def __init__(self, barrier: threading.Barrier, at_call: int, backward_barrier: threading.Barrier,
                 at_backward: int) -> None:
        super().__init__(barrier, at_call)
        self.weight = nn.Parameter(torch.ones(()))
        self.backward_barrier, self.at_backward, self.backward_calls = backward_barrier, at_backward, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _WaitInBackward.apply(super().forward(x) * self.weight, self)


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (out - target).square().mean()


def check_train_step_overlap(train_step: TrainStep, devices: Sequence[LogicalDevice], timeout_s: float = 5.0) -> None:
    """Fail unless stage 0 and stage 1 of ``train_step`` work at the same time, forward and backward,
    and the step returns the batch's loss and accumulates the whole batch's gradients.

    Forward: stage 0's second micro-batch meets stage 1's first. Backward: stage 0's first backward
    meets stage 1's second, whatever order the micro-batches come back in. Back-propagating
    everything in one thread never meets.

    Raises:
        GradingError: with a message for the student.
    """
    forward, backward = threading.Barrier(2, timeout=timeout_s), threading.Barrier(2, timeout=timeout_s)
    split = split_model(nn.Sequential(_MeetBoth(forward, 1, backward, 0), _MeetBoth(forward, 0, backward, 1)),
                        list(devices)[:2])
    x, y = torch.arange(4.0).unsqueeze(1), torch.zeros(4, 1)  # 4 micro-batches of one row
    try:
        loss = run_with_timeout(train_step, list(split.stages), split.devices, x, y, 1, _mse,
                                timeout_s=4 * timeout_s + 5, what="pipelined_train_step", grad=True)
    except threading.BrokenBarrierError:
        if forward.broken:
            raise GradingError(
                "pipelined_train_step, forward: stage 0 never worked on micro-batch 1 while stage 1 worked on "
                "micro-batch 0, so the stages ran one after the other.\n  Hint: one thread per stage, and hand "
                "each micro-batch on (a queue) as soon as it is done") from None
        raise GradingError(
            "pipelined_train_step, backward: stage 0 never back-propagated a micro-batch while stage 1 back-"
            "propagated the next one, so backward ran one stage after the other (one .backward() over the "
            "whole graph runs every stage's backward in the calling thread).\n  Hint: cut the graph at each "
            "stage (the next stage gets a detached leaf), and let each stage thread call "
            "torch.autograd.backward(its output, the gradient of its output) and hand its input's .grad "
            "to the stage before") from None
    # loss = mean(x^2) = 3.5 with both weights 1; d loss / d weight = mean(2 x^2) = 7 for each
    if not isinstance(loss, (float, int, torch.Tensor)) or abs(float(loss) - 3.5) > 1e-5:
        raise GradingError(f"pipelined_train_step must return the batch's loss as a float: expected 3.5 for "
                           f"x = {x.flatten().tolist()}, target 0 and mean squared error, got {loss!r}.\n  Hint: "
                           "weight each micro-batch's loss by its rows / the batch's rows, and add them up")
    grads = [None if s[0].weight.grad is None else round(s[0].weight.grad.item(), 4) for s in split.stages]
    if grads != [7.0, 7.0]:
        raise GradingError(f"pipelined_train_step: the gradients of the two stages' weights must be those of the "
                           f"whole batch, [7.0, 7.0], got {grads}.\n  Hint: every micro-batch goes backward "
                           "through every stage, each micro-batch's loss weighted by its share of the rows")


def check_train_step_schedule(timeline: Sequence[Any], num_stages: int, num_micro_batches: int) -> None:
    """Fail unless ``timeline`` (the student's StageEvents of one step) is a GPipe schedule.

    Every (stage, micro-batch) has one forward and one backward event; in forward, stage s + 1
    starts micro-batch j after stage s ended it, in backward stage s starts it after stage s + 1
    ended it; and each stage starts its backward pass after its last forward (fill, drain, flush).

    Raises:
        GradingError: naming the first event out of place.
    """
    hint = ("append StageEvent(stage, micro_batch, phase, start, end) for each piece of work: start once its "
            "input is in hand (after the queue's get), end when the work is done and before its result is put "
            "in the next queue")
    try:
        events = [(str(e.phase), int(e.stage), int(e.micro_batch), float(e.start), float(e.end)) for e in timeline]
    except (AttributeError, TypeError, ValueError):
        raise GradingError(f"the timeline must hold StageEvents; got {list(timeline)[:3]!r} ...\n  Hint: {hint}") from None
    at = {(ph, s, j): (start, end) for ph, s, j, start, end in events}
    expected = {(ph, s, j) for ph in ("forward", "backward") for s in range(num_stages) for j in range(num_micro_batches)}
    if len(events) != len(expected) or set(at) != expected:
        missing, extra = sorted(expected - set(at)), sorted(set(at) - expected)
        raise GradingError(f"the timeline should have one forward and one backward event per stage and micro-batch "
                           f"({len(expected)} in all), got {len(events)}; missing {missing[:4]}, unexpected "
                           f"{extra[:4]}.\n  Hint: {hint}")
    for s in range(num_stages):
        last_forward = max(at["forward", s, j][1] for j in range(num_micro_batches))
        for j in range(num_micro_batches):
            if s and at["forward", s, j][0] < at["forward", s - 1, j][1]:
                raise GradingError(f"forward: stage {s} started micro-batch {j} before stage {s - 1} finished it."
                                   f"\n  Hint: {hint}")
            if s + 1 < num_stages and at["backward", s, j][0] < at["backward", s + 1, j][1]:
                raise GradingError(f"backward: stage {s} started micro-batch {j} before stage {s + 1} finished it."
                                   f"\n  Hint: {hint}")
            if at["backward", s, j][0] < last_forward:
                raise GradingError(f"stage {s} started the backward of micro-batch {j} before its last forward "
                                   "ended: GPipe runs every micro-batch forward, then every one backward")


def check_train_step_speedup(train_step: TrainStep, split: SplitModel, inputs: torch.Tensor, targets: torch.Tensor,
                             split_size: int, *, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] =
                             nn.functional.cross_entropy, at_least: float = 1.25, repeats: int = 5, attempts: int = 3,
                             relative: float = 0.85) -> OverlapResult:
    """Time the student's training step against the same micro-batches run sequentially, forward and
    backward (each variant zeroes the gradients first; no optimizer step), beside gpulab's pipeline.

    Returns:
        The :class:`OverlapResult` of the measurement that passed.

    Raises:
        GradingError: if no measurement passed (the message gives the figures).
    """
    stages, devices = list(split.stages), split.devices
    sequential, reference = PipelinedModel(split, split_size, overlap=False), PipelinedModel(split, split_size)

    def gpulab_step(pipe: PipelinedModel) -> None:
        split.zero_grad(set_to_none=True)
        loss_fn(pipe(inputs), targets).backward()

    def yours() -> None:
        split.zero_grad(set_to_none=True)
        run_with_timeout(train_step, stages, devices, inputs, targets, split_size, loss_fn,
                         what="pipelined_train_step", grad=True)

    with torch.enable_grad(), intra_op_threads(1):
        yours()  # once first: a stub or a crash fails here, before anything is timed
        variants = {"sequential": lambda: gpulab_step(sequential), "yours": yours,
                    "reference": lambda: gpulab_step(reference)}
        result = _same_run_speedup(variants, reference.mode, "pipelined_train_step", at_least=at_least,
                                   repeats=repeats, attempts=attempts, relative=relative)
    split.zero_grad(set_to_none=True)
    return result
