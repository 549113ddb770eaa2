"""Scatter a batch over logical devices, and gather the replicas' outputs back: the two ends of
DataParallel, for whole batches (tensors inside tuples, lists and dicts).

:mod:`gpulab.parallel.comm` moves single tensors; this module walks the structures a model takes
and returns, as ``torch/nn/parallel/scatter_gather.py`` does:

- :func:`scatter` splits every tensor of a batch along ``dim`` (``torch.chunk`` semantics, so 5
  rows over 4 devices give 3 pieces of 2, 2, 1) and sends piece ``i`` to ``devices[i]``. Anything
  that is not a tensor (a flag, a string) is passed by reference to every piece.
- :func:`scatter_kwargs` does it for a call's ``(args, kwargs)`` together, so both are split the
  same way.
- :func:`gather` concatenates the replicas' outputs on one device, keeping their structure (a
  tensor, a tuple, a namedtuple, a dict of tensors).

Unlike torch, a batch whose tensors have different lengths along ``dim``, or no rows at all, is an
error here: torch silently drops the extra pieces (``zip`` stops at the shortest), which loses data.

Example::

    devices = logical_devices(4)
    pieces = scatter((x, {"mask": m}), devices)   # [(x0, {"mask": m0}), (x1, {...}), ...]
    out = gather([r(*p) for r, p in zip(replicas, pieces)], devices[0])
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from gpulab.devices.batches import tree_leaves
from gpulab.devices.logical import LogicalDevice
from gpulab.devices.validate import check_device, check_devices
from gpulab.parallel import comm

__all__ = ["scatter", "scatter_kwargs", "gather", "batch_rows"]


def _is_namedtuple(obj: Any) -> bool:
    return isinstance(obj, tuple) and hasattr(obj, "_fields")


def batch_rows(obj: Any, dim: int = 0, what: str = "batch") -> int | None:
    """The common length along ``dim`` of every tensor in a nested batch; None if it holds none.

    Raises:
        ValueError: if a tensor has no ``dim`` (a 0-d tensor), the lengths differ, or they are 0.
    """
    leaves = tree_leaves(obj, what)
    if not leaves:
        return None
    rows = None
    for path, t in leaves:
        if t.dim() == 0 or not -t.dim() <= dim < t.dim():
            raise ValueError(f"{path} has shape {tuple(t.shape)}, so it cannot be split along dim={dim}: give it "
                             "a batch dimension, or pass a constant as a Python number instead of a tensor")
        n = t.size(dim)
        if rows is None:
            rows, first = n, path
        elif n != rows:
            raise ValueError(f"{path} has {n} rows along dim={dim} but {first} has {rows}: every tensor of a "
                             "batch is split the same way, so they need the same batch size (pass tensors that "
                             "are not per-sample as non-tensor arguments, or repeat them per sample)")
    if rows == 0:
        raise ValueError(f"the {what} has 0 rows along dim={dim}: there is nothing to scatter over the devices; "
                         "skip empty batches (DataLoader(..., drop_last=True) avoids a short last batch)")
    return rows


def _split(obj: Any, devices: Sequence[LogicalDevice], dim: int, n: int) -> list[Any]:
    """``obj`` as ``n`` pieces, tensors split by ``comm.scatter`` (already checked: same rows)."""
    if isinstance(obj, torch.Tensor):
        return comm.scatter(obj, devices, dim)
    if isinstance(obj, (list, tuple)):
        if len(obj) == 0:
            return [type(obj)() for _ in range(n)]
        columns = zip(*(_split(v, devices, dim, n) for v in obj))  # piece i of every item
        if _is_namedtuple(obj):
            return [type(obj)(*col) for col in columns]
        return [type(obj)(col) for col in columns]
    if isinstance(obj, dict):
        if len(obj) == 0:
            return [type(obj)() for _ in range(n)]
        keys = list(obj)
        columns = zip(*(_split(obj[k], devices, dim, n) for k in keys))
        return [type(obj)(zip(keys, col)) for col in columns]
    return [obj for _ in range(n)]  # not per-sample: every replica gets the same object


def scatter(inputs: Any, devices: Sequence[LogicalDevice], dim: int = 0) -> list[Any]:
    """Split a batch into one piece per device.

    Args:
        inputs: a tensor, or tuples / lists / dicts of tensors (nested); other objects are shared.
        devices: the logical devices (:func:`gpulab.devices.logical_devices`).
        dim: the batch dimension.

    Returns:
        A list of pieces with the structure of ``inputs``, piece ``i`` on ``devices[i]``. It has
        ``len(x.chunk(len(devices), dim))`` entries: fewer than ``devices`` when the batch is
        small or splits unevenly (5 rows over 4 devices give 3 pieces). A batch without tensors
        is repeated once per device.

    Raises:
        ValueError: for a batch with 0 rows, tensors of different lengths, or a 0-d tensor.
        TypeError: if ``devices`` are not LogicalDevices (``"cuda:1"``, ints, ``torch.device``).
    """
    devices = check_devices(devices)
    rows = batch_rows(inputs, dim)
    if rows is None:
        return [inputs for _ in devices]
    n = len(range(0, rows, -(-rows // len(devices))))  # how many pieces torch.chunk makes
    return _split(inputs, devices, dim, n)


def scatter_kwargs(inputs: tuple, kwargs: dict | None, devices: Sequence[LogicalDevice],
                   dim: int = 0) -> tuple[list[tuple], list[dict]]:
    """Scatter a call's positional and keyword arguments together (one split for both).

    Returns:
        ``(inputs_per_device, kwargs_per_device)``, two lists of the same length.

    Raises:
        ValueError: as :func:`scatter`, also when the arguments hold no tensor at all (there is
            no batch to split).
    """
    kwargs = kwargs or {}
    if batch_rows((inputs, kwargs), dim, "batch (the call's arguments)") is None:
        raise ValueError("DataParallel splits the batch along dim 0, but the arguments hold no tensor: "
                         "pass the batch as a tensor (or tuples/dicts of tensors)")
    pieces = scatter((tuple(inputs), kwargs), devices, dim)
    return [p[0] for p in pieces], [p[1] for p in pieces]


def gather(outputs: Sequence[Any], device: LogicalDevice, dim: int = 0) -> Any:
    """Concatenate the replicas' outputs on ``device``, keeping their structure.

    Args:
        outputs: one output per replica, each a tensor or tuples / namedtuples / lists / dicts of
            tensors (the same structure for every replica). ``None`` stays ``None``; any other
            object becomes a list with each replica's value.
        device: where the result goes (DataParallel's ``output_device``).
        dim: the batch dimension. 0-d tensors (a loss per replica) become a vector.

    Returns:
        The gathered output, differentiable: backward sends each piece's gradient home.

    Raises:
        ValueError: for an empty list, or replicas whose outputs differ in structure.
    """
    device = check_device(device, "device")
    if isinstance(outputs, (torch.Tensor, dict)) or not isinstance(outputs, Sequence) or not outputs:
        raise ValueError(f"gather takes a non-empty list with one output per replica, got {type(outputs).__name__}")
    return _gather(list(outputs), device, dim, "output")


def _gather(outs: list[Any], device: LogicalDevice, dim: int, path: str) -> Any:
    first = outs[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(o, torch.Tensor) for o in outs):
            raise ValueError(f"{path} is a tensor in replica 0 but not in every replica")
        return comm.gather(outs, device, dim)
    if first is None:
        return None
    if isinstance(first, dict):
        for i, o in enumerate(outs):
            if not isinstance(o, dict) or set(o) != set(first):
                raise ValueError(f"{path}: replica {i} returned keys {sorted(o) if isinstance(o, dict) else o!r} "
                                 f"but replica 0 returned {sorted(first)}; every replica must return the same keys")
        return type(first)((k, _gather([o[k] for o in outs], device, dim, f"{path}[{k!r}]")) for k in first)
    if isinstance(first, (list, tuple)):
        for i, o in enumerate(outs):
            if not isinstance(o, (list, tuple)) or len(o) != len(first):
                raise ValueError(f"{path}: replica {i} returned {type(o).__name__} of length "
                                 f"{len(o) if isinstance(o, (list, tuple)) else '-'} but replica 0 returned "
                                 f"{type(first).__name__} of length {len(first)}")
        items = [_gather(list(col), device, dim, f"{path}[{j}]") for j, col in enumerate(zip(*outs))]
        return type(first)(*items) if _is_namedtuple(first) else type(first)(items)
    return list(outs)  # numbers, strings: one per replica
