"""Where to cut a model into pipeline stages: what each layer costs, and the cut that balances it.

:func:`gpulab.parallel.split_model` takes ``balance=`` and calls :func:`choose_boundaries`:

- ``"params"``: equal parameter counts (equal weight memory, the reason to split at all);
- ``"time"``: measured times of a training step, forward and backward of each layer apart
  (:func:`phase_times`), cut by :func:`pipeline_boundaries`;
- ``"forward_time"``: measured forward times (inference), cut by :func:`balanced_boundaries`;
- ``"flops"``: counted forward FLOPs, cut by :func:`balanced_boundaries`.

Why ``"time"`` balances the two passes apart: GPipe (Huang et al. 2019, arXiv 1811.06965) runs
every micro-batch forward, *then* every micro-batch backward, and each pass moves at the pace of
its slowest stage. The layers of a ResNet do not keep one backward/forward ratio. The stem's
backward skips its input gradient (the data needs none), so it is cheaper than its forward; a
late block's backward costs 1.5 to 2.5 times its forward (lab 07's ResNet-18, width 16, 64x64
images, one thread). A cut that makes forward + backward equal per stage can leave one pass at 1:2. :func:`pipeline_boundaries` minimises the slowest stage of the
forward pass plus the slowest stage of the backward pass, which for M micro-batches is the
step's length minus the fill and drain. (A 1F1B schedule, which alternates one forward and one
backward per stage, runs at the pace of forward + backward, and wants :func:`balanced_boundaries`
of the sums instead.) Stages interleaved on shared devices are cut by
:func:`interleaved_boundaries`, which simulates the schedule on the measured costs.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from typing import Literal, Sequence

import torch
from torch import nn

from gpulab.parallel.pipeline.schedule import fused_step_span, step_span

__all__ = ["Balance", "layer_costs", "phase_times", "balanced_boundaries", "pipeline_boundaries",
           "interleaved_boundaries", "choose_boundaries"]

Balance = Literal["params", "time", "forward_time", "flops"]

# Above this many possible cuts pipeline_boundaries stops trying them all (a 60-layer model over
# 4 stages has 32,509) and balances forward + backward by dynamic programming instead.
MAX_CUTS_TRIED = 50_000
# interleaved_boundaries simulates each cut's step at these micro-batch counts, up to this many cuts
INTERLEAVED_MICRO_BATCHES = (2, 4, 8)
MAX_SIMULATED_CUTS = 2_000


def phase_times(layers: Sequence[nn.Module], sample: torch.Tensor, *, backward: bool = True,
                repeats: int = 3, device: torch.device | str | None = None) -> tuple[list[float], list[float]]:
    """Seconds of forward and of backward for each layer, on ``sample``, as a training step runs them.

    The layers run as one model, in training mode (BatchNorm computes batch statistics, as in a
    training step), and the running statistics are put back afterwards. Forward: the time between
    one layer's output and the next. Backward: one ``torch.autograd.grad`` through the whole graph,
    with a hook on every layer's output that notes when its gradient is ready; a layer's backward
    is the time from the gradient of its output to the gradient of its input (so the first layer
    skips its input's gradient unless ``sample`` needs one, as in training). No ``.grad`` is
    touched. On a CPU the clock is the process's CPU time (``time.process_time``: the work done,
    which another program's load does not stretch; nothing else of this process runs meanwhile),
    on a GPU the wall clock read after the GPU finished the work (a synchronisation after every
    layer's forward and in every gradient hook: without it the clock times kernel launches). Each
    layer keeps its fastest of ``repeats`` runs after a warm-up: load only ever adds time, so the
    minimum is the steadiest. Measure with the threads the real run will use (one intra-op thread
    per device: :func:`gpulab.parallel.intra_op_threads`).

    ``device`` is where to measure, the device the stages will run on (default: the layers'
    parameters', else ``sample``'s); layers elsewhere are measured on copies moved there.

    Returns:
        ``(forward, backward)``: two lists of seconds, one entry per layer (backward all 0.0 when
        ``backward`` is False).
    """
    layers, sample = _on_device(layers, sample, device)
    was_training = [layer.training for layer in layers]
    buffers = [[b.detach().clone() for b in layer.buffers()] for layer in layers]
    n = len(layers)
    clock = time.perf_counter if sample.is_cuda else time.process_time

    def when_ready(grad: torch.Tensor) -> float:  # in a gradient hook: once the gradient is computed
        _sync(grad)
        return clock()

    forward: list[list[float]] = [[] for _ in layers]
    back: list[list[float]] = [[] for _ in layers]
    try:
        for layer in layers:
            layer.train(backward)
        for r in range(repeats + 1):  # the first pass warms up (allocator, kernels)
            with torch.set_grad_enabled(backward):
                first = h = sample.detach().requires_grad_(sample.requires_grad and backward)
                outs, stamps = [], [clock()]
                for layer in layers:
                    h = layer(h.clone() if h.requires_grad and not h.grad_fn else h)  # in-place layers: not on a leaf
                    _sync(h)
                    outs.append(h)
                    stamps.append(clock())
            ready = [0.0] * n  # ready[i]: when the gradient of layer i's output was complete
            if backward and outs[-1].requires_grad:
                for i, out in enumerate(outs[:-1]):
                    if out.requires_grad:
                        out.register_hook(lambda g, i=i: ready.__setitem__(i, when_ready(g)))
                wrt = [t for t in (*(p for layer in layers for p in layer.parameters()), first) if t.requires_grad]
                ready[-1] = clock()
                torch.autograd.grad(outs[-1], wrt, torch.ones_like(outs[-1]))  # grad(): no .grad touched
                _sync(outs[-1])
                end = clock()
            if r:
                for i in range(n):
                    forward[i].append(stamps[i + 1] - stamps[i])
                    if backward and outs[-1].requires_grad:
                        # layer i runs from its output's gradient to its input's (layer 0: to the end)
                        back[i].append(max(0.0, (ready[i - 1] if i else end) - ready[i]))
                    else:
                        back[i].append(0.0)
    finally:
        with torch.no_grad():
            for layer, mode, saved in zip(layers, was_training, buffers):
                layer.train(mode)
                for b, old in zip(layer.buffers(), saved):
                    b.copy_(old)  # BatchNorm's running statistics, as they were
    return [min(t) for t in forward], [min(t) for t in back]


def _sync(t: torch.Tensor) -> None:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)  # GPU kernels are asynchronous: a CPU-GPU sync point, on purpose


def _on_device(layers: Sequence[nn.Module], sample: torch.Tensor,
               device: torch.device | str | None) -> tuple[list[nn.Module], torch.Tensor]:
    """The layers and the sample on ``device`` (default: the layers' own): the layers themselves
    where they are there already, else deep copies moved there."""
    params = [p for layer in layers for p in layer.parameters()]
    where = torch.device(device) if device is not None else params[0].device if params else sample.device
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    on_device = all(t.device == where for layer in layers for t in (*layer.parameters(), *layer.buffers()))
    layers = list(layers) if on_device else [copy.deepcopy(layer).to(where) for layer in layers]
    return layers, sample.to(where)


def layer_costs(layers: Sequence[nn.Module], balance: Balance = "params", sample: torch.Tensor | None = None,
                *, repeats: int = 3, device: torch.device | str | None = None) -> list[float]:
    """The cost of each layer: parameter count, measured seconds, or counted forward FLOPs.

    ``"time"`` is forward + backward seconds (:func:`phase_times`, on ``device``), ``"forward_time"``
    the forward alone (an inference's cost), ``"flops"`` the FLOPs that ``torch.utils.flop_counter``
    counts in one forward (deterministic, but blind to memory-bound layers such as pooling and
    BatchNorm).

    Raises:
        ValueError: for an unknown ``balance``, or one that runs the layers without ``sample``.
    """
    if balance == "params":
        return [float(sum(p.numel() for p in layer.parameters())) for layer in layers]
    if balance not in ("time", "forward_time", "flops"):
        raise ValueError(f"balance must be 'params', 'time', 'forward_time' or 'flops', got {balance!r}")
    if not isinstance(sample, torch.Tensor):
        raise ValueError(f"balance={balance!r} runs the layers: pass sample=a small input batch, e.g. x[:8]")
    if balance == "flops":
        from torch.utils.flop_counter import FlopCounterMode

        was_training = [layer.training for layer in layers]
        costs, h = [], sample
        try:
            with torch.no_grad():
                for layer in layers:
                    layer.eval()  # BatchNorm's running statistics stay as they are
                    counter = FlopCounterMode(display=False)
                    with counter:
                        h = layer(h)
                    costs.append(float(counter.get_total_flops()))
        finally:
            for layer, mode in zip(layers, was_training):
                layer.train(mode)
        return costs
    forward, backward = phase_times(layers, sample, backward=balance == "time", repeats=repeats, device=device)
    return [f + b for f, b in zip(forward, backward)]


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


def pipeline_boundaries(forward: Sequence[float], backward: Sequence[float], num_stages: int) -> list[int]:
    """The cut for a GPipe training step: the slowest stage of the forward pass plus the slowest
    stage of the backward pass as small as possible; ties go to the cut whose slowest stage
    (forward + backward) is cheapest.

    Every contiguous cut is tried (there are C(n - 1, S - 1)); past ``MAX_CUTS_TRIED`` of them the
    sums are balanced instead (:func:`balanced_boundaries`).

    Returns:
        ``num_stages - 1`` increasing indices, as :func:`balanced_boundaries` returns them.

    Raises:
        ValueError: lists of different lengths, or more stages than layers.
    """
    n = len(forward)
    if len(backward) != n:
        raise ValueError(f"one forward and one backward cost per layer: got {n} and {len(backward)}")
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot cut {n} layers into {num_stages} stages: each stage needs at least one layer")
    total = [f + b for f, b in zip(forward, backward)]
    if math.comb(n - 1, num_stages - 1) > MAX_CUTS_TRIED:
        return balanced_boundaries(total, num_stages)
    prefix_f, prefix_b = list(itertools.accumulate(forward, initial=0.0)), list(itertools.accumulate(backward, initial=0.0))

    def cost(cut: tuple[int, ...]) -> tuple[float, float]:
        edges = list(zip((0, *cut), (*cut, n)))
        slowest_f = max(prefix_f[b] - prefix_f[a] for a, b in edges)
        slowest_b = max(prefix_b[b] - prefix_b[a] for a, b in edges)
        slowest_total = max(prefix_f[b] - prefix_f[a] + prefix_b[b] - prefix_b[a] for a, b in edges)
        return slowest_f + slowest_b, slowest_total

    return list(min(itertools.combinations(range(1, n), num_stages - 1), key=cost))


def interleaved_boundaries(forward: Sequence[float], backward: Sequence[float], lanes: Sequence[int],
                           micro_batches: Sequence[int] = INTERLEAVED_MICRO_BATCHES, *,
                           fused: bool = False) -> list[int]:
    """The cut for stages that share devices (interleaved: stage s on device ``lanes[s]``, a device
    listed more than once): the cut whose training step, as the CPU schedule runs it
    (:func:`~gpulab.parallel.pipeline.schedule.step_span`, free hand-offs), is shortest, summed
    over ``micro_batches`` (each as a share of the same micro-batches one after another).

    Why not balance each stage's passes (:func:`pipeline_boundaries`): what a device waits for
    depends on the sum of its stages in each pass *and* on how long the first and last stages make
    the fill and drain; no per-stage rule weighs both. Every contiguous cut is simulated (84 for
    10 layers in 4 stages); past ``MAX_SIMULATED_CUTS`` the per-stage rule is used instead.

    With ``fused``, the step is simulated as one sweep
    (:func:`~gpulab.parallel.pipeline.schedule.fused_step_span`, ``PipelinedModel.forward_backward``
    on the CPU), which any lanes suit, a device per stage included; past ``MAX_SIMULATED_CUTS``,
    forward + backward per stage are balanced instead.

    Raises:
        ValueError: lists of different lengths, or more stages than layers.
    """
    n, num_stages = len(forward), len(lanes)
    if len(backward) != n:
        raise ValueError(f"one forward and one backward cost per layer: got {n} and {len(backward)}")
    if not 1 <= num_stages <= n:
        raise ValueError(f"cannot cut {n} layers into {num_stages} stages: each stage needs at least one layer")
    if math.comb(n - 1, num_stages - 1) > MAX_SIMULATED_CUTS:
        if fused:
            return balanced_boundaries([f + b for f, b in zip(forward, backward)], num_stages)
        return pipeline_boundaries(forward, backward, num_stages)
    span = fused_step_span if fused else step_span
    prefix_f, prefix_b = list(itertools.accumulate(forward, initial=0.0)), list(itertools.accumulate(backward, initial=0.0))

    def cost(cut: tuple[int, ...]) -> float:
        edges = list(zip((0, *cut), (*cut, n)))
        f = [prefix_f[b] - prefix_f[a] for a, b in edges]
        b = [prefix_b[e] - prefix_b[a] for a, e in edges]
        return sum(span(f, b, lanes, m) / m for m in micro_batches)

    return list(min(itertools.combinations(range(1, n), num_stages - 1), key=cost))


def choose_boundaries(layers: Sequence[nn.Module], num_stages: int, balance: Balance = "params",
                      sample: torch.Tensor | None = None, lanes: Sequence[int] | None = None,
                      device: torch.device | str | None = None) -> list[int]:
    """The boundaries :func:`gpulab.parallel.split_model` uses for ``balance`` (see the module docstring).
    ``lanes[s]`` is stage s's device; where a device holds several stages, ``"time"`` cuts by
    :func:`interleaved_boundaries`. Times are measured on ``device`` (:func:`phase_times`).

    Raises:
        ValueError: as :func:`layer_costs`, or more stages than layers.
    """
    if balance == "time":
        if not isinstance(sample, torch.Tensor):
            raise ValueError("balance='time' runs the layers: pass sample=a small input batch, e.g. x[:8]")
        forward, backward = phase_times(layers, sample, device=device)
        if lanes is not None and len(set(lanes)) < len(lanes):
            return interleaved_boundaries(forward, backward, lanes)
        return pipeline_boundaries(forward, backward, num_stages)
    return balanced_boundaries(layer_costs(layers, balance, sample, device=device), num_stages)
