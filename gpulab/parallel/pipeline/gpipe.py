"""GPipe's training step, top to bottom: lab 07's exercise ``pipelined_train_step``, gpulab's version.

The batch is cut into micro-batches of ``split_size`` rows. One thread per stage, a queue into
each: every micro-batch goes forward through the stages (stage i works on micro-batch j while
stage i + 1 works on j - 1: fill, steady state, drain), then every one comes back, last stage
first (Huang et al. 2019, "GPipe", arXiv 1811.06965). Each stage's graph starts at a detached
leaf, so a stage back-propagates its own part and hands its input's ``.grad`` to the stage before.

    loss = gpipe_train_step(list(split.stages), split.devices, x, y, split_size=8, timeline=events)
    opt.step()

Run by lab 07 (notebooks/source/07_model_parallel) and ``pytest tests/parallel/pipeline/test_gpipe.py``.
The general schedule engine (interleaved stages, forward and backward in one sweep, CUDA streams)
is :mod:`~gpulab.parallel.pipeline.threads`, behind :class:`~gpulab.parallel.PipelinedModel`.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent

__all__ = ["gpipe_train_step"]


def gpipe_train_step(stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], inputs: torch.Tensor,
                     targets: torch.Tensor, split_size: int,
                     loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
                     timeline: list[StageEvent] | None = None) -> float:
    """One GPipe training step, without the optimizer; returns the batch's loss as a float.

    Stage ``i`` runs on ``devices[i]``, each already there. ``loss_fn(outputs, targets)`` must be a
    mean over the rows (as ``cross_entropy``): micro-batch j's loss is weighted by its share of the
    rows. Gradients accumulate into ``.grad`` as ``loss.backward()`` would (nothing is zeroed); the
    inputs get none. ``timeline`` (a list, or None) receives a :class:`StageEvent` per stage,
    micro-batch and pass; on a GPU each ends once the device has finished the work.

    Raises:
        ValueError: ``split_size`` is not a positive int, ``inputs`` has no rows, or the stages and
            devices differ in number. A stage's own error is re-raised with a note naming it.
    """
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
        raise ValueError(f"split_size is the number of rows per micro-batch and must be a positive int, got {split_size!r}")
    if not isinstance(inputs, torch.Tensor) or inputs.dim() == 0 or inputs.size(0) == 0:
        raise ValueError("gpipe_train_step needs a batch with at least one row along dim 0")
    if len(stages) != len(devices):
        raise ValueError(f"{len(stages)} stages but {len(devices)} devices: give one device per stage")
    xs, ys = inputs.split(split_size), targets.split(split_size)  # M x (rows_j, ...), the last maybe smaller
    num_stages, num_micro, rows = len(stages), len(xs), inputs.size(0)
    acts = [queue.SimpleQueue() for _ in range(num_stages)]   # acts[i]: stage i's inputs, in micro-batch order
    grads = [queue.SimpleQueue() for _ in range(num_stages)]  # grads[i]: the gradients of stage i's outputs
    losses: list[torch.Tensor] = []
    errors: list[BaseException] = []
    t0 = time.perf_counter()

    def done(i: int, j: int, phase: str, start: float) -> None:
        """Note the end of a piece of work: on a GPU once its kernels finished, before it is handed on."""
        if devices[i].physical.type == "cuda":
            torch.cuda.synchronize(devices[i].physical)  # kernels are asynchronous: wait for the work itself
        if timeline is not None:
            timeline.append(StageEvent(i, j, phase, start - t0, time.perf_counter() - t0))

    def stage(i: int) -> None:
        saved = []  # (input leaf, output or weighted loss) per micro-batch: the graph backward needs
        phase, j = "forward", 0
        try:
            with torch.enable_grad(), devices[i]:  # grad mode and the current device are per thread
                for j in range(num_micro):  # forward: fill, every stage busy, drain
                    h = xs[j] if i == 0 else acts[i].get()
                    if h is None:
                        return  # another stage failed
                    start = time.perf_counter()
                    h = h.detach().requires_grad_(i > 0)  # this stage's graph starts at a leaf
                    out = stages[i](comm.to(h, devices[i]))  # (rows_j, ...) -> (rows_j, ...) of the next stage
                    if i == num_stages - 1:  # micro-batch j's loss, weighted by its share of the rows
                        out = loss_fn(out, comm.to(ys[j], devices[i])) * (xs[j].size(0) / rows)
                        losses.append(out.detach())
                    saved.append((h, out))
                    done(i, j, phase, start)
                    if i < num_stages - 1:
                        acts[i + 1].put(out.detach())
                phase = "backward"
                for j in range(num_micro):  # backward: the last stage first, gradients flow back
                    g = None if i == num_stages - 1 else grads[i].get()  # (rows_j, ...), on the next device
                    if i < num_stages - 1 and g is None:
                        return
                    start = time.perf_counter()
                    h, out = saved[j]
                    saved[j] = None  # free this micro-batch's activations
                    if out.requires_grad:  # into this stage's .grad; h.grad: the gradient of its input
                        torch.autograd.backward(out, g)
                    done(i, j, phase, start)
                    if i > 0:
                        grads[i - 1].put(h.grad if h.grad is not None else torch.zeros_like(h))
        except BaseException as err:  # re-raised in the caller's thread; nobody waits for this stage
            err.add_note(f"raised in pipeline stage {i} (on {devices[i]!r}), micro-batch {j}, {phase}")
            errors.append(err)
            for q in acts + grads:
                q.put(None)

    threads = [threading.Thread(target=stage, args=(i,), daemon=True, name=f"gpulab-gpipe-stage{i}")
               for i in range(num_stages)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(loss.item() for loss in losses)
