"""Lab 08's cases for exercise 4 (bf16 autocast and activation checkpointing): the lab's two
workloads rebuilt from a seed, the peak of one step on them (gpulab's MemoryMeter, in the kernel),
and what a bf16 step or a checkpointed forward did (loss, dtypes, the gradient's direction, the
output and gradients, the blocks recomputed in backward), as plain values for the checks to send.

The test cells reach them through :mod:`gpulab.grading.lab08`, which re-exports them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from gpulab.devices import default_device
from gpulab.grading.numerics import exact_float32
from gpulab.memory.fixes.savings import Workload, fp32_step, lab_workloads, peak_memory

__all__ = ["workload", "step_peak", "savings_step", "fp32_direction", "checkpoint_case", "plain_case", "recomputed"]


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


def _direction(grads: list[torch.Tensor | None], params: list[torch.Tensor]) -> torch.Tensor:
    flat = torch.cat(
        [(g if g is not None else torch.zeros_like(p)).detach().float().flatten() for g, p in zip(grads, params)]
    )
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
    dtypes = {
        "logits": seen.get("logits"),
        "loss": seen.get("loss"),
        "gradients": sorted({"none" if g is None else str(g.dtype) for g in grads}),
    }
    return {"loss": loss, "dtypes": dtypes, "direction": _direction(grads, params)}


def fp32_direction(name: str, seed: int) -> torch.Tensor:
    """The float32 step's gradients as one unit vector (the expected direction of a bf16 step's)."""
    return savings_step(fp32_step, name, seed)["direction"]


def checkpoint_case(checkpointed_forward: Callable[..., Any], name: str, seed: int, segments: int) -> dict[str, Any]:
    """Output and gradients of a training step through ``checkpointed_forward(blocks, inputs, segments)``,
    in IEEE float32 (:func:`exact_float32`: on a GPU no TF32, deterministic cuDNN, as :func:`plain_case`)."""
    w = workload(name, seed)
    with exact_float32():
        out = checkpointed_forward(w.blocks, w.inputs, segments)
        w.loss_fn(out, w.targets).backward()
    return {"output": out, "gradients": [p.grad for p in w.model.parameters()]}


def plain_case(name: str, seed: int) -> dict[str, Any]:
    """The same step through the plain model: the expected output and gradients of :func:`checkpoint_case`."""
    w = workload(name, seed)
    with exact_float32():
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
