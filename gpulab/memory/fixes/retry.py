"""step_or_split: a training step that survives out-of-memory by splitting the batch (lab 08's exercise 3).

When a step runs out of memory, :func:`step_or_split` drops the partial gradients, frees what the
failed attempt held, and runs the *same* batch again in one more micro-batch (gradient
accumulation, which leaves the training unchanged: the comment below the imports), so the split
it reports is the fewest that fit. Out-of-memory counts as the allocator's
``torch.OutOfMemoryError`` and as cuBLAS/cuDNN's plain ``RuntimeError``
(:func:`gpulab.memory.batch_size.is_out_of_memory`).

    for inputs, targets in loader:
        loss, micro_batches = step_or_split(model, optimizer, nn.CrossEntropyLoss(), inputs, targets)

    .venv/bin/python -m pytest tests/memory/fixes/test_retry.py
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from gpulab.memory.batch_size import free_memory, is_out_of_memory

# Gradient accumulation computes the gradient of a batch of B samples in ``k`` micro-batches:
# each micro-batch's loss is scaled by its share of the batch (``b_i / B`` for a mean loss) and
# ``backward`` adds its gradient into ``.grad``; one ``optimizer.step()`` follows. The sum is the
# full batch's gradient (up to float rounding), so the *effective* batch, and therefore the
# training, is the same; only the peak memory of activations drops, by about ``k``. (Hugging Face
# Accelerate's ``find_executable_batch_size`` shrinks the batch instead, which changes the
# training; this keeps it.)

__all__ = ["step_or_split"]


def _check_parts(model: Any, optimizer: Any, loss_fn: Any, reduction: str | None) -> str:
    """How ``loss_fn`` combines samples ("mean" or "sum"), once the step's parts are checked."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not callable(loss_fn):
        raise TypeError("loss_fn must be callable as loss_fn(outputs, targets)")
    reduction = reduction or getattr(loss_fn, "reduction", "mean")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum' (how loss_fn combines the samples of a batch), got "
                         f"{reduction!r}; a loss with reduction='none' must be reduced before backward")
    return reduction


def _accumulate(model: nn.Module, loss_fn: Callable, inputs: torch.Tensor, targets: torch.Tensor,
                micro_batches: int, reduction: str) -> float:
    """Forward and backward in chunks, gradients added into ``.grad``; the batch's loss."""
    batch = inputs.shape[0]
    total = torch.zeros((), device=inputs.device)
    # (B, ...) -> micro_batches pieces of (about B / micro_batches, ...) rows, sizes differing by one at most
    for x, y in zip(torch.tensor_split(inputs, micro_batches), torch.tensor_split(targets, micro_batches)):
        if x.shape[0] == 0:
            continue
        loss = loss_fn(model(x), y)
        if reduction == "mean":
            loss = loss * (x.shape[0] / batch)  # its share of the batch mean
        loss.backward()  # adds into .grad; this chunk's saved activations are freed here
        total += loss.detach()  # no graph kept; one .item() (a host sync) at the end
        del loss  # so the next chunk's forward does not overlap this chunk's outputs
    return float(total.item())



def _check_batch(inputs: Any, targets: Any) -> int:
    """The batch size of ``(inputs, targets)``, or a clear error."""
    if not isinstance(inputs, torch.Tensor) or not isinstance(targets, torch.Tensor):
        raise TypeError("call the step with (inputs, targets) tensors whose dimension 0 is the batch")
    batch = inputs.shape[0]
    if batch == 0 or targets.shape[0] != batch:
        raise ValueError(f"inputs and targets must hold the same non-zero number of samples, got "
                         f"{tuple(inputs.shape)} and {tuple(targets.shape)}")
    return batch


def _give_up(batch: int) -> Callable[[str], BaseException]:
    """The error to raise when even one sample per micro-batch ran out of memory."""
    return lambda message: torch.OutOfMemoryError(
        f"out of memory even with the batch of {batch} split into {batch} micro-batches (one sample "
        f"each): {message}. What stays between steps (the model, its gradients, the optimizer state) "
        "may not fit: a smaller model, or a bigger budget/GPU")


def _attempt(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, inputs: torch.Tensor,
             targets: torch.Tensor, k: int, reduction: str,
             give_up: Callable[[str], BaseException] | None) -> tuple[float | None, str]:
    """The batch's gradients in ``k`` micro-batches: ``(its loss, "")``, or ``(None, the first line of
    the out-of-memory message)`` once the failed attempt's gradients and memory are freed. With
    ``give_up`` (this was the last split allowed), the out-of-memory raises ``give_up(message)``."""
    try:
        optimizer.zero_grad(set_to_none=True)
        return _accumulate(model, loss_fn, inputs, targets, k, reduction), ""
    except RuntimeError as err:  # torch.OutOfMemoryError, or cuBLAS/cuDNN's plain RuntimeError
        if not is_out_of_memory(err):
            raise
        message = str(err).splitlines()[0].rstrip(".")
        if give_up is not None:
            optimizer.zero_grad(set_to_none=True)
            raise give_up(message) from err
    # out of the except block: the failed attempt's traceback and tensors are unreachable
    optimizer.zero_grad(set_to_none=True)  # the partial gradients of the failed attempt
    free_memory(inputs.device)
    return None, message


def step_or_split(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, inputs: torch.Tensor,
                  targets: torch.Tensor, *, reduction: str | None = None) -> tuple[float, int]:
    """One optimizer step on the whole batch, in the fewest micro-batches that fit in memory.

    Tries the batch whole, then in 2, 3, ... micro-batches (``torch.tensor_split``), freeing what
    each failed attempt held before the next; only splits that make the largest micro-batch
    smaller are tried. The split grows by one, not by doubling: the split it returns is the smallest
    that fits (memory grows with the micro-batch), at the cost of more failed attempts. (In a long
    run, start the next step from the split that worked, so that later steps do not fail first.)

    Args:
        model, optimizer, loss_fn: the training step's parts (``loss_fn(outputs, targets)``).
        inputs, targets: the batch (dimension 0).
        reduction: "mean" or "sum", how ``loss_fn`` combines samples (default: its ``.reduction``,
            else "mean").

    Returns:
        ``(the batch's loss, the number of micro-batches used)``.

    Raises:
        torch.OutOfMemoryError: when even one sample at a time does not fit.
        TypeError, ValueError: for parts of the wrong kind.
    """
    reduction = _check_parts(model, optimizer, loss_fn, reduction)
    batch = _check_batch(inputs, targets)
    k = 1
    while True:
        loss, _ = _attempt(model, optimizer, loss_fn, inputs, targets, k, reduction,
                           _give_up(batch) if k == batch else None)
        if loss is not None:
            optimizer.step()
            return loss, k
        k = -(-batch // (-(-batch // k) - 1))  # the fewest micro-batches whose largest is one sample smaller
