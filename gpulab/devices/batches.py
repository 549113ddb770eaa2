"""Nested batches: apply a function to every tensor, list them, count the bytes a copy moves.

A batch is whatever a DataLoader yields (or a model takes and returns): a tensor, or dicts / lists /
tuples / namedtuples of tensors and other values (ids, file names), which are left alone. This is
the one walker over such trees in gpulab: the accelerators' copies, DataParallel's scatter, the
memory summary and the loader's batch counting all use it (torch's own is the private
``torch.utils._pytree``).

    .venv/bin/python -m pytest tests/devices/test_batches.py
"""

from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["tree_map", "tree_leaves", "tree_nbytes", "tree_tensors"]


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


def tree_leaves(batch: Any, path: str = "batch") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a nested batch, in order, with a readable path for error messages.

    Example: ``tree_leaves((x, {"mask": m}))`` is ``[("batch[0]", x), ("batch[1]['mask']", m)]``.
    """
    if isinstance(batch, torch.Tensor):
        return [(path, batch)]
    if isinstance(batch, dict):
        items = [(f"{path}[{k!r}]", v) for k, v in batch.items()]
    elif isinstance(batch, (list, tuple)):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(batch)]
    else:
        return []
    leaves = []
    for item_path, value in items:
        leaves.extend(tree_leaves(value, item_path))
    return leaves


def tree_tensors(batch: Any) -> list[torch.Tensor]:
    """Every tensor in a nested batch, in order."""
    return [t for _, t in tree_leaves(batch)]


def tree_nbytes(batch: Any) -> int:
    """Bytes of all tensors in a nested batch (what a host-to-device copy moves)."""
    return sum(t.numel() * t.element_size() for t in tree_tensors(batch))
