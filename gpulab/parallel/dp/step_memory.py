"""Memory of one data-parallel training step per device, and the largest batch a budget allows
(the measurements of labs 04 and 05, and of ``benchmarks/dataparallel.py``).

:func:`step_memory` runs forward, loss and backward once inside a :class:`~gpulab.devices.MemoryMeter`
and returns its report: peak bytes per logical device, and their imbalance (largest peak / smallest).
:func:`fits_in_budget` asks the same with a per-device budget: does the step run, or does some device
run out of memory? :func:`largest_batch` searches the largest batch size for which a predicate holds,
by doubling and then bisection (what is counted, and a caveat: the comment below the imports).

    report = step_memory(DataParallel(head, devices), F.cross_entropy, x, y, devices)
    print(report)                    # the table; report.imbalance; report.plot()
    best = largest_batch(lambda b: fits_in_budget(model, F.cross_entropy, *make_batch(b),
                                                  devices, budget=128 * 2**20), multiple=4)

    .venv/bin/python -m pytest tests/parallel/dp/test_step_memory.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice, MemoryMeter, MemoryReport, placement
from gpulab.devices.validate import check_devices
from gpulab.memory.batch_size import bisect_largest
from gpulab.models import LargeVocabHead
from gpulab.parallel import comm

# largest_batch doubles and then bisects, so it needs about ``2 * log2(answer)`` probes rather
# than one per size.
#
# What is counted: the model's parameters and the batch, both on ``devices[0]`` before the step (as
# a batch a DataLoader sent to the first GPU), and everything the step allocates on every device.
# Gradients are cleared before and after, so every measurement starts from the same state.
#
# Caveat: under any ``TorchDispatchMode`` (the meter is one) autograd sums the gradients that meet at
# one tensor out of place (``a + b``) instead of in place (``a.add_(b)``, what it does without a mode).
# Where the replicas' gradients are added onto the original weights (device 0), the meter therefore
# counts one parameter-sized buffer more than an unmetered run allocates: a model whose parameters
# outweigh its activations shows 4x the parameters on device 0 where 3x are really needed.

__all__ = ["HeadWorkload", "step_memory", "fits_in_budget", "largest_batch"]


@dataclass(frozen=True)
class HeadWorkload:
    """The workload of labs 04-05 and the benchmark: a language-model head with a large vocabulary.

    Each sample's logits take ``4 * vocab`` bytes (117 KiB for 30,000 words) against ``4 * hidden``
    for its input, and the parameters (``4 * hidden * vocab`` bytes, 7.5 MiB here) are small next to
    a batch of logits: the regime where gathering the outputs on one device dominates its memory.
    A small ``hidden`` keeps a step fast on a 2-core laptop without changing the lesson.

    Attributes:
        hidden: the head's input width.
        vocab: the number of outputs (classes).
        batch_size: the batch of the imbalance measurements.
        num_devices: how many logical devices.
        budget: bytes per device for the largest-batch search.
        seed: for the weights and the batches.
    """

    hidden: int = 64
    vocab: int = 30_000
    batch_size: int = 512
    num_devices: int = 4
    budget: int = 128 * 2**20
    seed: int = 0

    def model(self, device: torch.device | str | None = None) -> LargeVocabHead:
        """A freshly initialised head (the same weights for the same seed), on ``device``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            head = LargeVocabHead(self.hidden, self.vocab)
        return head.to(device) if device is not None else head

    def batch(self, batch_size: int | None = None, device: torch.device | str | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``: (B, hidden) float32 and (B,) int64 class indices."""
        b = self.batch_size if batch_size is None else batch_size
        g = torch.Generator().manual_seed(self.seed + b)
        x, y = torch.randn(b, self.hidden, generator=g), torch.randint(0, self.vocab, (b,), generator=g)
        return (x, y) if device is None else (x.to(device), y.to(device))


def step_memory(model: nn.Module, loss_fn: Callable[..., torch.Tensor], inputs: torch.Tensor,
                targets: torch.Tensor, devices: Sequence[LogicalDevice], *, budget: int | None = None) -> MemoryReport:
    """Per-device memory of ``loss_fn(model(inputs), targets).backward()``.

    Args:
        model: a :class:`~gpulab.parallel.DataParallel` (its output is gathered on its output
            device; the targets are sent there) or a :class:`~gpulab.parallel.DataParallelModel`
            (its list of outputs goes to ``loss_fn``, a ``DataParallelCriterion``). A plain module
            on ``devices[0]`` works too (a single-device step).
        loss_fn: the loss, called as ``loss_fn(outputs, targets)``.
        inputs, targets: the batch, on ``devices[0]``'s physical device; counted on ``devices[0]``.
        devices: the logical devices to report (all of them, also unused ones).
        budget: bytes per device; past it, ``torch.OutOfMemoryError`` is raised.

    Returns:
        The meter's :class:`~gpulab.devices.MemoryReport` (``.rows``, ``.imbalance``, ``.plot()``).

    Raises:
        torch.OutOfMemoryError: when a device would go past ``budget``.
    """
    devices = check_devices(devices)
    model.zero_grad(set_to_none=True)
    meter = MemoryMeter(budget, devices=devices)
    meter.track(model, devices[0])
    meter.track([inputs, targets], devices[0])
    try:
        with meter:
            outputs = model(inputs)
            if isinstance(outputs, torch.Tensor):  # gathered: the loss runs where the outputs are
                targets = comm.to(targets, placement(outputs))
            loss = loss_fn(outputs, targets)
            loss.backward()
            del outputs, loss, targets  # what is live at exit: parameters, gradients, the batch
    finally:
        model.zero_grad(set_to_none=True)  # also after running out of memory half-way
    return meter.report()


def fits_in_budget(model: nn.Module, loss_fn: Callable[..., torch.Tensor], inputs: torch.Tensor,
                   targets: torch.Tensor, devices: Sequence[LogicalDevice], budget: int) -> bool:
    """Whether one training step runs within ``budget`` bytes on every device (see
    :func:`step_memory`); False when some device runs out of memory."""
    try:
        step_memory(model, loss_fn, inputs, targets, devices, budget=budget)
    except torch.OutOfMemoryError:
        return False
    return True


def largest_batch(fits: Callable[[int], Any], *, multiple: int = 1, limit: int = 1 << 20) -> int:
    """The largest batch size ``b`` (a multiple of ``multiple``, at most ``limit``) with ``fits(b)``.

    Doubles from ``multiple`` until ``fits`` fails (or ``limit`` is passed), then bisects between
    the last size that fit and the first that did not (:func:`gpulab.memory.batch_size.bisect_largest`,
    the search lab 08's ``find_max_batch_size`` uses). Memory grows with the batch, so ``fits``
    is assumed to hold up to some size and fail above it.

    Args:
        fits: ``fits(batch_size) -> bool``, e.g. a step under a budgeted meter.
        multiple: search multiples of this only (the number of devices keeps splits even).
        limit: the largest size to try.

    Returns:
        The largest fitting size, or 0 if even ``multiple`` does not fit.

    Raises:
        ValueError: if ``multiple`` or ``limit`` is not a positive int, or ``limit < multiple``.
    """
    for name, v in (("multiple", multiple), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if limit < multiple:
        raise ValueError(f"limit={limit} is below multiple={multiple}: no batch size to try")
    if not fits(multiple):
        return 0
    lo, hi = multiple, None  # fits(lo) holds; fits(hi) fails (None: not found yet)
    while hi is None:
        nxt = lo * 2
        if nxt > limit:
            nxt = limit // multiple * multiple
            if nxt == lo:
                return lo
            if fits(nxt):
                return nxt
            hi = nxt
        elif fits(nxt):
            lo = nxt
        else:
            hi = nxt
    return bisect_largest(fits, lo, hi, multiple)
