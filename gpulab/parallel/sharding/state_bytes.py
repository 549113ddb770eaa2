"""How many bytes of training state one rank holds, counted exactly from its tensors (lab 09).

A rank's training state is three things: the **parameters**, their **gradients** and the
**optimizer state** (AdamW: ``exp_avg`` and ``exp_avg_sq``, two tensors the size of each
parameter, plus a scalar ``step``). :func:`state_bytes` adds up ``numel * element_size`` of the
tensors this rank really holds:

- DDP and ZeRO-1 hold full parameters and gradients; ZeRO-1's optimizer ``state`` covers the
  owned share only;
- FSDP2 (``torch.distributed.fsdp.fully_shard``) turns parameters, gradients and AdamW's state into
  ``DTensor``s: only ``DTensor.to_local()``, this rank's shard, is in its memory.

Tensors shared between two places (tied weights, a gradient that is a view of a bucket) are
counted once. On a GPU, :func:`cuda_peak_bytes` adds what the CUDA caching allocator saw
(``torch.cuda.max_memory_allocated``), which also includes activations and communication buffers.

:func:`bytes_per_parameter` is the arithmetic of the ZeRO paper (Rajbhandari et al., SC 2020,
section 3): with mixed-precision Adam a rank holds 2 + 2 + 12 = 16 bytes per parameter; sharding
the optimizer state (stage 1) leaves 4 + 12/N, the gradients too (stage 2) 2 + 14/N, everything
(stage 3, FSDP) 16/N. In fp32 training (this lab on a CPU) the 16 bytes are 4 + 4 + 8.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable

import torch
from torch import nn

__all__ = ["StateBytes", "tensor_bytes", "state_bytes", "optimizer_state_bytes", "bytes_per_parameter",
           "cuda_peak_bytes", "FP32_ADAM", "MIXED_PRECISION_ADAM"]

FP32_ADAM = (4, 4, 8)  # bytes per parameter: fp32 weight, fp32 gradient, exp_avg + exp_avg_sq
MIXED_PRECISION_ADAM = (2, 2, 12)  # fp16 weight and gradient; fp32 master weight + exp_avg + exp_avg_sq


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the shard of a DTensor, ``t`` itself otherwise."""
    to_local = getattr(t, "to_local", None)  # DTensor, without importing torch.distributed.tensor here
    return to_local() if callable(to_local) else t


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes held by ``tensors`` on this rank (DTensors: their local shard), each storage view once.

    Non-tensors (None, ints, a ``step`` kept as a Python number) are skipped.
    """
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        t = _local(t)
        key = (t.data_ptr(), t.storage_offset(), tuple(t.shape)) if t.numel() else (id(t), 0, ())
        if key in seen:  # the same tensor reached twice (tied weights)
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimizer's per-parameter state on this rank.

    Works for torch optimizers, :class:`~gpulab.parallel.ShardedOptimizer` (its ``state`` is the
    owned share's) and torch's ``ZeroRedundancyOptimizer`` (whose state lives in ``.optim``).
    """
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer keeps its local optimizer there
    state = inner.state if isinstance(inner, torch.optim.Optimizer) else optimizer.state
    return tensor_bytes(v for s in state.values() for v in s.values())


@dataclass
class StateBytes:
    """Bytes one rank holds: parameters, gradients, optimizer state (and the CUDA peak, on a GPU)."""

    params: int
    grads: int
    optimizer_state: int
    num_params: int  # elements in the *whole* model (to express the bytes per parameter)
    cuda_peak: int | None = None

    @property
    def total(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.params + self.grads + self.optimizer_state

    def per_parameter(self) -> dict[str, float]:
        """Each part divided by the model's parameter count (e.g. ``{"params": 4.0, ...}``)."""
        n = max(self.num_params, 1)
        return {"params": self.params / n, "grads": self.grads / n, "optimizer_state": self.optimizer_state / n,
                "total": self.total / n}

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total}


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                device: torch.device | str | None = None) -> StateBytes:
    """Count the bytes of training state this rank holds, from its tensors.

    Args:
        model: this rank's model (a DDP/FSDP2 wrapper is fine: its parameters are the model's).
        optimizer: its optimizer (None: no optimizer state).
        device: where it trains; on a CUDA device ``cuda_peak`` is ``torch.cuda.max_memory_allocated``.

    Returns:
        A :class:`StateBytes`. Gradients that are None count zero (count after backward, before
        ``zero_grad``, to see them).
    """
    params = list(dict.fromkeys(model.parameters()))  # tied weights once
    device = torch.device(device) if device is not None else None
    return StateBytes(
        params=tensor_bytes(params),
        grads=tensor_bytes(p.grad for p in params),
        optimizer_state=optimizer_state_bytes(optimizer) if optimizer is not None else 0,
        num_params=sum(p.numel() for p in params),  # a DTensor's numel() is the global (unsharded) size
        cuda_peak=cuda_peak_bytes(device) if device is not None and device.type == "cuda" else None,
    )


def cuda_peak_bytes(device: torch.device | str) -> int:
    """``torch.cuda.max_memory_allocated(device)``: the allocator's peak since the last reset.

    Reset it with ``torch.cuda.reset_peak_memory_stats(device)`` before the steps you measure.
    """
    return int(torch.cuda.max_memory_allocated(torch.device(device)))


def bytes_per_parameter(world_size: int, stage: int, precision: tuple[int, int, int] = MIXED_PRECISION_ADAM) -> float:
    """Bytes of training state per parameter on each rank, by ZeRO stage (the ZeRO paper's arithmetic).

    Args:
        world_size: N, the number of ranks sharing the state.
        stage: 0 = DDP (nothing sharded), 1 = optimizer state sharded (ZeRO-1), 2 = gradients too
            (ZeRO-2), 3 = parameters too (ZeRO-3, FSDP).
        precision: bytes per parameter of (weights, gradients, optimizer state):
            :data:`MIXED_PRECISION_ADAM` (2, 2, 12) as in the paper, or :data:`FP32_ADAM` (4, 4, 8).

    Returns:
        For mixed-precision Adam: 16, 4 + 12/N, 2 + 14/N, 16/N.

    Raises:
        ValueError: for a stage outside 0..3 or world_size < 1.
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3 (FSDP), got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    weights, grads, state = precision
    n = world_size
    return (weights / (n if stage >= 3 else 1) + grads / (n if stage >= 2 else 1) + state / (n if stage >= 1 else 1))
