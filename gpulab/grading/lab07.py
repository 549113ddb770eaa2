"""Lab 07's graders: they run the student's pipeline and return what it did, as plain values for
the test cells' ``grading.check_*`` to send; the grader compares them with the reference run's.

The student writes ``TwoStageModel``, ``pipelined_forward(stages, devices, x, split_size)``
(inference; autograd back-propagates through it in one thread), ``pipelined_train_step(stages,
devices, inputs, targets, split_size, loss_fn, timeline=None)`` (GPipe's forward *and* backward, one
thread per stage) and ``bubble``. Besides their outputs and gradients (against the whole model's,
:func:`whole_step`), three things are graded:

- **overlap, without a clock** (:func:`stages_overlap`, :func:`train_step_overlap`): two stages
  that can only finish if stage 0 works on micro-batch k + 1 *while* stage 1 works on micro-batch
  k (they meet at a ``threading.Barrier``), and for the training step a second barrier that stage 0
  can only pass while back-propagating a micro-batch while stage 1 back-propagates the next. A
  pipeline gets through on any machine, however loaded; code that runs the stages one after the
  other never does. The values sent: whether each barrier was met, and the outputs (the loss and
  the gradients for the training step);
- **GPipe's schedule** (:func:`train_step_schedule`): what the student's timeline says, as facts
  that do not depend on the clock (every event there, the first hand-off or flush out of order);
- **the speed-up** (:func:`train_step_work`): one seeded training step of the student's pipeline
  and one of the same micro-batches run one after the other (:func:`sequential_train_step`), for
  ``grading.check_speedup``, which the grader times from outside the kernel.

Each call of the student's code runs in a helper thread with a time limit
(:func:`run_with_timeout`), so a pipeline whose stage thread waits forever for a micro-batch stops
the test with :class:`StepTimeout` instead of hanging the notebook.

On GPUs the same holds: the references run on the thread schedule, as the student's code does
(a ``PipelinedModel`` launches every stage from one thread on CUDA streams, which never meets a
barrier), and the student's code runs in IEEE float32 (:func:`exact_float32`), which the
tolerances of the comparisons with the CPU's float32 reference assume (:data:`FLOAT32_RTOL`).
``tests/grading/test_lab07_gpus.py`` runs the graders and the whole notebook on two GPUs on paper.
"""

from __future__ import annotations

import copy
import threading
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice, cuda_device_count, logical_devices
from gpulab.grading.numerics import exact_float32
from gpulab.parallel.pipeline import bubble_fraction, gpipe_train_step, micro_batch_step
from gpulab.parallel.pipeline.pipelined import _concat
from gpulab.parallel.pipeline.split import SplitModel, split_model
from gpulab.parallel.pipeline.threads import StageThreads, run_in_stage_threads
from gpulab.parallel.pipeline.timing import intra_op_threads
from gpulab.parallel.pipeline.torch_stages import torch_pipeline_step

__all__ = ["REFERENCES", "StepTimeout", "lab_devices", "run_with_timeout", "reference_forward", "sequential_train_step",
           "stages_overlap", "train_step_overlap", "schedule_facts", "train_step_schedule", "train_step_work",
           "whole_step", "named_gradients", "exact_float32", "FLOAT32_RTOL", "FLOAT32_ATOL", "OVERLAPPED"]

# gpulab's reference implementations of lab 07's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): GPipe's training step, the pipeline's overlapped CPU schedule (behind
# PipelinedModel, which then runs its micro-batches one after the other: the lab's demos still run,
# a submission that wraps PipelinedModel does not overlap), the bubble formula, and the two-rank
# torch.distributed.pipelining step (graded in lab07_torch).
# Not masked, because the lab's demos and its tests build on them: split_model / SplitModel (the
# general version of TwoStageModel), PipelinedModel itself (with overlap=False, the fair baseline),
# micro_batch_step (the graders' baseline, overlap=False), StageThreads and forward_streams
# (PipelinedModel's machinery; on GPUs, the CUDA streams).
REFERENCES: tuple = (gpipe_train_step, run_in_stage_threads, bubble_fraction, torch_pipeline_step)

OVERLAPPED = "overlapped"

# The tolerances of graded comparisons with the whole model, which the reference kernel runs on the
# CPU in float32, and how they hold where the student's code runs on a GPU:
# - float32 keeps 24 significant bits (unit roundoff u = 2**-24, about 6e-8). A GPU kernel, a smaller
#   micro-batch, or a backward pass with atomic adds (GPU non-determinism: the order changes from run
#   to run) adds the same terms in another order, which moves a sum of K terms by about sqrt(K) * u
#   times the size of its terms when their rounding errors have random signs (K * u is the worst
#   case, never met in practice). The longest sums graded here are a 3x3 convolution over 512
#   channels (K = 4608) and a weight gradient over 16 images of 32x32 (K = 16384): sqrt(K) * u is
#   under 1e-5 per layer, and through the ~50 layers of a ResNet-50, adding up as a random walk,
#   about 5e-5: inside FLOAT32_RTOL. FLOAT32_ATOL covers the values near 0, whose relative error
#   means nothing. (The gradient checks of pipelines allow 1e-3 and 1e-4, ten times more.)
# - TF32, cuDNN's default for float32 convolutions on Ampere and newer GPUs (Hopper too), rounds the
#   inputs of every product to 10 bits (u = 2**-11, about 5e-4): each convolution is off by about
#   5e-4 of its size, a ResNet's output by 1e-3 to 1e-2, above FLOAT32_RTOL and as far as some
#   wrong answers are. No tolerance tells those apart, so the graders run the student's code in
#   IEEE float32 (exact_float32, around every call of run_with_timeout), as the CPU computes.
FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-5


TrainStep = Callable[..., float]  # (stages, devices, inputs, targets, split_size, loss_fn, timeline=None)
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def lab_devices(n: int = 2) -> list[LogicalDevice]:
    """The lab's devices, as its first cell makes them: two real GPUs where there are two, else two
    logical devices on the CPU; ``n`` > 2 logical devices share the first one's physical device."""
    two = logical_devices(2) if cuda_device_count() >= 2 else logical_devices(2, ["cpu"])
    return two if n == 2 else logical_devices(n, [two[0].physical])


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


# --- gpulab's versions behind the exercises' signatures (expected values: by_reference only) -----

def reference_forward(stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], x: torch.Tensor,
                      split_size: int) -> torch.Tensor:
    """gpulab's pipeline behind ``pipelined_forward``'s signature: the outputs of the thread schedule
    (:class:`~gpulab.parallel.pipeline.threads.StageThreads`, a thread per device, the schedule the
    exercise asks for) on every device, without autograd. On GPUs a ``PipelinedModel`` launches
    every stage from one thread (CUDA streams), which can never meet :func:`stages_overlap`'s
    barrier; that test, this function's one user, compares values only."""
    run = StageThreads(SplitModel(list(stages), list(devices)).stages, list(devices))
    outs = run.forward(list(x.split(split_size)), grad=False, input_grad=False)  # M x (rows_j, ...)
    return _concat(outs, run.devices[-1])  # (B, ...) on the last device


def sequential_train_step(stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], inputs: torch.Tensor,
                          targets: torch.Tensor, split_size: int, loss_fn: LossFn = nn.functional.cross_entropy,
                          timeline: list | None = None) -> float:
    """The baseline of the speed-up: the same micro-batches and the same work as a GPipe step, one
    micro-batch after the other in this thread (``micro_batch_step(..., overlap=False)``; on a GPU
    each piece of work is waited for before the next is launched)."""
    return micro_batch_step(stages, devices, inputs, targets, split_size, loss_fn, timeline, overlap=False)


def whole_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None = None,
               loss_fn: LossFn | None = None, steps: int = 1) -> dict[str, Any]:
    """What the whole model gives, on a copy of it: the loss (``loss_fn(model(inputs), targets)``,
    or ``model(inputs).square().mean()`` without a loss function) and the gradients of the input
    and of every parameter by name, accumulated over ``steps`` backward passes."""
    model = copy.deepcopy(model)
    x = inputs.detach().clone().requires_grad_()
    for _ in range(steps):
        out = model(x)
        loss = out.square().mean() if loss_fn is None else loss_fn(out, targets)
        loss.backward()
    return {"loss": loss.item(), "input": x.grad,
            "parameters": {name: p.grad for name, p in model.named_parameters()}}


def named_gradients(named_like: nn.Module, params: nn.Module | Any) -> dict[str, Any]:
    """The gradients of ``params`` (a module's parameters, or any sequence of parameters), in order,
    under the names of ``named_like``'s parameters (the whole model they were cut from), as copies;
    extra parameters are named by their place."""
    names = [name for name, _ in named_like.named_parameters()]
    params = list(params.parameters() if isinstance(params, nn.Module) else params)
    return {names[i] if i < len(names) else f"extra parameter {i}": None if p.grad is None else p.grad.detach().clone()
            for i, p in enumerate(params)}  # copies: a later step accumulates into .grad in place


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


# --- GPipe's schedule, from the student's timeline -----------------------------------------------

def schedule_facts(timeline: Sequence[Any], num_stages: int, num_micro_batches: int) -> dict[str, Any]:
    """What a training step's timeline says about its schedule, in values that do not depend on the clock.

    Returns:
        ``{"events": how many, "missing": [...], "unexpected": [...], "out of order": the first
        event out of GPipe's order or "none"}``: every (stage, micro-batch) has one forward and one
        backward event; in forward, stage s + 1 starts micro-batch j after stage s ended it, in
        backward stage s starts it after stage s + 1 ended it; and each stage starts its backward
        pass after its last forward (fill, drain, flush). A list that does not hold StageEvents
        gives ``{"timeline": what it holds}``.
    """
    try:
        events = [(str(e.phase), int(e.stage), int(e.micro_batch), float(e.start), float(e.end)) for e in timeline]
    except (AttributeError, TypeError, ValueError):
        return {"timeline": f"not StageEvents: {list(timeline)[:3]!r}"[:300]}
    at = {(ph, s, j): (start, end) for ph, s, j, start, end in events}
    expected = {(ph, s, j) for ph in ("forward", "backward") for s in range(num_stages) for j in range(num_micro_batches)}
    facts: dict[str, Any] = {"events": len(events), "missing": sorted(expected - set(at))[:4],
                             "unexpected": sorted(set(at) - expected)[:4], "out of order": "none"}
    if len(events) != len(expected) or set(at) != expected:
        return facts
    for s in range(num_stages):
        last_forward = max(at["forward", s, j][1] for j in range(num_micro_batches))
        for j in range(num_micro_batches):
            if s and at["forward", s, j][0] < at["forward", s - 1, j][1]:
                facts["out of order"] = f"forward: stage {s} started micro-batch {j} before stage {s - 1} finished it"
            elif s + 1 < num_stages and at["backward", s, j][0] < at["backward", s + 1, j][1]:
                facts["out of order"] = f"backward: stage {s} started micro-batch {j} before stage {s + 1} finished it"
            elif at["backward", s, j][0] < last_forward:
                facts["out of order"] = (f"stage {s} started the backward of micro-batch {j} before its last forward "
                                         "ended: GPipe runs every micro-batch forward, then every one backward")
            else:
                continue
            return facts
    return facts


def train_step_schedule(train_step: TrainStep, split: SplitModel, inputs: torch.Tensor, targets: torch.Tensor,
                        split_size: int, loss_fn: LossFn = nn.functional.cross_entropy) -> dict[str, Any]:
    """:func:`schedule_facts` of the timeline ``train_step`` records for one step (one intra-op
    thread; the gradients it leaves are cleared)."""
    timeline: list = []
    with intra_op_threads(1):
        run_with_timeout(train_step, list(split.stages), list(split.devices), inputs, targets, split_size, loss_fn,
                         timeline, what="pipelined_train_step", grad=True)
    split.zero_grad(set_to_none=True)
    return schedule_facts(timeline, len(split.stages), -(-inputs.size(0) // split_size))


# --- the speed-up: one seeded training step, for grading.check_speedup -------------------------

def train_step_work(train_step: TrainStep, split: SplitModel, split_size: int, *, batch_size: int = 64,
                    image_size: int = 64, num_classes: int = 10, loss_fn: LossFn = nn.functional.cross_entropy,
                    timeout_s: float = 120.0) -> Callable[[int], dict[str, Any]]:
    """One unit of timed work for ``grading.check_speedup``: ``work(seed)`` draws a batch of images
    and labels from ``seed``, clears the gradients and runs ``train_step`` on ``split``'s stages
    (one intra-op thread, in a helper thread with a time limit).

    Returns:
        ``work(seed) -> {"loss": the returned loss, "gradient norms": each parameter's}``: small, and
        depending on all the work, for the grader to compare with the reference run's.
    """
    stages, devices = list(split.stages), list(split.devices)
    params = [p for p in split.parameters() if p.requires_grad]
    name = getattr(train_step, "__name__", "the training step")

    def work(seed: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(int(seed))
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)  # (B, 3, H, W)
        y = torch.randint(0, num_classes, (batch_size,), generator=gen)
        split.zero_grad(set_to_none=True)
        with intra_op_threads(1):
            loss = run_with_timeout(train_step, stages, devices, x, y, split_size, loss_fn, timeout_s=timeout_s,
                                    what=name, grad=True)
        nan = torch.tensor(float("nan"))
        norms = torch.stack([nan if p.grad is None else p.grad.detach().float().norm().cpu() for p in params])
        return {"loss": _as_loss(loss), "gradient norms": norms}

    work.__name__ = f"train_step_work({name})"
    return work
