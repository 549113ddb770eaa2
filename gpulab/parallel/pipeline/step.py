"""Lab 07's baseline step on the general engine: :func:`micro_batch_step` (lab 07's graders).

The same training step as :func:`~gpulab.parallel.pipeline.gpipe.gpipe_train_step`, driven by
:class:`~gpulab.parallel.pipeline.threads.StageThreads` on CPUs and GPUs alike: with ``overlap``
GPipe's schedule (a thread per device, so interleaved stages share one), without it the same
micro-batches one after the other, in the caller's thread: the fair baseline for a speed-up.

    timeline = []
    loss = micro_batch_step(list(split.stages), split.devices, x, y, 8, timeline=timeline, overlap=False)

Tests: ``pytest tests/parallel/pipeline/test_step.py`` (two GPUs on paper).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent
from gpulab.parallel.pipeline.pipelined import PipelinedModel, _concat
from gpulab.parallel.pipeline.split import SplitModel
from gpulab.parallel.pipeline.threads import StageThreads

__all__ = ["micro_batch_step"]


def micro_batch_step(stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], inputs: torch.Tensor,
                     targets: torch.Tensor, split_size: int,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
                     timeline: list[StageEvent] | None = None, *, overlap: bool = True) -> float:
    """One training step over micro-batches, without the optimizer, on the thread schedule
    (:class:`~gpulab.parallel.pipeline.threads.StageThreads`) whatever the devices: with
    ``overlap``, GPipe's (every micro-batch forward, then every one backward, a thread per device);
    without, the same work one micro-batch after the other. The first is
    :func:`~gpulab.parallel.pipeline.gpipe.gpipe_train_step` on the general engine, the second
    lab 07's baseline. The inputs get no gradient (the data needs none).

    Why threads on GPUs too: this is the schedule lab 07's students write, and its graders meet
    the stages at barriers, which one host thread launching every stage can never reach. The
    step is driven from the caller's thread, not from inside autograd: the loss's backward only
    fills the gradient of each micro-batch's output, then the stage threads back-propagate
    (autograd's own device threads stay free for them). On GPUs each event of the timeline ends
    once its device has finished the work (StageThreads synchronises), so it times the work.

    Raises:
        ValueError: ``split_size`` is not a positive int, or ``inputs`` has no rows.
    """
    pipe = PipelinedModel(SplitModel(list(stages), list(devices)), split_size, overlap=overlap)  # checks the arguments
    pipe._check_batch(inputs)
    run = StageThreads(pipe.split.stages, pipe.devices, overlap)
    outs = run.forward(list(inputs.split(split_size)), grad=True, input_grad=False)  # M leaves, cut from the last stage
    last = pipe.devices[-1]
    with last:
        loss = loss_fn(_concat(outs, last), comm.to(targets, last))  # (B, ...) and its targets on the last device
        loss.backward()  # through the loss only: each micro-batch's output gradient lands in outs[j].grad
    run.backward([out.grad for out in outs])  # every stage, last first, into the parameters' .grad
    if timeline is not None:
        timeline.extend(run.timeline)
    return loss.item()
