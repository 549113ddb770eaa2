"""Training and evaluation loops that keep memory flat: the references for lab 08's exercises.

The leaks they avoid (lab 08 reproduces each one under a memory budget): summing loss tensors
(``total += loss``), keeping outputs (``outputs.append(out)``) and evaluating without
``torch.no_grad()``. Why each one leaks, and what these loops keep instead: the comment below
the imports.

    .venv/bin/python -m pytest tests/memory/fixes/test_loops.py
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

# The leaks these loops avoid:
# - summing loss tensors. ``total += loss`` keeps a tensor with a graph. In an evaluation loop
#   without ``no_grad`` that graph holds every batch's saved activations, so memory grows by a
#   whole forward pass per batch. (In a training loop ``backward`` has already freed the saved
#   tensors, so only autograd's bookkeeping is kept, unless ``retain_graph=True`` keeps them too.)
#   Keep a number without a graph: ``loss.detach()`` summed on the device and read once at the
#   end, as here. ``loss.item()`` per step also drops the graph, but it is a host-device sync per
#   step (lab 01): the host waits for the GPU to finish the step before it can queue the next.
# - keeping outputs. ``outputs.append(out)`` keeps the logits and, without ``no_grad``, their
#   graph. ``out.detach()`` drops the graph but keeps every logit. Keep what is needed, and
#   summarise as you go: a running count of correct predictions stays one number.
# - evaluating without ``torch.no_grad()``. Every op records what backward would need, so an
#   evaluation step holds as much as a training step's forward.

__all__ = ["train_epoch", "evaluate"]


def train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """One pass of training with flat memory: the summaries are updated as it goes.

    Args:
        model, optimizer, loss_fn: the usual parts (``loss_fn`` averages over the batch).
        batches: ``(inputs, targets)`` pairs.

    Returns:
        ``(mean loss per sample, training accuracy)`` as floats.
    """
    model.train()
    total, correct, count = None, None, 0
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        batch_loss = loss.detach() * targets.shape[0]  # no graph; stays on the device (no host sync)
        hits = (outputs.argmax(dim=1) == targets).sum()  # a count, not B x classes logits kept alive
        total = batch_loss if total is None else total + batch_loss
        correct = hits if correct is None else correct + hits
        count += targets.shape[0]
    if count == 0:
        raise ValueError("batches was empty: nothing to train on")
    return total.item() / count, correct.item() / count  # the only host syncs


def evaluate(model: nn.Module, loss_fn: Callable,
             batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, float]:
    """Mean loss and accuracy over ``batches``, in eval mode and without recording a graph.

    The model's training flag is put back afterwards.

    Returns:
        ``(mean loss per sample, accuracy)`` as floats.
    """
    was_training = model.training
    model.eval()  # BatchNorm uses its running statistics, dropout is off
    total, correct, count = None, None, 0
    try:
        with torch.no_grad():  # nothing is saved for backward: activations are freed op by op
            for inputs, targets in batches:
                outputs = model(inputs)
                # running totals stay on the device: no .item() (a host sync) per batch
                batch_loss = loss_fn(outputs, targets) * targets.shape[0]
                hits = (outputs.argmax(dim=1) == targets).sum()  # (B, classes) -> (B,) -> ()
                total = batch_loss if total is None else total + batch_loss
                correct = hits if correct is None else correct + hits
                count += targets.shape[0]
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("batches was empty: nothing to evaluate")
    return total.item() / count, correct.item() / count  # the only host syncs
