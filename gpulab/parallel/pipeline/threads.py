"""The general CPU schedule engine behind :class:`gpulab.parallel.PipelinedModel` (lab 07's "More").

A thread per device, a queue into each. One :class:`Sweep` is one pass of every micro-batch
through a sequence of positions: the forward pass (stages 0 .. S-1), the backward pass (S-1 .. 0),
or a whole step as one sweep of 2S positions (:meth:`StageThreads.forward_backward`: each
micro-batch's backward starts as soon as its loss exists, so the step fills and drains once).
A device thread runs its earliest ready position first (breadth-first, PyTorch's
``ScheduleLoopedBFS``), so a device may hold **interleaved stages** (devices 0, 1, 0, 1: Megatron-LM,
arXiv 2104.04473) and the bubble shrinks. Each stage's graph is cut at its input (a detached
leaf); backward hands the leaf's ``.grad`` to the stage before. With ``overlap=False`` the same
work runs in the caller's thread, one micro-batch after the other: the fair baseline.

Lab 07's exercise, the plain GPipe step in one file, is :mod:`~gpulab.parallel.pipeline.gpipe`;
:func:`run_in_stage_threads` (this engine's overlap) is masked while lab 07 is graded.
Tests: ``pytest tests/parallel/pipeline/test_interleaved.py tests/parallel/pipeline/test_fused.py``.
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab import MaskedReference
from gpulab.devices import LogicalDevice
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent
from gpulab.parallel.pipeline.split import device_lanes

__all__ = ["StageThreads", "Sweep", "run_in_stage_threads"]

_STOP = object()  # put in every queue when a device thread fails: stop waiting for work that will not come


def _noted(err: BaseException, stage: int, device: LogicalDevice, micro_batch: int, phase: str) -> BaseException:
    """The stage's own exception (same type, so ``except OutOfMemoryError`` still works), with a
    note naming the stage; Python prints notes under the message."""
    note = f"raised in pipeline stage {stage} (on {device!r}), micro-batch {micro_batch}, {phase}"
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)
    return err


Work = Callable[[int, int, Any], Any]  # (stage, micro-batch j, input) -> what the next position gets


@dataclass
class Sweep:
    """One pass of every micro-batch through a sequence of positions. Position p is stage
    ``order[p]`` doing ``works[p]`` (its ``phases[p]``): the forward pass goes through stages
    0, 1, ..., S-1 and hands activations on; the backward pass goes S-1, ..., 0 and hands input
    gradients back; a whole training step is both, 2S positions. ``works[p](stage, j, item)`` is
    what that position does to micro-batch j; it returns what position p + 1 receives."""

    order: list[int]
    phases: list[str]  # "forward" or "backward", per position, for the timeline and error notes
    works: list[Work]
    grad_enabled: bool  # autograd records the work (the forward pass of a training step)
    items: list[Any]
    # with overlap: inboxes[lane] feeds that device's thread (position in ``order``, micro-batch,
    # input); results[j] is what the last stage of ``order`` made of micro-batch j
    inboxes: list[queue.SimpleQueue] = field(default_factory=list)
    results: list[Any] = field(default_factory=list)
    failed: threading.Event = field(default_factory=threading.Event)
    errors: list[BaseException] = field(default_factory=list)


class StageThreads:
    """One pipelined call on the CPU: the GPipe schedule, each stage's saved graphs, the timeline.

    ``forward`` sends every micro-batch through every stage; ``backward`` (called by autograd)
    sends every micro-batch's output gradient back through the stages in reverse;
    ``forward_backward`` does a training step's both passes in one sweep. With overlap,
    each device is one thread (running every stage placed on it) and they talk through queues;
    without, one thread runs the same work one micro-batch after the other.
    """

    def __init__(self, stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], overlap: bool = True) -> None:
        self.stages = list(stages)
        self.devices = list(devices)
        self.overlap = overlap
        self.lanes = device_lanes(self.devices)  # lanes[s]: the thread (device) that runs stage s
        self.timeline: list[StageEvent] = []
        self.t0 = time.perf_counter()
        # saved[s][j] = (stage s's input leaf or None, stage s's output) for micro-batch j: the
        # graph each stage back-propagates through; None once backward used it
        self.saved: list[list[Any]] = []
        self.keep_graphs = False

    # -- the two passes ----------------------------------------------------------------------

    def forward(self, micro: list[torch.Tensor], grad: bool, input_grad: bool) -> list[torch.Tensor]:
        """Run every micro-batch through every stage; with ``grad``, keep each stage's graph."""
        stages = range(len(self.stages))
        first = self._start(micro, grad, input_grad)
        sweep = Sweep(list(stages), ["forward"] * len(stages), [self._forward_stage] * len(stages), grad, first)
        return self._run(sweep)

    def forward_backward(self, micro: list[torch.Tensor], targets: list[torch.Tensor],
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         input_grad: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """A whole training step in one sweep: micro-batch j's loss, ``loss_fn(output_j,
        targets[j])`` weighted by its share of the rows, is computed on the last stage, and its
        backward starts there while later micro-batches still go forward.

        Returns:
            each micro-batch's weighted loss (a detached scalar on the last stage's device; their
            sum is the batch's loss when ``loss_fn`` is a mean over rows), and each micro-batch's
            input gradient (None unless ``input_grad``).
        """
        num_stages = len(self.stages)
        rows = sum(m.size(0) for m in micro)
        first = self._start(micro, True, input_grad)
        losses: list[torch.Tensor | None] = [None] * len(micro)

        def last_forward(s: int, j: int, x: torch.Tensor) -> torch.Tensor:
            out = self.stages[s](comm.to(x, self.devices[s]))  # (rows of micro-batch j, ...)
            loss = loss_fn(out, comm.to(targets[j], self.devices[s])) * (micro[j].size(0) / rows)
            self.saved[s][j] = (x if x.requires_grad else None, loss)
            losses[j] = loss.detach()
            return losses[j]

        def first_backward(s: int, j: int, _loss: torch.Tensor) -> torch.Tensor | None:
            return self._backward_stage(s, j, None, from_loss=True)

        forward = [self._forward_stage] * (num_stages - 1) + [last_forward]
        backward = [first_backward] + [self._backward_stage] * (num_stages - 1)
        order = list(range(num_stages)) + list(reversed(range(num_stages)))
        sweep = Sweep(order, ["forward"] * num_stages + ["backward"] * num_stages, forward + backward, True, first)
        grads = self._run(sweep)
        return losses, grads

    def _start(self, micro: list[torch.Tensor], grad: bool, input_grad: bool) -> list[torch.Tensor]:
        """Make room for each stage's graphs; stage 0's inputs, as leaves (with ``input_grad``
        they collect the gradient of the pipeline's input)."""
        self.keep_graphs = grad
        self.saved = [[None] * len(micro) for _ in range(len(self.stages))]
        return [m.detach().requires_grad_(grad and input_grad) for m in micro]

    def backward(self, grads: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """Back-propagate each micro-batch's output gradient through every stage, last stage first.
        Returns the gradient of each micro-batch's input (None where it needs none)."""
        if not self.saved or all(g is None for row in self.saved for g in row):
            raise RuntimeError("backward through a PipelinedModel output twice: its graph was freed after "
                               "the first backward (retain_graph is not supported); run forward again")
        order = list(reversed(range(len(self.stages))))
        return self._run(Sweep(order, ["backward"] * len(order), [self._backward_stage] * len(order), False, grads))

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

    def _backward_stage(self, s: int, j: int, grad: torch.Tensor | None, from_loss: bool = False) -> torch.Tensor | None:
        """Stage ``s``'s backward of micro-batch ``j``, given the gradient of its output (or, with
        ``from_loss``, from the loss the stage computed itself)."""
        x, out = self.saved[s][j]
        self.saved[s][j] = None  # free this micro-batch's activations as soon as they are used
        if (grad is None and not from_loss) or not out.requires_grad:
            return None
        torch.autograd.backward(out, grad)  # accumulates into this stage's parameters' .grad
        return None if x is None else x.grad  # on the device of the stage before

    # -- the schedule ------------------------------------------------------------------------

    def _run(self, sweep: Sweep) -> list[Any]:
        """What the last stage of ``sweep.order`` produced, per micro-batch."""
        if not self.overlap:
            return self._one_after_another(sweep)
        try:
            return run_in_stage_threads(self, sweep)
        except MaskedReference:  # while lab 07 is graded the overlapped schedule is masked: its exercise
            warnings.warn("gpulab's pipeline schedule is not available while lab 07 is graded (it is the "
                          "exercise): PipelinedModel runs its micro-batches one after the other", stacklevel=2)
            return self._one_after_another(sweep)

    def _one_after_another(self, sweep: Sweep) -> list[Any]:
        """The baseline: the same work in this thread, micro-batch j through every stage, then j + 1."""
        results = []
        with torch.set_grad_enabled(sweep.grad_enabled):
            for j, item in enumerate(sweep.items):
                for p in range(len(sweep.order)):
                    with self.devices[sweep.order[p]]:
                        item = self._timed(sweep, p, j, item)
                results.append(item)
        return results

    def _timed(self, sweep: Sweep, p: int, j: int, item: Any) -> Any:
        """Position ``p``'s work on micro-batch ``j``, recorded on the timeline; an error gets a
        note naming the stage. On a GPU the work is waited for before the clock is read (kernels
        are asynchronous: the call returns once they are launched), so the event times the work
        and the result is handed on once it exists."""
        s, phase = sweep.order[p], sweep.phases[p]
        start = time.perf_counter() - self.t0
        try:
            result = sweep.works[p](s, j, item)
            physical = self.devices[s].physical
            if physical.type == "cuda":
                torch.cuda.synchronize(physical)  # a CPU-GPU sync point, on purpose
        except BaseException as err:
            raise _noted(err, s, self.devices[s], j, phase) from None
        self.timeline.append(StageEvent(s, j, phase, start, time.perf_counter() - self.t0, self.lanes[s]))
        return result


def run_in_stage_threads(run: StageThreads, sweep: Sweep) -> list[Any]:
    """GPipe's fill and drain for ``run`` (a :class:`StageThreads` with ``overlap``): one thread per
    device, a queue into each, so stage s works on micro-batch j while stage s + 1 works on j - 1.
    Returns what the last stage of ``sweep.order`` produced, per micro-batch.

    A function rather than a method so that it can be masked while lab 07 is graded (it is that
    lab's exercise, :mod:`gpulab.autograde.box.mask`); :class:`StageThreads` then runs the same work one
    micro-batch after the other.
    """
    # unbounded queues: a put never blocks, so a fast stage runs ahead of a slow one
    lanes = range(max(run.lanes) + 1)
    sweep.inboxes = [queue.SimpleQueue() for _ in lanes]
    sweep.results = [None] * len(sweep.items)
    for j, item in enumerate(sweep.items):
        sweep.inboxes[run.lanes[sweep.order[0]]].put((0, j, item))

    def stage_thread(lane: int) -> None:
        """The body of one device's thread: take work from its queue, the earliest stage of the
        pass first, run it, hand the result to the device of the next stage."""
        positions = [p for p, s in enumerate(sweep.order) if run.lanes[s] == lane]
        todo = len(positions) * len(sweep.items)
        ready: list[tuple[int, int, Any]] = []
        try:
            # grad mode and the current logical device are per thread: set them in this one
            with torch.set_grad_enabled(sweep.grad_enabled), run.devices[sweep.order[positions[0]]]:
                for _ in range(todo):
                    if not ready:
                        ready.append(sweep.inboxes[lane].get())  # wait for work
                    while True:  # and take whatever else has arrived meanwhile
                        try:
                            ready.append(sweep.inboxes[lane].get_nowait())
                        except queue.Empty:
                            break
                    if sweep.failed.is_set() or any(work is _STOP for work in ready):
                        return
                    ready.sort(key=lambda work: (-work[0], -work[1]))  # earliest stage, then micro-batch, last
                    p, j, item = ready.pop()
                    result = run._timed(sweep, p, j, item)
                    if p + 1 < len(sweep.order):
                        sweep.inboxes[run.lanes[sweep.order[p + 1]]].put((p + 1, j, result))
                    else:
                        sweep.results[j] = result
        except BaseException as err:  # re-raised in the caller's thread
            sweep.errors.append(err)
            sweep.failed.set()
            for inbox in sweep.inboxes:
                inbox.put(_STOP)  # the other devices must not wait for what will not come

    threads = [threading.Thread(target=stage_thread, args=(lane,), daemon=True,
                                name=f"gpulab-device{lane}-{'-'.join(dict.fromkeys(sweep.phases))}")
               for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if sweep.errors:
        raise sweep.errors[0]  # the first failure; the other threads stopped because of it
    return sweep.results
