"""The CPU schedule of :class:`gpulab.parallel.PipelinedModel`: one thread per stage, a queue between neighbours.

GPipe (Huang et al. 2019, arXiv 1811.06965) runs every micro-batch's forward through the stages,
then every micro-batch's backward in reverse. On logical devices that share the CPU each stage is
a Python thread; torch releases the GIL inside its kernels, so two stages really compute at the
same time on two cores. One :class:`Sweep` is one such pass:

1. put every micro-batch in the first stage's queue;
2. each stage thread takes micro-batch j from the queue before it, does its work, and puts the
   result in the queue after it (stage s works on j while stage s + 1 works on j - 1);
3. the caller joins the threads and reads the results from the last queue.

The forward work keeps each stage's graph, cut at every stage boundary: the next stage receives a
detached leaf. The backward work back-propagates one stage's graph and hands the leaf's ``.grad``
(the gradient of the stage's input) to the stage before. With ``overlap=False`` the same work
runs in the caller's thread, one micro-batch after the other: the fair baseline.

:mod:`~gpulab.parallel.pipeline.streams` is the same schedule on CUDA streams.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent

__all__ = ["StageThreads", "Sweep"]

_STOP = object()  # put in a queue instead of a micro-batch: the stage before failed, stop waiting


def _noted(err: BaseException, stage: int, device: LogicalDevice, micro_batch: int, phase: str) -> BaseException:
    """The stage's own exception (same type, so ``except OutOfMemoryError`` still works), with a
    note naming the stage; Python prints notes under the message."""
    note = f"raised in pipeline stage {stage} (on {device!r}), micro-batch {micro_batch}, {phase}"
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)
    return err


@dataclass
class Sweep:
    """One pass of every micro-batch through the stages, in ``order``: the forward pass goes
    0, 1, ..., S-1 and hands activations on; the backward pass goes S-1, ..., 0 and hands input
    gradients back. ``work(stage, j, item)`` is what one stage does to micro-batch j; it returns
    what the next stage of ``order`` receives."""

    phase: str  # "forward" or "backward", for the timeline and error notes
    order: list[int]
    work: Callable[[int, int, Any], Any]
    grad_enabled: bool  # autograd records the work (the forward pass of a training step)
    items: list[Any]
    # with overlap: queues[p] feeds the p-th stage of ``order``, queues[-1] collects the results
    queues: list[queue.SimpleQueue] = field(default_factory=list)
    failed: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)


class StageThreads:
    """One pipelined call on the CPU: the GPipe schedule, each stage's saved graphs, the timeline.

    ``forward`` sends every micro-batch through every stage; ``backward`` (called by autograd)
    sends every micro-batch's output gradient back through the stages in reverse. With overlap,
    each stage is one thread and neighbours talk through a queue; without, one thread runs the
    same work one micro-batch after the other.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], overlap: bool = True) -> None:
        self.stages = list(stages)
        self.devices = list(devices)
        self.overlap = overlap
        self.timeline: list[StageEvent] = []
        self.t0 = time.perf_counter()
        # saved[s][j] = (stage s's input leaf or None, stage s's output) for micro-batch j: the
        # graph each stage back-propagates through; None once backward used it
        self.saved: list[list[Any]] = []
        self.keep_graphs = False

    # -- the two passes ----------------------------------------------------------------------

    def forward(self, micro: list[torch.Tensor], grad: bool, input_grad: bool) -> list[torch.Tensor]:
        """Run every micro-batch through every stage; with ``grad``, keep each stage's graph."""
        num_stages = len(self.stages)
        self.keep_graphs = grad
        self.saved = [[None] * len(micro) for _ in range(num_stages)]
        # stage 0's inputs are leaves too; they collect the gradient of the pipeline's input
        first = [m.detach().requires_grad_(grad and input_grad) for m in micro]
        sweep = Sweep("forward", list(range(num_stages)), self._forward_stage, grad, first)
        return self._run(sweep)

    def backward(self, grads: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Back-propagate each micro-batch's output gradient through every stage, last stage first.
        Returns the gradient of each micro-batch's input (None where it needs none)."""
        if not self.saved or all(g is None for row in self.saved for g in row):
            raise RuntimeError("backward through a PipelinedModel output twice: its graph was freed after "
                               "the first backward (retain_graph is not supported); run forward again")
        order = list(reversed(range(len(self.stages))))
        return self._run(Sweep("backward", order, self._backward_stage, False, grads))

    # -- what one stage does to one micro-batch ------------------------------------------------

    def _forward_stage(self, s: int, j: int, x: torch.Tensor) -> torch.Tensor:
        """Stage ``s`` on micro-batch ``j``. ``x`` is a leaf: the graph of the stage before ends
        there, and ``x.grad`` is what this stage's backward hands back to it."""
        # The copy to this stage's device is part of this stage's graph: the stage gets a
        # non-leaf input (in-place first layers work), and x.grad lands on the device of the
        # stage before.
        out = self.stages[s](comm.to(x, self.devices[s]))  # (rows of micro-batch j, ...)
        if self.keep_graphs:
            self.saved[s][j] = (x if x.requires_grad else None, out)
        # what the next stage gets: a new leaf, cut from this stage's graph
        return out.detach().requires_grad_(out.requires_grad)

    def _backward_stage(self, s: int, j: int, grad: torch.Tensor | None) -> torch.Tensor | None:
        """Stage ``s``'s backward of micro-batch ``j``, given the gradient of its output."""
        x, out = self.saved[s][j]
        self.saved[s][j] = None  # free this micro-batch's activations as soon as they are used
        if grad is None or not out.requires_grad:
            return None
        torch.autograd.backward(out, grad)  # accumulates into this stage's parameters' .grad
        return None if x is None else x.grad  # on the device of the stage before

    # -- the schedule ------------------------------------------------------------------------

    def _run(self, sweep: Sweep) -> list[Any]:
        """What the last stage of ``sweep.order`` produced, per micro-batch."""
        return self._in_stage_threads(sweep) if self.overlap else self._one_after_another(sweep)

    def _one_after_another(self, sweep: Sweep) -> list[Any]:
        """The baseline: the same work in this thread, micro-batch j through every stage, then j + 1."""
        results = []
        with torch.set_grad_enabled(sweep.grad_enabled):
            for j, item in enumerate(sweep.items):
                for s in sweep.order:
                    with self.devices[s]:
                        item = self._timed(sweep, s, j, item)
                results.append(item)
        return results

    def _in_stage_threads(self, sweep: Sweep) -> list[Any]:
        """GPipe's fill and drain: one thread per stage, a queue between neighbours, so stage s
        works on micro-batch j while stage s + 1 works on j - 1."""
        # unbounded queues: a put never blocks, so a fast stage runs ahead of a slow one
        sweep.queues = [queue.SimpleQueue() for _ in range(len(sweep.order) + 1)]
        for item in sweep.items:
            sweep.queues[0].put(item)
        threads = [threading.Thread(target=self._stage_thread, args=(sweep, p), daemon=True,
                                    name=f"gpulab-stage{s}-{sweep.phase}")
                   for p, s in enumerate(sweep.order)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if sweep.errors:
            raise sweep.errors[0]  # the first failure; the other stages stopped because of it
        return [sweep.queues[-1].get() for _ in sweep.items]

    def _stage_thread(self, sweep: Sweep, p: int) -> None:
        """The body of the p-th stage thread of ``sweep.order``: take each micro-batch from the
        queue before it, do the stage's work, put the result in the queue after it."""
        s = sweep.order[p]
        inbox, outbox = sweep.queues[p], sweep.queues[p + 1]
        done = 0
        try:
            # grad mode and the current logical device are per thread: set them in this one
            with torch.set_grad_enabled(sweep.grad_enabled), self.devices[s]:
                for j in range(len(sweep.items)):
                    item = inbox.get()
                    if item is _STOP or sweep.failed.is_set():
                        break
                    outbox.put(self._timed(sweep, s, j, item))
                    done += 1
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            sweep.errors.append(err)
            sweep.failed.set()
        finally:
            if done < len(sweep.items):
                outbox.put(_STOP)  # the next stage must not wait for what will not come

    def _timed(self, sweep: Sweep, s: int, j: int, item: Any) -> Any:
        """``sweep.work(s, j, item)``, recorded on the timeline; an error gets a note naming the stage."""
        start = time.perf_counter() - self.t0
        try:
            result = sweep.work(s, j, item)
        except BaseException as err:
            raise _noted(err, s, self.devices[s], j, sweep.phase) from None
        self.timeline.append(StageEvent(s, j, sweep.phase, start, time.perf_counter() - self.t0))
        return result
