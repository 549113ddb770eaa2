"""Count the collectives a step makes, with their bytes, and the count to expect (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_counting.py

:class:`CollectiveCounter` is a ``TorchDispatchMode``: it sees every collective that reaches
the dispatcher, both ``torch.distributed.all_reduce`` (``c10d.allreduce_``) and the functional
collectives DTensor uses (``_c10d_functional.all_reduce``), however the caller imported them,
in forward and in backward (on the CPU, autograd runs backward in the calling thread). Each
record is the *logical* size: the bytes of the full tensor the collective produces or reduces.
What crosses the wire is more (a ring all-reduce sends ``2 (N-1)/N`` of it from every rank:
:mod:`gpulab.parallel.tp.cost`).

:func:`analytic_allreduces` is the count to compare with: Megatron's MLP or attention block
makes one all-reduce of the ``(tokens, hidden)`` activation forward and one of its gradient
backward, whatever N is.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["CollectiveCounter", "analytic_allreduces", "BLOCKS"]

BLOCKS = {"mlp": 1, "attention": 1, "transformer": 2}  # row-parallel outputs per block: one g and one f each


def _bytes(x: Any) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_bytes(t) for t in x)
    return 0


def _classify(name: str, args: tuple) -> tuple[str, int] | None:
    """(kind, logical bytes) of one dispatched op, or None when it is not a collective."""
    op = name.split(".")[1] if "." in name else name
    functional = name.startswith("_c10d_functional.")
    if not (functional or name.startswith("c10d.")) or op in ("wait_tensor", "_wrap_tensor_autograd"):
        return None
    if "allreduce" in op or op == "all_reduce":
        return "all_reduce", _bytes(args[0])
    if op.startswith("allgather") or op.startswith("_allgather") or op.startswith("all_gather"):
        return "all_gather", _bytes(args[0]) * (args[1] if functional else 1)  # the gathered, full tensor
    if "reduce_scatter" in op:
        return "reduce_scatter", _bytes(args[0] if functional else args[1])  # the full tensor reduced
    if "broadcast" in op:
        return "broadcast", _bytes(args[0])
    return None


class CollectiveCounter(TorchDispatchMode):
    """Count collectives and their logical bytes while the block runs.

    Usage::

        with CollectiveCounter() as comm:
            model(x).sum().backward()
        comm.calls["all_reduce"], comm.bytes["all_reduce"], comm.log   # [(kind, bytes), ...] in order

    Warning:
        Dispatch modes are thread-local: collectives made in another thread (a DataLoader
        worker, CUDA's autograd threads) are not seen. On the CPU, and with ``loss.backward()``
        called inside the block, forward and backward are both counted.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()
        self.log: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        seen = _classify(str(func), args)
        if seen is not None:
            kind, size = seen
            self.calls[kind] += 1
            self.bytes[kind] += size
            self.log.append(seen)
        return func(*args, **(kwargs or {}))

    def summary(self) -> dict[str, dict[str, int]]:
        """``{kind: {"calls": n, "bytes": b}}``: plain values, to send back from a rank."""
        return {k: {"calls": self.calls[k], "bytes": self.bytes[k]} for k in sorted(self.calls)}


def analytic_allreduces(tokens: int, hidden: int, block: str = "mlp", *, element_size: int = 4,
                        input_requires_grad: bool = True) -> dict[str, int]:
    """All-reduces per training step (forward and backward) of a tensor-parallel block.

    Args:
        tokens: batch size times sequence length: the rows of the activation.
        hidden: the block's input/output features.
        block: ``"mlp"``, ``"attention"`` or ``"transformer"`` (attention then MLP).
        element_size: bytes per element (4: float32).
        input_requires_grad: False when nothing upstream needs the input's gradient: ``f``'s
            backward all-reduce is then skipped, once per block.

    Returns:
        ``{"calls": n, "bytes": b}``: b is the sum of the full tensors' sizes, the same on every rank.
    """
    if block not in BLOCKS:
        raise ValueError(f"block={block!r} is not one of {sorted(BLOCKS)}")
    if tokens < 1 or hidden < 1:
        raise ValueError(f"tokens and hidden must be >= 1, got tokens={tokens}, hidden={hidden}")
    per_block = 2 if input_requires_grad else 1  # g forward; f backward
    calls = BLOCKS[block] * per_block
    if block == "transformer" and not input_requires_grad:
        calls = 3  # the MLP's input comes from attention, which needs its gradient
    return {"calls": calls, "bytes": calls * tokens * hidden * element_size}
