"""Model parallelism: cut a model into consecutive stages, one per logical device (lab 07).

A model too big for one device is split by layers: stage 0 (the first layers) on device 0, stage 1
on device 1, and so on; the activations travel from one stage to the next. This is the
``seq1`` / ``seq2`` ResNet-50 of the PyTorch "Single-Machine Model Parallel Best Practices"
tutorial. It fits a bigger model, but it is not faster: while device 1 works on a batch, device 0
waits for the next one (the tutorial measures the naive split 7 % *slower* than one GPU).
:class:`gpulab.parallel.PipelinedModel` fixes that with micro-batches.

Where to cut (:func:`split_model`, ``balance=``; the costs and the cuts are in
:mod:`~gpulab.parallel.pipeline.balance`):

- ``"params"`` (the default, no input needed): equal parameter counts, i.e. equal memory for
  the weights, which is why one splits a model in the first place. For a ResNet that is a poor
  *time* balance: the last stage has most of the weights and little of the compute.
- ``"time"`` (needs ``sample=``, one micro-batch): measured training-step times, with the forward
  and the backward pass balanced each (GPipe runs them one after the other, each at the pace of
  its slowest stage); for interleaved stages (a device listed twice), the cut whose simulated
  step is shortest; ``"forward_time"`` measures the forward pass only, for inference.
- ``"flops"`` (needs ``sample=``): equal counted floating-point operations; like ``"forward_time"``
  but deterministic (it ignores memory-bound layers such as pooling and BatchNorm).

Example::

    devices = logical_devices(2)
    split = split_model(resnet(50, 10, width=16), devices, balance="time", sample=x[:8])
    print(split.describe())          # which layers, how many parameters, on which device
    out = split(x)                   # (B, 10) on devices[1]; backward sends gradients home
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.devices import registry as _placement
from gpulab.devices.validate import check_devices
from gpulab.parallel import comm
from gpulab.parallel.pipeline.balance import Balance, balanced_boundaries, choose_boundaries, layer_costs

# layer_costs and balanced_boundaries lived here before balance.py: kept importable from here
__all__ = ["SplitModel", "split_model", "model_layers", "device_lanes", "layer_costs", "balanced_boundaries"]


def device_lanes(devices: Sequence[LogicalDevice]) -> list[int]:
    """Each stage's device as a number, counting distinct devices in order of first use: the thread
    that runs the stage on the CPU. ``[0, 1]`` for two devices, ``[0, 1, 0, 1]`` for ``devices * 2``."""
    distinct = list(dict.fromkeys(devices))
    return [distinct.index(d) for d in devices]


class SplitModel(nn.Module):
    """Consecutive stages, stage ``i`` on ``devices[i]``: the naive model-parallel model.

    ``forward`` sends the input to device 0, runs stage 0 there, sends its output to device 1
    with :func:`gpulab.parallel.comm.to` (a real copy, differentiable: backward sends the
    gradient back), and so on. The output lives on the last device. Only one device works at a
    time; that is the point lab 07 starts from.

    Attributes:
        stages: an ``nn.ModuleList`` of ``nn.Sequential`` stages.
        devices: the logical device of each stage (a device may hold several stages: interleaved,
            see :class:`~gpulab.parallel.PipelinedModel`).
        boundaries: the index (into the model's layer list) where each stage after the first starts.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[LogicalDevice]) -> None:
        super().__init__()
        devices = check_devices(devices, repeats=True)
        if len(stages) != len(devices):
            raise ValueError(f"{len(stages)} stages but {len(devices)} devices: give one device per stage")
        self.stages = nn.ModuleList(stages)
        self.devices = list(devices)
        for stage, dev in zip(self.stages, self.devices):
            comm.to(stage, dev)  # in place, like Module.to

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage, dev in zip(self.stages, self.devices):
            x = comm.to(x, dev)  # a copy between devices; its backward sends the gradient back
            with dev:
                x = stage(x)
        _placement.tag(x, self.devices[-1])  # placement() knows where the output is, meter or not
        return x

    @property
    def boundaries(self) -> list[int]:
        """Where each stage after the first starts, counting layers (a non-Sequential stage is one)."""
        out, first = [], 0
        for stage in list(self.stages)[:-1]:
            first += len(stage) if isinstance(stage, nn.Sequential) else 1
            out.append(first)
        return out

    def stage_params(self) -> list[int]:
        """The number of parameters of each stage."""
        return [sum(p.numel() for p in s.parameters()) for s in self.stages]

    def describe(self) -> str:
        """One line per stage: its layers, parameter count and device."""
        lines, first = [], 0
        for i, (stage, dev, n) in enumerate(zip(self.stages, self.devices, self.stage_params())):
            count = len(stage) if isinstance(stage, nn.Sequential) else 1
            lines.append(f"stage {i}: layers {first}-{first + count - 1}, {n:,} parameters, on {dev!r}")
            first += count
        return "\n".join(lines)


def model_layers(model: nn.Module | Sequence[nn.Module]) -> list[nn.Module]:
    """The model as a list of layers that run one after the other (the possible cut points).

    A model with a ``layers()`` method (:class:`gpulab.models.ResNet`: stem, each residual
    block, head) gives that; an ``nn.Sequential`` gives its children; a list of modules is taken
    as it is.

    Raises:
        TypeError: for any other model: its forward may do more than chain its children.
    """
    if hasattr(model, "layers") and callable(model.layers):
        layers = list(model.layers())
    elif isinstance(model, nn.Sequential):
        layers = list(model)
    elif isinstance(model, (list, tuple)) and all(isinstance(m, nn.Module) for m in model):
        layers = list(model)
    else:
        raise TypeError(
            f"cannot split a {type(model).__name__}: its forward may do more than run its children in "
            "order. Pass an nn.Sequential, a list of modules, or a model with a layers() method "
            "(gpulab.models.resnet has one)")
    if not layers:
        raise ValueError("the model has no layers to split")
    return layers


def split_model(model: nn.Module | Sequence[nn.Module], devices: Sequence[LogicalDevice],
                boundaries: Sequence[int] | None = None, *, balance: Balance = "params",
                sample: torch.Tensor | None = None) -> SplitModel:
    """Cut ``model`` into ``len(devices)`` consecutive stages and put stage ``i`` on ``devices[i]``.

    Args:
        model: a model with a ``layers()`` method (``gpulab.models.resnet``), an
            ``nn.Sequential``, or a list of modules run one after the other.
        devices: one logical device per stage (from :func:`gpulab.devices.logical_devices`). A
            device may come back (``devices * 2``: stages on devices 0, 1, 0, 1): interleaved
            stages, which :class:`~gpulab.parallel.PipelinedModel` pipelines with a smaller bubble.
        boundaries: the layer index where each stage after the first starts, e.g. ``[5]`` puts
            layers 0-4 on ``devices[0]`` and the rest on ``devices[1]``. Default: chosen by
            ``balance``.
        balance: how to choose the cut when ``boundaries`` is None: ``"params"`` (default:
            equal parameter counts, i.e. equal weight memory), ``"time"`` (measured training-step
            time, each pass balanced), ``"forward_time"`` or ``"flops"``; all but ``"params"``
            need ``sample``. See the module docstring.
        sample: an input batch, for ``balance="time"``, ``"forward_time"`` or ``"flops"``; for a pipeline, one
            micro-batch (costs depend on the batch size). Times are measured on ``devices[0]``'s
            physical device, on a copy of the layers when they are elsewhere (on a GPU: the whole
            model on the first GPU, for the measurement).

    Returns:
        A :class:`SplitModel`. Its stages are the model's own layers, moved in place (like
        ``Module.to``): deep-copy the model first if you still need it whole.

    Raises:
        ValueError: more devices than layers, boundaries that are not increasing or out of
            range, or a bad ``balance`` / missing ``sample``.
        TypeError: a model that is not a sequence of layers, or devices that are not logical devices.
    """
    layers = model_layers(model)
    devices = check_devices(devices, repeats=True)
    n, s = len(layers), len(devices)
    if s > n:
        raise ValueError(f"cannot split {n} layers into {s} stages: every stage needs at least one layer. "
                         f"Use at most {n} devices, or a model with more layers")
    if boundaries is None:
        # measured where the stages will run (the stages' devices are alike: the first one's)
        boundaries = choose_boundaries(layers, s, balance, sample, device_lanes(devices), devices[0].physical)
    else:
        boundaries = list(boundaries)
        if len(boundaries) != s - 1 or any(isinstance(b, bool) or not isinstance(b, int) for b in boundaries):
            raise ValueError(f"{s} devices need {s - 1} integer boundaries (where stages 1..{s - 1} start), "
                             f"got {boundaries!r}")
        if any(not 0 < b < n for b in boundaries) or any(a >= b for a, b in zip(boundaries, boundaries[1:])):
            raise ValueError(f"boundaries must increase strictly, each between 1 and {n - 1} "
                             f"(the model has {n} layers), got {boundaries!r}")
    edges = [0, *boundaries, n]
    stages = [nn.Sequential(*layers[a:b]) for a, b in zip(edges, edges[1:])]
    return SplitModel(stages, devices)
