"""Bytes per rank of a tensor-parallel block: weights, gradients, activations (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_memory.py

Why split one layer at all: a single ``Linear(h, 4h)`` of a model with ``h = 16384`` is 1 G
parameters, 4 GiB in float32 before its gradient and optimizer state. Tensor parallelism divides
the weight matrices, their gradients and the hidden activations by N; the block's input and
output (and the row layer's bias) stay whole on every rank, which is what sequence parallelism
then shards (:mod:`gpulab.parallel.tp.sequence`).

Measured from the tensors themselves: :func:`parameter_bytes` and :func:`grad_bytes` add up
``numel * element_size``; :func:`saved_activation_bytes` counts the storages autograd saves for
backward (``torch.autograd.graph.saved_tensors_hooks``), each once, parameters excluded.
:func:`analytic_mlp_bytes` is the same count on paper, for :func:`~gpulab.parallel.tp.mlp.feed_forward`.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

__all__ = ["parameter_bytes", "grad_bytes", "saved_activation_bytes", "analytic_mlp_bytes"]


def parameter_bytes(module: nn.Module, matrices_only: bool = False) -> int:
    """Bytes of ``module``'s parameters (``matrices_only``: the 2-D weights, no biases)."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.dim() >= 2 or not matrices_only)


def grad_bytes(module: nn.Module) -> int:
    """Bytes of the ``.grad`` tensors ``module``'s parameters hold."""
    return sum(p.grad.numel() * p.grad.element_size() for p in module.parameters() if p.grad is not None)


def saved_activation_bytes(fn: Callable[[], Any], exclude: nn.Module | None = None) -> tuple[Any, int]:
    """Run ``fn()`` and count the bytes autograd saves for backward, each storage once.

    Args:
        fn: the forward pass, e.g. ``lambda: block(x)``.
        exclude: a module whose parameters (saved by every linear) are not activations.

    Returns:
        ``(fn's result, bytes)``.
    """
    skip = {p.untyped_storage().data_ptr() for p in exclude.parameters()} if exclude is not None else set()
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


def analytic_mlp_bytes(tokens: int, hidden: int, ffn: int, world_size: int, element_size: int = 4) -> dict[str, int]:
    """What one rank of a tensor-parallel ``feed_forward(hidden, ffn)`` holds, on paper.

    Returns:
        ``weights`` (the two matrices: ``2 h ffn / N``), ``params`` (plus ``ffn/N`` of the first
        bias and all ``h`` of the second), ``grads`` (the same as ``params``), ``activations``
        (saved for backward: the input ``tokens x h``, and GELU's input and output, ``tokens x ffn/N`` each).
    """
    if ffn % world_size:
        raise ValueError(f"ffn={ffn} is not divisible by world_size={world_size}")
    local = ffn // world_size
    weights = 2 * hidden * local
    params = weights + local + hidden
    return {"weights": weights * element_size, "params": params * element_size, "grads": params * element_size,
            "activations": (tokens * hidden + 2 * tokens * local) * element_size}
