"""Lab 08's cases for exercise 3 (``step_or_split``): a small float64 conv net and batches drawn from
a seed, budgets that force a given number of micro-batches, and what one step under such a budget did
(the loss and each parameter's change, the split, the optimizer steps, the bytes live after), as
plain values for the checks to send. The test cells reach them through :mod:`gpulab.grading.lab08`,
which re-exports them.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import MemoryMeter, default_device
from gpulab.devices.registry import default_for
from gpulab.memory.fixes.retry import step_or_split

__all__ = [
    "split_net",
    "split_batch",
    "split_budget",
    "split_case",
    "SplitPastOneSample",
    "reference_split",
    "types_of",
]


def types_of(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return [type(result).__name__, [type(v).__name__ for v in result]]
    return type(result).__name__


def split_net(seed: int) -> nn.Module:
    """A small conv net in float64, weights drawn from ``seed``, on the default device.

    No BatchNorm: its samples do not interact, so a step in micro-batches equals the whole batch's.
    Its activations (about 66 kB a sample) outweigh its 7 kB of weights, so what fits depends on the
    micro-batch. float64, so that no GPU rounds its convolutions to TF32 (cuDNN's default): the split
    and the whole step then agree to about 1e-15, on any device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )
    return net.to(default_device(), torch.float64)


def split_batch(seed: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` RGB 16x16 images (float64) and labels (10 classes), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    device = default_device()
    return (
        torch.randn(batch, 3, 16, 16, generator=g, dtype=torch.float64).to(device),
        torch.randint(0, 10, (batch,), generator=g).to(device),
    )


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


def split_case(
    step_or_split: Callable[..., Any], seed: int, batch: int, budget: int | None
) -> tuple[dict[str, Any], dict[str, Any], int]:
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
            raise SplitPastOneSample(
                f"step_or_split called loss_fn with {sizes[-1]} samples, after {len(sizes) - 1} "
                f"calls on a batch of {batch}: stop splitting at one sample a part (and re-raise the "
                "out-of-memory error there), and free each failed attempt before the next"
            )
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
    numbers = {
        "loss": result[0] if split is not None else result,
        "update": [p.detach() - b for p, b in zip(net.parameters(), before)],
    }
    facts = {
        "types": types_of(result),
        "micro-batches": split,
        "optimizer steps": len(steps),
        "the last split covers the batch": covers,
    }
    return numbers, facts, live


def reference_split(seed: int, batch: int, budget: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """gpulab's :func:`split_case` (for a visible test's ``grading.interactive_expected``; run once per case)."""
    return _reference_split(seed, batch, budget)


@functools.lru_cache(maxsize=8)
def _reference_split(seed: int, batch: int, budget: int | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    return split_case(step_or_split, seed, batch, budget)
