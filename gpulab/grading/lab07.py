"""Lab 07's graders: they run the student's pipeline and return what it did, as plain values for
the test cells' ``grading.check_*`` to send; the grader compares them with the reference run's.

The student writes ``TwoStageModel``, ``pipelined_forward(stages, devices, x, split_size)``
(inference; autograd back-propagates through it in one thread), ``pipelined_train_step(stages,
devices, inputs, targets, split_size, loss_fn, timeline=None)`` (GPipe's forward *and* backward, one
thread per stage) and ``bubble``. Besides their outputs and gradients (against the whole model's,
:func:`whole_step`), three things are graded:

- **overlap, without a clock** (:func:`stages_overlap`, :func:`train_step_overlap`, in
  :mod:`gpulab.grading.lab07_runs`): stages that meet at a ``threading.Barrier``, which only a
  pipeline gets through, on any machine, however loaded;
- **GPipe's schedule** (:func:`train_step_schedule`): what the student's timeline says, as facts
  that do not depend on the clock (every event there, the first hand-off or flush out of order);
- **the pipeline's time on a modelled clock** (:func:`sleeping_step_work`, in
  :mod:`gpulab.grading.lab07_runs`): a step of two stages that each wait a fixed time per
  micro-batch and pass, measured by the grader (``grading.check_measured``, rule ``measure.wall``).
  The real speed-up over sequential micro-batches (CPU computing, which another program's load
  stretches) is shown in the notebook, never graded.

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
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice, cuda_device_count, logical_devices
from gpulab.grading.lab07_runs import (
    OVERLAPPED,
    SLEEP_DEVICE_S,
    SLEEP_MICRO_BATCHES,
    StepTimeout,
    run_with_timeout,
    sleeping_step_bounds,
    sleeping_step_work,
    stages_overlap,
    train_step_overlap,
)
from gpulab.grading.numerics import exact_float32
from gpulab.parallel.pipeline import bubble_fraction, gpipe_train_step, micro_batch_step
from gpulab.parallel.pipeline.pipelined import _concat
from gpulab.parallel.pipeline.split import SplitModel
from gpulab.parallel.pipeline.threads import StageThreads, run_in_stage_threads
from gpulab.parallel.pipeline.timing import intra_op_threads
from gpulab.parallel.pipeline.torch_stages import torch_pipeline_step

__all__ = ["REFERENCES", "StepTimeout", "lab_devices", "run_with_timeout", "reference_forward", "sequential_train_step",
           "stages_overlap", "train_step_overlap", "schedule_facts", "train_step_schedule", "sleeping_step_work",
           "sleeping_step_bounds", "SLEEP_MICRO_BATCHES", "SLEEP_DEVICE_S", "whole_step", "named_gradients",
           "exact_float32", "FLOAT32_RTOL", "FLOAT32_ATOL", "OVERLAPPED"]

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


# --- gpulab's versions behind the exercises' signatures (visible tests' interactive expected values) --

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
