"""The balanced criterion: compute the loss on every device, so that only scalars cross (lab 05).

DataParallel gathers every output on one device, which then holds the whole batch's logits, the
loss's temporaries and their gradients; its memory caps the batch size for all. The fix, from Hang
Zhang's PyTorch-Encoding (``encoding/parallel.py``), makes the loss parallel too:
:class:`DataParallelModel` returns the per-device outputs without the gather, and
:class:`DataParallelCriterion` computes the loss on each device and gathers only the scalars.
Why, and how this differs from PyTorch-Encoding: the comment below the imports.

    model = DataParallelModel(LargeVocabHead(), devices)
    criterion = DataParallelCriterion(nn.CrossEntropyLoss(), devices)
    loss = criterion(model(x), y)     # y is scattered like x was; only 4 scalars are gathered
    loss.backward()

    .venv/bin/python -m pytest tests/parallel/dp/test_balanced.py
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

import torch
from torch import nn

from gpulab.devices.batches import tree_leaves
from gpulab.devices.logical import LogicalDevice
from gpulab.devices.validate import check_devices
from gpulab.parallel import comm
from gpulab.parallel.dp.data_parallel import DataParallel
from gpulab.parallel.dp.parallel_apply import parallel_apply
from gpulab.parallel.dp.replicate import check_module_on, replicate

# Why DataParallel is unbalanced: it gathers every output on one device only because the loss
# function wants them in one place. With a large output (a 30,000-word vocabulary head), that device
# then holds the whole batch's logits, the loss's temporaries and their gradients, while the others
# hold a quarter of them; its memory caps the batch size for all. Moving the gather with
# ``output_device=devices[1]`` moves the problem, and it grows with the batch.
#
# The fix, from Hang Zhang's PyTorch-Encoding (``encoding/parallel.py``), is to make the loss
# parallel too:
# - ``DataParallelModel`` is DataParallel without the gather: it returns the list of per-device
#   outputs, each left on its device.
# - ``DataParallelCriterion`` scatters the targets to match those outputs, computes the loss on
#   each device in parallel threads, and gathers only the per-device *scalars* onto ``devices[0]``,
#   where they are averaged. Backward sends each scalar's gradient back to its device.
# Every device then holds only its own piece, and the batch can grow until *each* device is full.
# Whether the bigger batch shortens training depends on the learning rate and on the task: see
# ``gpulab.parallel.dp.batch_scaling``, which measures the time to a target loss.
#
# Two things differ from PyTorch-Encoding. Its criterion called ``loss_fn(*(output + targets))``,
# so a model had to ``return (x,)``, a one-element tuple, or fail with a confusing ``TypeError``;
# here a model may return a tensor or a tuple. And the per-device losses are averaged weighted by
# their rows, so a mean-reduced loss equals the single-device loss even when the batch splits
# unevenly (PyTorch-Encoding averaged them equally, which is exact only for even splits).

__all__ = ["DataParallelModel", "DataParallelCriterion", "parallel_loss"]


class DataParallelModel(DataParallel):
    """DataParallel that leaves each replica's output on its device (no gather).

    Args:
        module: the model, on ``devices[0]``.
        devices: the logical devices.
        dim: the batch dimension.

    Returns (when called):
        A list with one output per device used (fewer than ``devices`` for a small batch), output
        ``i`` on ``devices[i]``: feed it to a :class:`DataParallelCriterion`.
    """

    def __init__(self, module: nn.Module, devices: Sequence[LogicalDevice], dim: int = 0) -> None:
        super().__init__(module, devices, output_device=None, dim=dim)

    def gather(self, outputs: list[Any], output_device: LogicalDevice) -> list[Any]:
        return list(outputs)  # the point: nothing is concatenated, nothing moves


def _as_args(output: Any) -> tuple:
    """A model output as positional arguments of the loss: a tuple is unpacked, anything else is one
    argument (so ``return x`` works; PyTorch-Encoding needed ``return (x,)``)."""
    return tuple(output) if isinstance(output, (tuple, list)) else (output,)


class DataParallelCriterion(nn.Module):
    """Compute ``loss_fn`` on each device's outputs and targets; gather and average the scalars.

    Args:
        loss_fn: a loss module (``nn.CrossEntropyLoss()``; replicated like a model, so a class
            ``weight`` buffer is broadcast) or a function (``F.cross_entropy``). It is called as
            ``loss_fn(*output_i, *targets_i)`` where ``output_i`` is device ``i``'s output (a
            tensor, or a tuple unpacked into arguments), and must return a scalar.
        devices: the logical devices, as given to :class:`DataParallelModel`.
        dim: the batch dimension of outputs and targets.
        reduction: ``"mean"`` averages the per-device losses weighted by their rows (right for a
            mean over samples); ``"sum"`` adds them (right for ``reduction="sum"`` losses).

    Returns (when called with ``(outputs, *targets)``):
        The scalar loss on ``devices[0]``.

    Raises:
        TypeError: if ``outputs`` is a single tensor (a model wrapped in DataParallel, which
            already gathered) or ``devices`` are not LogicalDevices.
        ValueError: if the targets' rows do not match the outputs', there are more outputs than
            devices, or ``loss_fn`` does not return a scalar.

    Warning:
        The weighting is by rows. A loss whose mean is over something else (``ignore_index``
        skipping some targets, class weights) is an average of per-device means, which differs a
        little from the single-device value when devices see different numbers of counted targets.
    """

    def __init__(self, loss_fn: Callable[..., torch.Tensor], devices: Sequence[LogicalDevice], dim: int = 0,
                 reduction: Literal["mean", "sum"] = "mean") -> None:
        super().__init__()
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be a loss module or function, got {type(loss_fn).__name__}")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
        self.devices = check_devices(devices)
        self.dim = dim
        self.reduction = reduction
        if isinstance(loss_fn, nn.Module):
            check_module_on(loss_fn, self.devices[0])
        self.loss_fn = loss_fn  # a module is registered (state_dict sees a class-weight buffer)

    @property
    def output_device(self) -> LogicalDevice:
        """Where the loss ends up: ``devices[0]``."""
        return self.devices[0]

    def _rows(self, outputs: Any) -> list[int]:
        if isinstance(outputs, torch.Tensor):
            raise TypeError(
                "DataParallelCriterion takes the list of per-device outputs that DataParallelModel returns, but got "
                f"one tensor of shape {tuple(outputs.shape)}: wrap the model in DataParallelModel, not DataParallel "
                "(DataParallel has already gathered every output onto one device, the imbalance this avoids)")
        if not isinstance(outputs, (list, tuple)) or not outputs:
            raise TypeError(f"outputs must be the non-empty list DataParallelModel returns, got {type(outputs).__name__}")
        if len(outputs) > len(self.devices):
            raise ValueError(f"{len(outputs)} outputs but only {len(self.devices)} devices: build the criterion "
                             "with the same devices as the DataParallelModel")
        rows = []
        for i, out in enumerate(outputs):
            leaves = tree_leaves(out, f"outputs[{i}]")
            if not leaves or leaves[0][1].dim() == 0:
                raise ValueError(f"outputs[{i}] holds no batched tensor; the criterion splits the targets to "
                                 "match each device's output rows")
            rows.append(leaves[0][1].size(self.dim))
        return rows

    def _scatter_targets(self, targets: tuple, rows: list[int], devices: list[LogicalDevice]) -> list[tuple]:
        """Each target split into the outputs' row counts, piece ``i`` sent to ``devices[i]``."""
        total = sum(rows)
        per_device: list[list[Any]] = [[] for _ in rows]
        for k, t in enumerate(targets):
            if not isinstance(t, torch.Tensor):
                for pieces in per_device:
                    pieces.append(t)  # a constant: every device gets it
                continue
            n = t.size(self.dim) if t.dim() > self.dim else None
            if n != total:
                split = ", ".join(str(r) for r in rows)
                raise ValueError(
                    f"targets[{k}] has shape {tuple(t.shape)}, {n} rows along dim={self.dim}, but the outputs have "
                    f"{total} rows ({split} on {len(rows)} devices): pass the targets of the batch the model saw")
            # (N, ...) -> one piece of (rows[i], ...) per device, along self.dim
            for i, (piece, dev) in enumerate(zip(t.split(rows, self.dim), devices)):
                per_device[i].append(comm.to(piece, dev))
        return [tuple(p) for p in per_device]

    def forward(self, outputs: Sequence[Any], *targets: Any, **kwargs: Any) -> torch.Tensor:
        rows = self._rows(outputs)
        devices = self.devices[:len(outputs)]
        targets_per_device = self._scatter_targets(targets, rows, devices)
        loss_fn = self.loss_fn
        losses_fns = replicate(loss_fn, devices) if isinstance(loss_fn, nn.Module) else [loss_fn] * len(devices)
        args = [_as_args(out) + tgt for out, tgt in zip(outputs, targets_per_device)]
        losses = parallel_apply(losses_fns, args, devices, [dict(kwargs) for _ in devices])
        for i, loss in enumerate(losses):
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                raise ValueError(f"loss_fn returned {shape} on {devices[i]}; the criterion gathers one scalar per "
                                 "device: use a loss with reduction='mean' or 'sum'")
        # The only transfer of the step: len(devices) scalars to devices[0].
        per_device = comm.gather([loss.reshape(()) for loss in losses], self.output_device)  # (n,)
        if self.reduction == "sum":
            return per_device.sum()  # (n,) -> ()
        weights = torch.tensor([r / sum(rows) for r in rows], dtype=per_device.dtype, device=per_device.device)
        return (per_device * weights).sum()  # (n,) * (n,) -> ()

    def extra_repr(self) -> str:
        return f"devices={[str(d) for d in self.devices]}, reduction={self.reduction!r}"


def parallel_loss(outputs: Sequence[Any], targets: torch.Tensor, loss_fn: Callable[..., torch.Tensor],
                  devices: Sequence[LogicalDevice]) -> torch.Tensor:
    """The batch's mean loss, computed on the device of each output (lab 05's exercise 1, as a function).

    ``DataParallelCriterion(loss_fn, devices)(outputs, targets)``: ``outputs`` is the list a
    :class:`DataParallelModel` returns, ``targets`` the whole batch's targets on ``devices[0]``;
    only one scalar per device reaches ``devices[0]``.

    Raises:
        ValueError: when the targets' rows differ from the outputs' (the message gives both).
    """
    return DataParallelCriterion(loss_fn, devices)(outputs, targets)
