"""Timing model-parallel variants fairly, side by side (lab 07 and ``benchmarks/model_parallel.py``).

Four variants of one training step are compared, all with one intra-op thread per device
(:func:`gpulab.parallel.intra_op_threads`):

- **single**: the whole model on one device;
- **naive split**: a :class:`~gpulab.parallel.SplitModel`, whole batch, one device at a time;
- **sequential**: the same micro-batches as the pipeline, one after the other (``overlap=False``);
- **pipelined**: :class:`~gpulab.parallel.PipelinedModel`.

On a CPU a micro-batch can be faster per sample than the whole batch on its own (its activations
fit in the cache), so naive split -> pipelined mixes two effects. The overlap the pipeline earns is
sequential -> pipelined only; naive split -> sequential is the micro-batch size effect.

:func:`time_interleaved` runs the variants round-robin (A B C A B C ...), rotating who goes first,
so that a burst of load from another program hits all of them alike; medians ignore outliers.
It also records the process CPU time of each call: CPU seconds / wall seconds is how many cores
the call really had, which tells a loaded machine (a pipelined run on ~1 core) from a slow pipeline.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from gpulab.profiling.interleave import Timings, time_interleaved

__all__ = ["Timings", "intra_op_threads", "time_interleaved", "train_step"]  # the timer lives in gpulab.profiling.interleave


@contextlib.contextmanager
def intra_op_threads(num_threads: int = 1) -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(num_threads)``, then restore the old value.

    ``torch.set_num_threads`` is process-wide (every thread's kernels share the setting), so one
    stage cannot have its own. Setting 1 for *every* compared run (one device, the naive split,
    sequential and pipelined micro-batches) gives each logical device one core's worth of compute:
    the comparison then measures overlap, not a different number of cores.
    """
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    old = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
               optimizer: torch.optim.Optimizer | None = None,
               loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy) -> float:
    """One training step: zero the gradients, forward, loss, backward, optimizer step.

    ``targets`` are moved to the output's device (the last stage's, for a split model). Returns the
    loss as a float (a host-device sync on a GPU, so a timer around this call is honest).
    """
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    out = model(inputs)
    loss = loss_fn(out, targets.to(out.device))
    loss.backward()
    if optimizer is not None:
        optimizer.step()
    return loss.item()
