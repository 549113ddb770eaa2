"""PipelinedModel (lab 07): a split model fed with micro-batches, so that its stages work at once.

The PyTorch tutorial "Single-Machine Model Parallel Best Practices" cuts each batch into
micro-batches of ``split_size`` rows: while device 1 works on micro-batch j, device 0 already works
on j + 1 (ResNet-50 on two GPUs: the naive split 7 % slower than one GPU, ``split_size=20`` 49 %
faster). :class:`PipelinedModel` does it with GPipe's schedule on either path:

- **GPUs** (:mod:`~gpulab.parallel.pipeline.streams`): one host thread, a CUDA stream per stage;
- **logical devices sharing the CPU** (:mod:`~gpulab.parallel.pipeline.threads`): a thread per
  device; interleaved stages (devices 0, 1, 0, 1) and a step in one sweep (:meth:`forward_backward`).

Lab 07's exercise, the training step alone in one file, is :mod:`~gpulab.parallel.pipeline.gpipe`.
Tests: ``pytest tests/parallel/pipeline/test_pipelined.py``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from gpulab.devices import LogicalDevice, placement
from gpulab.devices import registry as _placement
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent
from gpulab.parallel.pipeline.split import SplitModel, device_lanes
from gpulab.parallel.pipeline.streams import forward_streams
from gpulab.parallel.pipeline.threads import StageThreads

__all__ = ["PipelinedModel"]


def _concat(outs: list[torch.Tensor], device: LogicalDevice) -> torch.Tensor:
    """The micro-batches' outputs as one batch on ``device``, tagged with it."""
    with device:
        out = torch.cat(outs)  # M x (rows_j, ...) -> (B, ...)
    _placement.tag(out, device)
    return out


class _PipelineFunction(torch.autograd.Function):
    """Autograd sees the whole pipeline as one op: forward and backward run the stage threads.

    Why the parameters are inputs (``*params``) although ``forward`` never reads them: autograd
    calls an op's ``backward`` only if one of its inputs requires grad. When ``x`` needs no
    gradient (a model's first layer is fed data), the parameters are the only inputs that do;
    without them the output would not require grad, ``loss.backward()`` would never reach the
    pipeline, and no stage would get its gradients. ``backward`` still returns None for them:
    each stage's own ``torch.autograd.backward`` accumulates into its parameters' ``.grad``.
    """

    @staticmethod
    def forward(ctx, run: StageThreads, x: torch.Tensor, split_size: int, *params: torch.Tensor) -> torch.Tensor:
        micro = list(x.detach().split(split_size))  # M views of (split_size, ...), the last maybe smaller
        outs = run.forward(micro, grad=True, input_grad=x.requires_grad)
        ctx.run, ctx.sizes, ctx.source = run, [m.size(0) for m in micro], placement(x)
        return _concat(outs, run.devices[-1])  # (B, ...)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        grads = ctx.run.backward(list(grad.split(ctx.sizes)))  # (B, ...) -> M x (rows_j, ...)
        # one gradient per forward input: run, x, split_size, then every parameter (None: the
        # stages already accumulated theirs into .grad)
        no_param_grads = [None] * (len(ctx.needs_input_grad) - 3)
        if not ctx.needs_input_grad[1] or any(g is None for g in grads):
            return None, None, None, *no_param_grads
        with ctx.run.devices[0]:
            grad_x = torch.cat(grads)  # (B, ...) on stage 0's device
        return None, comm.to(grad_x, ctx.source), None, *no_param_grads


class PipelinedModel(nn.Module):
    """A :class:`SplitModel` fed with micro-batches, so that its stages work at the same time.

    ``forward(x)`` cuts ``x`` into micro-batches of ``split_size`` rows along dim 0 (the last one
    smaller when ``split_size`` does not divide the batch; one micro-batch when it is at least the
    batch) and pipelines them through the stages. The output is the micro-batches' outputs
    concatenated, on the last stage's device, as the split model would return it; ``backward``
    sends gradients to every stage's parameters and to ``x``.

    With ``overlap=False`` the same micro-batches run one after the other (same work, same
    micro-batch sizes, no overlap): the fair baseline for the overlap speedup, because on a CPU a
    smaller batch can be faster per sample on its own (it fits in the cache), and that gain is
    not the pipeline's.

    Args:
        split: the stages and their devices (:func:`gpulab.parallel.split_model`).
        split_size: rows per micro-batch (the tutorial's ``split_size``), a positive int.
        overlap: pipeline the micro-batches (default) or run them one after the other.

    Attributes:
        timeline: the :class:`~gpulab.parallel.pipeline.bubble.StageEvent`\\ s of the last call (forward,
            then backward once it ran), for :func:`~gpulab.parallel.pipeline.bubble.plot_timeline`.

    Raises:
        TypeError: if ``split`` is not a SplitModel.
        ValueError: if ``split_size`` is not a positive int.

    Warning:
        Model each logical device as **one core**: run the compared variants inside
        :func:`intra_op_threads(1) <gpulab.parallel.pipeline.timing.intra_op_threads>`.
        ``torch.set_num_threads`` is process-wide, so without it a pipelined run puts two stages x
        all cores of intra-op threads on the machine, and a single-device run gets every core for
        itself: neither compares devices.

    Warning:
        BatchNorm in training mode normalises each micro-batch with its own statistics, so a
        pipelined model in ``train()`` mode computes (slightly) different outputs and running
        statistics from the whole batch. In ``eval()`` mode, or with per-sample normalisation
        (GroupNorm, LayerNorm), the results match. On the CPU path, gradients reach the parameters
        through ``.backward()`` only (each stage accumulates into ``.grad`` itself):
        ``torch.autograd.grad`` of a pipelined output is not supported.

    Example::

        pipe = PipelinedModel(split_model(model, logical_devices(2), balance="time", sample=x[:8]), 16)
        print(pipe.mode)
        with intra_op_threads(1):
            loss_fn(pipe(x), y).backward()
    """

    def __init__(self, split: SplitModel, split_size: int, *, overlap: bool = True) -> None:
        super().__init__()
        if not isinstance(split, SplitModel):
            raise TypeError(f"PipelinedModel takes a SplitModel, got {type(split).__name__}: make one with "
                            "gpulab.parallel.split_model(model, devices)")
        if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
            raise ValueError(f"split_size is the number of rows per micro-batch and must be a positive int, "
                             f"got {split_size!r}")
        self.split = split
        self.split_size = split_size
        self.overlap = bool(overlap)
        self.timeline: list[StageEvent] = []

    @property
    def devices(self) -> list[LogicalDevice]:
        """The logical device of each stage."""
        return self.split.devices

    @property
    def uses_streams(self) -> bool:
        """True on GPUs (CUDA streams, one host thread); False on the CPU (one thread per device)."""
        return all(d.physical.type == "cuda" for d in self.devices)

    @property
    def mode(self) -> str:
        """One line: how the stages overlap here, and whether the devices are real."""
        stages = len(self.devices)
        physical = list(dict.fromkeys(d.physical for d in self.devices))
        shared = len(physical) < stages
        how = "pipelined" if self.overlap else "micro-batches one after another (no overlap)"
        if self.uses_streams:
            where = (f"{stages} stages sharing {physical[0]}: simulated devices, the streams share one GPU" if shared
                     else f"{stages} stages on {len(physical)} GPUs: real devices")
            return f"CUDA streams, {how}: {where}"
        threads = max(device_lanes(self.devices)) + 1
        each = ("one thread each" if threads == stages else
                f"interleaved on {threads} devices, one thread per device")
        return (f"CPU threads, {how}: {stages} stages, {each}, sharing the CPU "
                f"({torch.get_num_threads()} intra-op thread(s) per op): simulated devices")

    def num_micro_batches(self, batch_size: int) -> int:
        """How many micro-batches a batch of ``batch_size`` rows makes (the last may be smaller)."""
        return math.ceil(batch_size / self.split_size)

    def forward_backward(self, x: torch.Tensor, targets: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
                         ) -> float:
        """A training step's forward, loss and backward, without the optimizer: the gradients of
        ``loss_fn(self(x), targets)`` accumulate into the parameters' ``.grad`` (and into
        ``x.grad`` where ``x`` requires one), and the loss is returned as a float.

        ``loss_fn`` must be a mean over the rows (as ``cross_entropy`` is): each micro-batch's
        loss is weighted by its share of the rows. On the CPU the loss is computed per micro-batch
        on the last stage, so the backward of the first micro-batches starts while the last ones
        still go forward: the step fills and drains once, and each device's forward and backward
        work share its time (:meth:`StageThreads.forward_backward
        <gpulab.parallel.pipeline.threads.StageThreads.forward_backward>`). With ``overlap=False``
        the same work runs one micro-batch after the other (gradient accumulation). On GPUs it is
        ``loss_fn(self(x), targets).backward()``: GPipe's two passes on streams.

        Raises:
            ValueError: as :meth:`forward`, ``targets`` without one row per row of ``x``, or an ``x``
                that requires grad but is not a leaf (its graph goes on before the pipeline:
                call ``loss_fn(pipe(x), targets).backward()`` instead).
        """
        self._check_batch(x)
        if x.requires_grad and not x.is_leaf:
            raise ValueError("forward_backward ends the backward at x, but x comes out of other ops that need its "
                             "gradient: call loss_fn(pipe(x), targets).backward() instead")
        if not isinstance(targets, torch.Tensor) or targets.dim() == 0 or targets.size(0) != x.size(0):
            raise ValueError(f"targets need one row per input row: x has {x.size(0)} rows, targets are "
                             f"{tuple(targets.shape) if isinstance(targets, torch.Tensor) else type(targets).__name__}")
        if self.uses_streams:
            out = self(x)
            loss = loss_fn(out, comm.to(targets, self.devices[-1]))
            loss.backward()
            return loss.item()
        run = StageThreads(self.split.stages, self.devices, self.overlap)
        self.timeline = run.timeline
        losses, grads = run.forward_backward(list(x.split(self.split_size)), list(targets.split(self.split_size)),
                                             loss_fn, input_grad=x.requires_grad)
        if x.requires_grad and all(g is not None for g in grads):
            with self.devices[0]:
                grad_x = comm.to(torch.cat(grads), placement(x))  # (B, ...) on x's device
            x.grad = grad_x if x.grad is None else x.grad + grad_x
        return float(sum(loss.item() for loss in losses))

    @staticmethod
    def _check_batch(x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.size(0) == 0:
            raise ValueError(f"PipelinedModel needs a batch with at least one row along dim 0, got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The split model's output for ``x`` (B rows), computed in micro-batches of ``split_size`` rows.

        Raises:
            ValueError: if ``x`` is not a tensor with at least one row along dim 0.
        """
        self._check_batch(x)
        if self.uses_streams:
            micro = list(x.split(self.split_size))  # M views of (split_size, ...), the last maybe smaller
            outs, self.timeline = forward_streams(list(self.split.stages), self.devices, micro, self.overlap)
            return _concat(outs, self.devices[-1])  # (B, ...)
        run = StageThreads(self.split.stages, self.devices, self.overlap)
        self.timeline = run.timeline  # the same list: backward appends its events to it
        params = [p for p in self.split.parameters() if p.requires_grad]
        if torch.is_grad_enabled() and (x.requires_grad or params):
            # the parameters go in as inputs so that autograd calls the pipeline's backward (see
            # _PipelineFunction)
            return _PipelineFunction.apply(run, x, self.split_size, *params)
        outs = run.forward(list(x.split(self.split_size)), grad=False, input_grad=False)
        return _concat(outs, self.devices[-1])  # (B, ...)
