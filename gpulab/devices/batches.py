"""Nested batches: apply a function to every tensor, count the bytes a copy moves.

A batch is whatever a DataLoader yields: a tensor, or dicts / lists / tuples / namedtuples of
tensors and other values (ids, file names), which are left alone.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["tree_map", "tree_nbytes", "tree_tensors"]


def tree_map(fn: Callable[[torch.Tensor], Any], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in a nested batch (dict / list / tuple), keeping containers."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        return {k: tree_map(fn, v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        items = [tree_map(fn, v) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def tree_nbytes(batch: Any) -> int:
    """Bytes of all tensors in a nested batch (what a host-to-device copy moves)."""
    total = 0

    def add(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    tree_map(add, batch)
    return total


def tree_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in a nested batch, in order."""
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) or t, batch)
    return found
