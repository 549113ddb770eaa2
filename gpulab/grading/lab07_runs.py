"""How lab 07's graders run the student's pipeline: with a time limit, at barriers, on a modelled clock.

- :func:`run_with_timeout`: each call of the student's code runs in a helper thread with a time
  limit, so a pipeline whose stage thread waits forever stops the test with :class:`StepTimeout`
  instead of hanging the notebook;
- **overlap, without a clock** (:func:`stages_overlap`, :func:`train_step_overlap`): two stages
  that can only finish if stage 0 works on micro-batch k + 1 *while* stage 1 works on micro-batch
  k (they meet at a ``threading.Barrier``), and for the training step a second barrier that stage 0
  can only pass while back-propagating a micro-batch while stage 1 back-propagates the next. A
  pipeline gets through on any machine, however loaded; code that runs the stages one after the
  other never does. The values sent: whether each barrier was met, and the outputs;
- **the pipeline's time, on a modelled clock** (:func:`sleeping_step_work`): a training step of two
  stages whose forward and backward each *wait* ``device_s`` per micro-batch (a sleep: the modelled
  device time of a stage, which a busy CPU does not stretch), for ``grading.check_measured`` with
  the rule ``measure.wall``. GPipe's schedule takes ``2 (M + S - 1) device_s``; the same micro-batches
  one after the other ``2 S M device_s``, and a pipelined forward with a one-thread backward
  ``(M + S - 1 + S M) device_s`` (:func:`sleeping_step_bounds`).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.grading.numerics import exact_float32
from gpulab.parallel.pipeline.split import split_model

__all__ = ["StepTimeout", "run_with_timeout", "OVERLAPPED", "stages_overlap", "train_step_overlap",
           "SLEEP_MICRO_BATCHES", "SLEEP_DEVICE_S", "sleeping_step_work", "sleeping_step_bounds"]

OVERLAPPED = "overlapped"
TrainStep = Callable[..., float]  # (stages, devices, inputs, targets, split_size, loss_fn, timeline=None)


class StepTimeout(TimeoutError):
    """The student's function did not return within its time limit."""


def run_with_timeout(fn: Callable[..., Any], *args: Any, timeout_s: float = 60.0, what: str = "your function",
                     grad: bool | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a helper thread: its result, its exception, or :class:`StepTimeout`
    after ``timeout_s`` seconds. ``grad`` sets grad mode in the thread (default: the caller's). The
    call computes in IEEE float32 (:func:`exact_float32`: no TF32 on a GPU), as the reference does."""
    grad = torch.is_grad_enabled() if grad is None else grad
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            with torch.set_grad_enabled(grad):
                box["value"] = fn(*args, **kwargs)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name="gpulab-grading", daemon=True)
    with exact_float32():
        thread.start()
        thread.join(timeout_s)
    if thread.is_alive():
        raise StepTimeout(f"{what} did not return within {timeout_s:.0f} s: a thread may be waiting for something "
                          "that never comes. When a stage fails, the other threads and the caller must stop too, and "
                          "the caller raises the stage's exception (see the exercise's Hint 1)")
    if "error" in box:
        raise box["error"]
    return box["value"]


# --- overlap, without a clock -------------------------------------------------------------------

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


def _check_meet(x: torch.Tensor, meet: int, what: str) -> None:
    if not 0 <= meet <= x.size(0) - 2:
        raise ValueError(f"{what}: meeting at micro-batch {meet} needs at least {meet + 2} rows, got {x.size(0)}")


def stages_overlap(pipelined_forward: Callable[..., torch.Tensor], devices: Sequence[LogicalDevice],
                   x: torch.Tensor, meet: int = 0, timeout_s: float = 5.0) -> dict[str, Any]:
    """Run ``pipelined_forward`` on two identity stages, one row per micro-batch, that can only get
    through if stage 0 works on micro-batch ``meet + 1`` while stage 1 works on micro-batch ``meet``.

    Returns:
        ``{"stages": "overlapped" or what went wrong, "output": the output (None if it did not
        get through)}``; a pipeline gives ``"overlapped"`` and ``x`` itself.

    Raises:
        StepTimeout: the call did not return (a stage thread waits forever); any exception of the
            student's code other than the broken barrier.
    """
    _check_meet(x, meet, "stages_overlap")
    barrier = threading.Barrier(2, timeout=timeout_s)
    split = split_model(nn.Sequential(_Meet(barrier, meet + 1), _Meet(barrier, meet)), list(devices)[:2])
    try:
        out = run_with_timeout(pipelined_forward, list(split.stages), split.devices, x, 1,
                               timeout_s=4 * timeout_s + 5, what="pipelined_forward")
    except Exception:
        if not barrier.broken:
            raise
        return {"stages": f"one after the other: stage 0 never worked on micro-batch {meet + 1} while stage 1 "
                          f"worked on micro-batch {meet}", "output": None}
    return {"stages": OVERLAPPED, "output": out}


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


def _as_loss(loss: Any) -> Any:
    """The returned loss as a number where it is one (a float, or a one-element tensor), else its repr."""
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach().cpu())
    return repr(loss)[:200]


def train_step_overlap(train_step: TrainStep, devices: Sequence[LogicalDevice], x: torch.Tensor,
                       forward_meet: int = 0, backward_meet: int = 0, timeout_s: float = 5.0) -> dict[str, Any]:
    """Run ``train_step`` on two stages ``x * w`` (``w`` = 1), one row per micro-batch, target 0 and
    mean squared error, that get through only if both passes overlap: forward, stage 0 works on
    micro-batch ``forward_meet + 1`` while stage 1 works on ``forward_meet``; backward, stage 0's
    ``backward_meet``-th backward runs while stage 1's next one does (whatever order the
    micro-batches come back in). Back-propagating everything in one thread never meets.

    Returns:
        ``{"forward": ..., "backward": ...}`` (``"overlapped"``, or what went wrong), the returned
        ``"loss"`` (``mean(x ** 2)`` for a correct step) and the two weights' ``"gradients"``.

    Raises:
        StepTimeout, or the student's own exception (other than a broken barrier).
    """
    _check_meet(x, max(forward_meet, backward_meet), "train_step_overlap")
    forward, backward = threading.Barrier(2, timeout=timeout_s), threading.Barrier(2, timeout=timeout_s)
    split = split_model(nn.Sequential(_MeetBoth(forward, forward_meet + 1, backward, backward_meet),
                                      _MeetBoth(forward, forward_meet, backward, backward_meet + 1)), list(devices)[:2])
    y = torch.zeros_like(x)
    facts: dict[str, Any] = {"forward": OVERLAPPED, "backward": OVERLAPPED}
    try:
        loss = run_with_timeout(train_step, list(split.stages), split.devices, x, y, 1, _mse,
                                timeout_s=4 * timeout_s + 5, what="pipelined_train_step", grad=True)
    except Exception:
        if forward.broken:
            facts["forward"] = (f"one after the other: stage 0 never worked on micro-batch {forward_meet + 1} "
                                f"while stage 1 worked on micro-batch {forward_meet}")
            facts["backward"] = "not reached"
        elif backward.broken:
            facts["backward"] = ("one after the other: stage 0 never back-propagated a micro-batch while stage 1 "
                                 "back-propagated the next one")
        else:
            raise
        loss = None
    facts["loss"] = None if loss is None else _as_loss(loss)
    facts["gradients"] = [None if s[0].weight.grad is None else float(s[0].weight.grad) for s in split.stages]
    return facts


# --- the pipeline's time, on a modelled clock ---------------------------------------------------

SLEEP_MICRO_BATCHES, SLEEP_DEVICE_S = 8, 0.025  # GPipe 0.45 s, forward only 0.625 s, one after the other 0.8 s


class _Wait(torch.autograd.Function):
    """Identity that waits ``seconds`` in forward and in backward: a stage's modelled device time."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, seconds: float) -> torch.Tensor:
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        time.sleep(ctx.seconds)
        return grad, None


class _Sleeping(nn.Module):
    """``x * w`` that takes ``seconds`` of modelled device time per micro-batch, in each pass."""

    def __init__(self, seconds: float, weight: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.weight = nn.Parameter(torch.tensor(float(weight)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _Wait.apply(x * self.weight, self.seconds)


def sleeping_step_bounds(num_stages: int = 2, micro_batches: int = SLEEP_MICRO_BATCHES,
                         device_s: float = SLEEP_DEVICE_S) -> dict[str, float]:
    """Seconds of modelled device time one step of :func:`sleeping_step_work` must wait for:
    ``"gpipe"`` (both passes pipelined: the floor), ``"forward only"`` (a pipelined forward, every
    backward in one thread) and ``"one after the other"``."""
    s, m = num_stages, micro_batches
    return {"gpipe": 2 * (m + s - 1) * device_s, "forward only": (m + s - 1 + s * m) * device_s,
            "one after the other": 2 * s * m * device_s}


def sleeping_step_work(train_step: TrainStep, devices: Sequence[LogicalDevice], *,
                       micro_batches: int = SLEEP_MICRO_BATCHES, device_s: float = SLEEP_DEVICE_S,
                       timeout_s: float = 60.0) -> Callable[[int], dict[str, Any]]:
    """One unit of measured work for ``grading.check_measured(rule="measure.wall")``: ``work(seed)``
    builds two :class:`_Sleeping` stages (weights drawn from ``seed``) on ``devices[:2]``, draws
    ``micro_batches`` rows and targets from ``seed`` and runs one ``train_step`` on them, one row per
    micro-batch, mean squared error (in a helper thread with a time limit).

    Returns:
        ``work(seed) -> {"loss": the returned loss, "gradients": the two weights' gradients}``: what
        the grader compares with the reference run's for the same seed (work skipped fails).
    """
    name = getattr(train_step, "__name__", "the training step")

    def work(seed: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(int(seed))
        w = (1 + torch.rand(2, generator=gen)).tolist()
        x = torch.randn(micro_batches, 4, generator=gen)  # (M, 4): one row per micro-batch
        y = torch.randn(micro_batches, 4, generator=gen)
        split = split_model(nn.Sequential(_Sleeping(device_s, w[0]), _Sleeping(device_s, w[1])), list(devices)[:2])
        loss = run_with_timeout(train_step, list(split.stages), split.devices, x, y, 1, _mse, timeout_s=timeout_s,
                                what=name, grad=True)
        grads = [None if s[0].weight.grad is None else float(s[0].weight.grad) for s in split.stages]
        return {"loss": _as_loss(loss), "gradients": grads}

    work.__name__ = f"sleeping_step_work({name})"
    return work
