"""Lab 08's graders: the references masked while the out-of-memory lab is graded, the seeded cases
its hidden tests run the student's functions on, and a count of the host reads (the syncs of lab 01)
a training loop makes.

Each case runs the function it is given (the student's, or gpulab's reference inside
``grading.by_reference``) on a model and batches drawn from a seed, and returns plain values for
the test cell's checks to send: results, parameters, dtypes, what the loop did at each loss call.
Nothing here decides pass or fail. The memory figures (:func:`step_peak`, ``LeakFinder``) are
measured in the kernel by gpulab's instruments; the tests pair each with checks of these values.
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode  # a private module; torch has no public path

from gpulab.devices import MemoryMeter, default_device
from gpulab.devices.registry import default_for
from gpulab.grading.numerics import exact_float32
from gpulab.memory.fixes import retry
from gpulab.memory.fixes.loops import evaluate, train_epoch
from gpulab.memory.fixes.retry import step_or_split
from gpulab.memory.fixes.savings import (
    Workload,
    bf16_step,
    checkpointed_forward,
    checkpointed_step,
    fp32_step,
    lab_workloads,
    peak_memory,
    segment_sizes,
)
from gpulab.models import SmallCNN

__all__ = ["REFERENCES", "count_host_reads", "cnn", "cnn_batches", "Recorder", "epoch_case", "counted_epoch",
           "eval_case", "no_grad_peak", "split_net", "split_batch", "split_budget", "split_case",
           "SplitPastOneSample", "reference_split",
           "workload", "step_peak", "savings_step", "fp32_direction", "checkpoint_case", "plain_case",
           "recomputed", "flatten_features", "train_epoch", "evaluate", "step_or_split", "bf16_step",
           "checkpointed_forward", "fp32_step", "bf16_peak_bar"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the loops (exercises 1-2); the step that splits the batch on out-of-memory,
# with its attempt and its gradient accumulation (exercise 3: the demo after it says so while
# grading); and the bf16 and checkpointed steps with the split (exercise 4). fp32_step stays: it
# is the float32 baseline the demos and the tests measure, not an answer. find_max_batch_size
# stays too: section 8 only demonstrates it (lab 05 grades the search).
REFERENCES: tuple = (train_epoch, evaluate, step_or_split, retry._attempt, retry._accumulate, bf16_step,
                     checkpointed_forward, checkpointed_step, segment_sizes)

# Taken when this module is imported, before any student code runs: what the counter relies on.
_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default  # .item(), float(t), int(t), bool(t), f"{t:.3f}"
_TENSOR = torch.Tensor
_COPIES_OUT = ("tolist", "numpy")  # read a tensor's values without _local_scalar_dense (on a CPU)
_PRINT = torch._tensor_str._str.__code__  # print(t), str(t), repr(t): formatting reads the values


class _ScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense``: every tensor-to-Python-number conversion goes through it."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as gpulab.memory.origins: do not import torch._dynamo on the first op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _LOCAL_SCALAR:
            self.count += 1
        return func(*args, **(kwargs or {}))


def count_host_reads(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """Run ``fn(*args, **kwargs)`` and count how often it reads a tensor's value into Python.

    On a GPU each read (``.item()``, ``float(t)``, ``bool(t)``, ``print(t)``, ``.tolist()``,
    ``.numpy()`` after ``.cpu()``) waits for every kernel queued before it: the host-device sync
    that lab 01 measures. The count is the same on a CPU, where nothing waits, so it grades a loop
    without a GPU or a clock. Reads of CPU tensors count too (Adam reads its step counter on a CPU):
    grade with an optimizer that reads nothing, such as SGD.

    Returns:
        ``(whatever fn returned, the number of reads)``.
    """
    reads = _ScalarReads()
    copies = 0
    printing = 0  # depth inside torch's tensor formatting: one print is one read, whatever it calls

    def tracer(frame, event, arg):  # profiler signature
        nonlocal copies, printing
        if frame.f_code is _PRINT and event == "call":
            printing += 1
            copies += printing == 1
        elif frame.f_code is _PRINT and event == "return":
            printing -= 1
        elif event == "c_call" and not printing and getattr(arg, "__name__", "") in _COPIES_OUT and \
                isinstance(getattr(arg, "__self__", None), _TENSOR):
            copies += 1

    old = sys.getprofile()
    sys.setprofile(tracer)
    try:
        with reads:
            result = fn(*args, **kwargs)
    finally:
        sys.setprofile(old)
    return result, reads.count + copies


# ---- exercises 1-2: the loops ---------------------------------------------------------------------

def cnn(seed: int) -> SmallCNN:
    """The lab's SmallCNN (16, 32 channels), its weights drawn from ``seed``, on the default device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN(channels=(16, 32))
    return model.to(default_device())


def cnn_batches(seed: int, steps: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``batch`` RGB 32x32 images and labels (10 classes), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    device = default_device()
    return [(torch.randn(batch, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device))
            for _ in range(steps)]


class Recorder:
    """A loss function that notes, at every call, whether autograd records (``torch.is_grad_enabled()``)
    and whether the model is in training mode: what a loop did, step by step."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor] = F.cross_entropy) -> None:
        self.model, self.loss_fn = model, loss_fn
        self.calls: list[tuple[bool, bool]] = []

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls.append((torch.is_grad_enabled(), self.model.training))
        return self.loss_fn(outputs, targets)


def _types(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return [type(result).__name__, [type(v).__name__ for v in result]]
    return type(result).__name__


def epoch_case(train_epoch: Callable[..., Any], seed: int, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One epoch of ``train_epoch`` on a seeded SmallCNN and ``steps`` seeded batches (SGD, momentum 0.9).

    Returns:
        ``(numbers, facts)``: ``{"result": what it returned, "parameters": the weights after}`` to
        compare within tolerance, and ``{"types": the result's types, "loss calls": (grad enabled,
        training) at each loss call}`` to compare exactly.
    """
    model = cnn(seed)
    loss_fn = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with exact_float32():  # on a GPU: no TF32, deterministic cuDNN, so two runs agree to float32's precision
        result = train_epoch(model, opt, loss_fn, cnn_batches(seed + 1, steps))
    numbers = {"result": result, "parameters": [p.detach().clone() for p in model.parameters()]}
    return numbers, {"types": _types(result), "loss calls": loss_fn.calls}


def counted_epoch(train_epoch: Callable[..., Any], seed: int, steps: int) -> tuple[Any, int]:
    """``(the result of one epoch as in epoch_case, the host reads it made)`` (see :func:`count_host_reads`)."""
    model = cnn(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # SGD itself reads nothing back
    return count_host_reads(train_epoch, model, opt, nn.CrossEntropyLoss(), cnn_batches(seed + 1, steps))


def eval_case(evaluate: Callable[..., Any], seed: int, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``evaluate`` on a seeded SmallCNN in training mode (``steps`` seeded batches), then in eval mode.

    Returns:
        ``(numbers, facts)``: ``{"result": ...}``, and the result's types, the training flag after
        each call, and (grad enabled, training) at each loss call.
    """
    model = cnn(seed)
    data = cnn_batches(seed + 1, steps)
    loss_fn = Recorder(model)
    model.train()
    with exact_float32():
        result = evaluate(model, loss_fn, data)
        after_train = model.training
        model.eval()
        evaluate(model, loss_fn, data[:1])
    facts = {"types": _types(result), "training after evaluate (was training)": after_train,
             "training after evaluate (was in eval mode)": model.training, "loss calls": loss_fn.calls}
    return {"result": result}, facts


def no_grad_peak(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Peak bytes of one evaluation batch under ``torch.no_grad()`` (section 6's ``without``)."""
    def one() -> float:
        was = model.training
        model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(model(batch[0]), batch[1]).item()
        model.train(was)
        return loss

    return peak_memory(one, track=model)


# ---- exercise 3: a step through an out-of-memory error --------------------------------------------

def split_net(seed: int) -> nn.Module:
    """A small conv net in float64, weights drawn from ``seed``, on the default device.

    No BatchNorm: its samples do not interact, so a step in micro-batches equals the whole batch's.
    Its activations (about 66 kB a sample) outweigh its 7 kB of weights, so what fits depends on the
    micro-batch. float64, so that no GPU rounds its convolutions to TF32 (cuDNN's default): the split
    and the whole step then agree to about 1e-15, on any device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))
    return net.to(default_device(), torch.float64)


def split_batch(seed: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` RGB 16x16 images (float64) and labels (10 classes), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    device = default_device()
    return (torch.randn(batch, 3, 16, 16, generator=g, dtype=torch.float64).to(device),
            torch.randint(0, 10, (batch,), generator=g).to(device))


def _held(seed: int, size: int) -> int:
    """Peak bytes, the weights included, of two forward and backward passes on ``size`` samples:
    what one micro-batch of that size needs once the gradients exist."""
    net = split_net(seed)
    x, y = split_batch(seed + 1, size)
    meter = MemoryMeter(timeline=False)
    dev = default_for(x.device)
    meter.track(net, dev)
    with meter:
        for _ in range(2):
            F.cross_entropy(net(x), y).backward()
    return meter.peak(dev)


def split_budget(seed: int, batch: int, fit: int) -> int:
    """A budget in bytes under which a step on ``batch`` samples of :func:`split_net` fits in ``fit``
    micro-batches and in no fewer: halfway between what the largest micro-batch of ``fit`` and of
    ``fit - 1`` needs (``fit=1``: twice what the whole batch needs)."""
    if fit == 1:
        return 2 * _held(seed, batch)
    return (_held(seed, -(-batch // fit)) + _held(seed, -(-batch // (fit - 1)))) // 2


class SplitPastOneSample(Exception):
    """Raised by :func:`split_case`'s loss function when a step keeps splitting past one sample a part."""


def split_case(step_or_split: Callable[..., Any], seed: int, batch: int,
               budget: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """One ``step_or_split(model, optimizer, loss_fn, inputs, targets)`` on :func:`split_net` and
    ``batch`` seeded samples (SGD, lr 1, momentum 0.9), under ``MemoryMeter(budget)`` with the weights
    counted.

    Returns:
        ``(numbers, facts, live)``: ``{"loss": the loss it returned, "update": each parameter's
        change}`` to compare within tolerance; ``{"types": the result's types, "micro-batches": the
        split it reported, "optimizer steps": how many, "the last split covers the batch": whether
        the last loss calls, as many as the split it reported, saw the batch's samples once}`` to
        compare exactly; and the bytes still live after the call.
    """
    net = split_net(seed)
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=1.0, momentum=0.9)
    steps: list[int] = []
    opt.register_step_post_hook(lambda *args: steps.append(1))
    sizes: list[int] = []

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        sizes.append(int(targets.shape[0]))
        if sizes[-1] == 0 or len(sizes) > batch * (batch + 3) // 2:  # past one sample a part: it would never stop
            raise SplitPastOneSample(f"step_or_split called loss_fn with {sizes[-1]} samples, after {len(sizes) - 1} "
                                     f"calls on a batch of {batch}: stop splitting at one sample a part (and re-raise the "
                                     "out-of-memory error there), and free each failed attempt before the next")
        return F.cross_entropy(outputs, targets)

    x, y = split_batch(seed + 1, batch)
    meter = MemoryMeter(budget, timeline=False)
    dev = default_for(x.device)
    meter.track(net, dev)
    with meter:
        result = step_or_split(net, opt, loss_fn, x, y)
    live = meter.live(dev)
    split = result[1] if isinstance(result, tuple) and len(result) == 2 else None
    covers = isinstance(split, int) and 0 < split <= len(sizes) and sum(sizes[-split:]) == batch
    numbers = {"loss": result[0] if split is not None else result,
               "update": [p.detach() - b for p, b in zip(net.parameters(), before)]}
    facts = {"types": _types(result), "micro-batches": split, "optimizer steps": len(steps),
             "the last split covers the batch": covers}
    return numbers, facts, live


def reference_split(seed: int, batch: int, budget: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """gpulab's :func:`split_case` (only inside ``grading.by_reference``; run once per case)."""
    return _reference_split(seed, batch, budget)


@functools.lru_cache(maxsize=8)
def _reference_split(seed: int, batch: int, budget: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    return split_case(step_or_split, seed, batch, budget)


# ---- exercise 4: bf16 autocast and checkpointing --------------------------------------------------

def workload(name: str, seed: int) -> Workload:
    """The lab's workload ``name`` (``small_cnn`` or ``transformer``), weights and batch drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        return lab_workloads(default_device(), seed)[name]


def step_peak(step: Callable[..., Any], name: str, seed: int = 0) -> int:
    """Peak bytes above the weights of ``step(model, inputs, targets, loss_fn)`` on a fresh workload
    (measured in the kernel by gpulab's MemoryMeter)."""
    w = workload(name, seed)
    w.model.zero_grad(set_to_none=True)
    return peak_memory(step, w.model, w.inputs, w.targets, w.loss_fn, track=w.model)


def bf16_peak_bar(name: str, seed: int = 0) -> float:
    """The most a bf16 step's peak may be, as a share of float32's, on this device: 1.15x what gpulab's
    own bf16 step reaches here (a correct answer may keep a little more), and never above 0.95 nor
    demanded below 0.75. Measured, not calibrated on one machine: on a CPU the reference reaches
    0.60-0.63 (the bar stays 0.75); on a GPU, autocast's cache of bf16 weight copies can raise its
    share, and the bar follows it."""
    reference = step_peak(bf16_step, name, seed) / step_peak(fp32_step, name, seed)
    return min(0.95, max(0.75, 1.15 * reference))


def _direction(grads: list[torch.Tensor | None], params: list[torch.Tensor]) -> torch.Tensor:
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).detach().float().flatten()
                      for g, p in zip(grads, params)])
    return flat / flat.norm().clamp_min(1e-30)


def savings_step(step: Callable[..., Any], name: str, seed: int) -> dict[str, Any]:
    """One ``step(model, inputs, targets, loss_fn)`` (a bf16 or float32 step) on a seeded workload.

    Returns:
        ``{"loss": what it returned, "dtypes": {the logits', the loss's, the gradients'}, "direction":
        every gradient as one unit vector}``: the direction of float32 and of bf16 gradients differ
        by well under 0.01 per element on these workloads.
    """
    w = workload(name, seed)
    seen: dict[str, Any] = {}

    def logits(module: nn.Module, args: Any, out: torch.Tensor) -> None:  # a hook that returns None changes nothing
        seen.setdefault("logits", out.dtype)

    hook = w.model.register_forward_hook(logits)

    def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = w.loss_fn(outputs, targets)
        seen.setdefault("loss", loss.dtype)
        return loss

    w.model.zero_grad(set_to_none=True)
    try:
        loss = step(w.model, w.inputs, w.targets, loss_fn)
    finally:
        hook.remove()
    params = list(w.model.parameters())
    grads = [p.grad for p in params]
    dtypes = {"logits": seen.get("logits"), "loss": seen.get("loss"),
              "gradients": sorted({"none" if g is None else str(g.dtype) for g in grads})}
    return {"loss": loss, "dtypes": dtypes, "direction": _direction(grads, params)}


def fp32_direction(name: str, seed: int) -> torch.Tensor:
    """The float32 step's gradients as one unit vector (the expected direction of a bf16 step's)."""
    return savings_step(fp32_step, name, seed)["direction"]


def checkpoint_case(checkpointed_forward: Callable[..., Any], name: str, seed: int, segments: int) -> dict[str, Any]:
    """Output and gradients of a training step through ``checkpointed_forward(blocks, inputs, segments)``."""
    w = workload(name, seed)
    out = checkpointed_forward(w.blocks, w.inputs, segments)
    w.loss_fn(out, w.targets).backward()
    return {"output": out, "gradients": [p.grad for p in w.model.parameters()]}


def plain_case(name: str, seed: int) -> dict[str, Any]:
    """The same step through the plain model: the expected output and gradients of :func:`checkpoint_case`."""
    w = workload(name, seed)
    out = w.model(w.inputs)
    w.loss_fn(out, w.targets).backward()
    return {"output": out, "gradients": [p.grad for p in w.model.parameters()]}


class _Probe(nn.Module):
    """A block that notes each time it runs: a checkpointed block runs twice (forward, then in backward)."""

    def __init__(self, i: int, calls: list[int]) -> None:
        super().__init__()
        self.i, self.calls, self.lin = i, calls, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append(self.i)
        return torch.tanh(self.lin(x))


def recomputed(checkpointed_forward: Callable[..., Any], num_blocks: int, seed: int) -> dict[str, list[int]]:
    """For every ``segments`` from 1 to ``num_blocks``: the blocks that ``checkpointed_forward`` ran
    again in backward (which says how it split them, and which runs it checkpointed)."""
    calls: list[int] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = [_Probe(i, calls) for i in range(num_blocks)]
        x = torch.randn(3, 4, requires_grad=True)
    out = {}
    for k in range(1, num_blocks + 1):
        calls.clear()
        checkpointed_forward(blocks, x, k).sum().backward()
        out[f"{num_blocks} blocks, segments={k}"] = sorted(i for i in range(num_blocks) if calls.count(i) == 2)
    return out


# ---- exercise 5: shapes -------------------------------------------------------------------------

def flatten_features(image_size: int) -> int:
    """What section 10's ``small_convnet`` hands its Linear layer for ``image_size`` images: the
    width of its Flatten output (its convolution part, run on zeros)."""
    convs = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
    with torch.no_grad():
        return int(convs(torch.zeros(1, 3, image_size, image_size)).shape[1])
