"""Model parallelism: cut a model into consecutive stages, one per logical device (lab 07).

A model too big for one device is split by layers: stage 0 (the first layers) on device 0, stage 1
on device 1, and so on; the activations travel from one stage to the next. This is the
``seq1`` / ``seq2`` ResNet-50 of the PyTorch "Single-Machine Model Parallel Best Practices"
tutorial. It fits a bigger model, but it is not faster: while device 1 works on a batch, device 0
waits for the next one (the tutorial measures the naive split 7 % *slower* than one GPU).
:class:`gpulab.parallel.PipelinedModel` fixes that with micro-batches.

Where to cut (:func:`split_model`, ``balance=``):

- ``"params"`` (the default, no input needed): equal parameter counts, i.e. equal memory for
  the weights, which is why one splits a model in the first place. For a ResNet that is a poor
  *time* balance: the last stage has most of the weights and little of the compute.
- ``"time"`` (needs ``sample=``): equal measured time per stage (forward + backward of a
  micro-batch-sized ``sample``), what a training pipeline needs; ``"forward_time"`` measures
  the forward pass only, for inference.
- ``"flops"`` (needs ``sample=``): equal counted floating-point operations; like ``"time"``
  but deterministic (it ignores memory-bound layers such as pooling and BatchNorm).

Each picks the contiguous cut that makes the most expensive stage as cheap as possible.

Example::

    devices = logical_devices(2)
    split = split_model(resnet(50, 10, width=16), devices, balance="time", sample=x[:8])
    print(split.describe())          # which layers, how many parameters, on which device
    out = split(x)                   # (B, 10) on devices[1]; backward sends gradients home
"""

from __future__ import annotations

import statistics
import time
from typing import Literal, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.devices import registry as _placement
from gpulab.devices.validate import check_devices
from gpulab.parallel import comm

__all__ = ["SplitModel", "split_model", "model_layers", "layer_costs", "balanced_boundaries"]

Balance = Literal["params", "time", "forward_time", "flops"]


class SplitModel(nn.Module):
    """Consecutive stages, stage ``i`` on ``devices[i]``: the naive model-parallel model.

    ``forward`` sends the input to device 0, runs stage 0 there, sends its output to device 1
    with :func:`gpulab.parallel.comm.to` (a real copy, differentiable: backward sends the
    gradient back), and so on. The output lives on the last device. Only one device works at a
    time; that is the point lab 07 starts from.

    Attributes:
        stages: an ``nn.ModuleList`` of ``nn.Sequential`` stages.
        devices: the logical device of each stage.
        boundaries: the index (into the model's layer list) where each stage after the first starts.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[LogicalDevice]) -> None:
        super().__init__()
        devices = check_devices(devices)
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


def layer_costs(layers: Sequence[nn.Module], balance: Balance = "params", sample: torch.Tensor | None = None,
                *, repeats: int = 3) -> list[float]:
    """The cost of each layer: parameter count, measured seconds, or counted forward FLOPs.

    ``"time"`` runs ``sample`` forward and backward through each layer ``repeats`` times (after
    a warm-up) and keeps each layer's median: a training step's cost (``"forward_time"``: the
    forward pass only, an inference's cost). It runs in eval mode and
    through ``torch.autograd.grad``, so BatchNorm's running statistics and the ``.grad`` of the
    parameters are left as they were. Measure with the threads the real run will use (lab 07 uses one
    intra-op thread per device: :func:`gpulab.parallel.intra_op_threads`).

    Raises:
        ValueError: for an unknown ``balance``, or one that runs the layers without ``sample``.
    """
    if balance == "params":
        return [float(sum(p.numel() for p in layer.parameters())) for layer in layers]
    if balance not in ("time", "forward_time", "flops"):
        raise ValueError(f"balance must be 'params', 'time', 'forward_time' or 'flops', got {balance!r}")
    if not isinstance(sample, torch.Tensor):
        raise ValueError(f"balance={balance!r} runs the layers: pass sample=a small input batch, e.g. x[:8]")
    was_training = [layer.training for layer in layers]
    for layer in layers:
        layer.eval()
    try:
        with torch.no_grad():
            if balance == "flops":
                from torch.utils.flop_counter import FlopCounterMode

                costs, h = [], sample
                for layer in layers:
                    counter = FlopCounterMode(display=False)
                    with counter:
                        h = layer(h)
                    costs.append(float(counter.get_total_flops()))
                return costs
            times: list[list[float]] = [[] for _ in layers]
            for r in range(repeats + 1):  # the first pass warms up (allocator, kernels)
                h = sample
                for i, layer in enumerate(layers):
                    train = balance == "time"
                    with torch.set_grad_enabled(train):  # a training step: forward + backward
                        t0 = time.perf_counter()
                        h_in = h.detach().requires_grad_(train and h.is_floating_point())
                        out = layer(h_in.clone() if train else h_in)  # a layer may work in place: not on a leaf
                        wrt = [t for t in (h_in, *layer.parameters()) if t.requires_grad]
                        if train and wrt and out.requires_grad:  # grad(), not backward(): no .grad touched
                            torch.autograd.grad(out, wrt, torch.ones_like(out))
                        if out.is_cuda:
                            torch.cuda.synchronize(out.device)  # GPU kernels are asynchronous
                    if r:
                        times[i].append(time.perf_counter() - t0)
                    h = out.detach()
            return [statistics.median(t) for t in times]
    finally:
        for layer, mode in zip(layers, was_training):
            layer.train(mode)


def balanced_boundaries(costs: Sequence[float], num_stages: int) -> list[int]:
    """Where to cut ``len(costs)`` layers into ``num_stages`` contiguous, non-empty stages so that
    the most expensive stage is as cheap as possible (linear partition, by dynamic programming).

    Returns:
        ``num_stages - 1`` increasing indices: stage ``i`` starts at ``result[i - 1]``.
    """
    n = len(costs)
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot cut {n} layers into {num_stages} stages: each stage needs at least one layer")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[s][i]: the cheapest bottleneck for the first i layers in s stages; cut[s][i]: last cut
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for s in range(1, num_stages + 1):
        for i in range(s, n + 1):
            for k in range(s - 1, i):
                worst = max(best[s - 1][k], prefix[i] - prefix[k])
                if worst < best[s][i]:
                    best[s][i], cut[s][i] = worst, k
    bounds, i = [], n
    for s in range(num_stages, 1, -1):
        i = cut[s][i]
        bounds.append(i)
    return bounds[::-1]


def split_model(model: nn.Module | Sequence[nn.Module], devices: Sequence[LogicalDevice],
                boundaries: Sequence[int] | None = None, *, balance: Balance = "params",
                sample: torch.Tensor | None = None) -> SplitModel:
    """Cut ``model`` into ``len(devices)`` consecutive stages and put stage ``i`` on ``devices[i]``.

    Args:
        model: a model with a ``layers()`` method (``gpulab.models.resnet``), an
            ``nn.Sequential``, or a list of modules run one after the other.
        devices: one logical device per stage (from :func:`gpulab.devices.logical_devices`).
        boundaries: the layer index where each stage after the first starts, e.g. ``[5]`` puts
            layers 0-4 on ``devices[0]`` and the rest on ``devices[1]``. Default: chosen by
            ``balance``.
        balance: how to choose the cut when ``boundaries`` is None: ``"params"`` (default:
            equal parameter counts, i.e. equal weight memory), ``"time"`` (equal measured forward +
            backward time), ``"forward_time"`` or ``"flops"``; all but ``"params"`` need
            ``sample``. See the module docstring.
        sample: an input batch, for ``balance="time"``, ``"forward_time"`` or ``"flops"``; for a pipeline, one
            micro-batch (costs depend on the batch size).

    Returns:
        A :class:`SplitModel`. Its stages are the model's own layers, moved in place (like
        ``Module.to``): deep-copy the model first if you still need it whole.

    Raises:
        ValueError: more devices than layers, boundaries that are not increasing or out of
            range, or a bad ``balance`` / missing ``sample``.
        TypeError: a model that is not a sequence of layers, or devices that are not logical devices.
    """
    layers = model_layers(model)
    devices = check_devices(devices)
    n, s = len(layers), len(devices)
    if s > n:
        raise ValueError(f"cannot split {n} layers into {s} stages: every stage needs at least one layer. "
                         f"Use at most {n} devices, or a model with more layers")
    if boundaries is None:
        boundaries = balanced_boundaries(layer_costs(layers, balance, sample), s)
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
