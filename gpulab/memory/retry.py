"""oom_retry and step_or_split: a training step that survives out-of-memory by splitting the batch.

Gradient accumulation computes the gradient of a batch of B samples in ``k`` micro-batches:
each micro-batch's loss is scaled by its share of the batch (``b_i / B`` for a mean loss) and
``backward`` adds its gradient into ``.grad``; one ``optimizer.step()`` follows. The sum is the
full batch's gradient (up to float rounding), so the *effective* batch, and therefore the training,
is the same; only the peak memory of activations drops, by about ``k``.

:func:`oom_retry` wraps a model, an optimizer and a loss into a step function. When a step runs
out of memory it drops the partial gradients, frees what the failed attempt held, doubles the
number of micro-batches and runs the *same* batch again: no step is lost or skipped, and later
steps keep the split that worked. (Hugging Face Accelerate's ``find_executable_batch_size``
shrinks the batch instead, which changes the training; this keeps it.)

    step = oom_retry(model, optimizer, nn.CrossEntropyLoss())
    for inputs, targets in loader:
        loss = step(inputs, targets)        # a float: the loss of the whole batch
    print(step.micro_batches, step.events)  # how it had to split, and when

:func:`step_or_split` is the same recovery for one step, without state: it grows the split one at
a time, so the split it reports is the fewest micro-batches that fit (lab 08's exercise 3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gpulab.memory.batch_size import free_memory, is_out_of_memory

__all__ = ["oom_retry", "OOMRetry", "OOMEvent", "step_or_split"]


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


def _give_up(batch: int, k: int, max_micro_batches: int | None) -> Callable[[str], BaseException]:
    """The error to raise when ``k`` micro-batches were the most allowed and still ran out of memory."""
    return lambda message: torch.OutOfMemoryError(
        f"out of memory even with the batch of {batch} split into {k} micro-batches "
        f"(max_micro_batches={max_micro_batches}): {message}. What stays between steps "
        "(the model, its gradients, the optimizer state) may not fit: a smaller model, or a "
        "bigger budget/GPU")


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


@dataclass
class OOMEvent:
    """One out-of-memory that the step recovered from."""

    step: int  # the step (0-based) that ran out of memory, and was then completed
    batch_size: int
    micro_batches: int  # the split it ran out of memory with
    retried_with: int  # the split it tried next
    message: str  # the first line of the OutOfMemoryError


@dataclass
class OOMRetry:
    """A training step that splits the batch into micro-batches when it runs out of memory.

    Call it with ``(inputs, targets)``; it returns the batch's loss as a float. Build it with
    :func:`oom_retry`.

    Attributes:
        micro_batches: the split used now (1 until the first out-of-memory).
        events: every out-of-memory recovered from.
        steps: optimizer steps completed.

    Warning:
        The result equals the unsplit step only for models whose samples do not interact:
        BatchNorm computes its statistics per micro-batch, and dropout draws different random
        numbers. An out-of-memory raised by ``optimizer.step()`` itself (optimizer state) is not
        retried: splitting the batch cannot help it.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    max_micro_batches: int | None = None
    reduction: str | None = None
    micro_batches: int = 1
    events: list[OOMEvent] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        self.reduction = _check_parts(self.model, self.optimizer, self.loss_fn, self.reduction)
        if self.max_micro_batches is not None and (not isinstance(self.max_micro_batches, int)
                                                   or self.max_micro_batches < 1):
            raise ValueError(f"max_micro_batches must be an int >= 1 or None, got {self.max_micro_batches!r}")

    def __call__(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        batch = _check_batch(inputs, targets)
        limit = min(batch, self.max_micro_batches or batch)
        while True:
            k = min(self.micro_batches, limit)
            loss, message = _attempt(self.model, self.optimizer, self.loss_fn, inputs, targets, k, self.reduction,
                                     _give_up(batch, k, self.max_micro_batches) if k >= limit else None)
            if loss is not None:
                break
            self.micro_batches = min(2 * k, limit)
            self.events.append(OOMEvent(self.steps, batch, k, self.micro_batches, message))
        self.optimizer.step()
        self.steps += 1
        return loss


def oom_retry(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, *,
              max_micro_batches: int | None = None, reduction: str | None = None) -> OOMRetry:
    """A step function ``step(inputs, targets) -> float`` that retries out-of-memory in micro-batches.

    Args:
        model, optimizer, loss_fn: the training step's parts (``loss_fn(outputs, targets)``).
        max_micro_batches: the most chunks a batch may be split into (default: one sample each).
        reduction: "mean" or "sum", how ``loss_fn`` combines samples (default: its ``.reduction``,
            else "mean"); it sets how micro-batch losses are scaled.

    Returns:
        An :class:`OOMRetry`; call it once per batch.

    Raises:
        TypeError, ValueError: for parts of the wrong kind, or a bad reduction.
    """
    return OOMRetry(model, optimizer, loss_fn, max_micro_batches=max_micro_batches, reduction=reduction)


def step_or_split(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, inputs: torch.Tensor,
                  targets: torch.Tensor, *, reduction: str | None = None) -> tuple[float, int]:
    """One optimizer step on the whole batch, in the fewest micro-batches that fit in memory.

    Tries the batch whole, then in 2, 3, ... micro-batches (``torch.tensor_split``), freeing what
    each failed attempt held before the next; only splits that make the largest micro-batch
    smaller are tried. Unlike :func:`oom_retry` it keeps no state between steps and grows the
    split by one, not by doubling: the split it returns is the smallest that fits (memory grows
    with the micro-batch), at the cost of more failed attempts.

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
                           _give_up(batch, k, None) if k == batch else None)
        if loss is not None:
            optimizer.step()
            return loss, k
        k = -(-batch // (-(-batch // k) - 1))  # the fewest micro-batches whose largest is one sample smaller
