"""The GPU schedule of :class:`gpulab.parallel.PipelinedModel`: one host thread, one CUDA stream per stage.

This is the schedule of the PyTorch tutorial "Single-Machine Model Parallel Best Practices": GPU
work is asynchronous, so the host can launch micro-batch j on stage 1 and j + 1 on stage 0 back
to back, and both devices compute at once. Each stage gets its own stream (so two logical devices
sharing one GPU can overlap too), and the streams are ordered by events:

- at clock tick ``t`` stage ``s`` runs micro-batch ``t - s``; stages are launched last first, so
  a stage's input was produced (and its event recorded) at an earlier tick;
- a stage's output is copied to the next device on the producing stream, then an event is
  recorded; the next stage's stream waits for that event (``Stream.wait_event``), and the copy is
  marked as used on that stream (``Tensor.record_stream``) so the caching allocator does not hand
  its memory out again while the consumer may still read it;
- the caller's stream on the last device waits for the last stage before it reads the outputs.

Autograd runs each backward op on the stream of its forward op, one autograd thread per GPU, so
backward overlaps across GPUs by itself. With ``overlap=False`` the host waits for each stage
before launching the next one: the same work, one micro-batch after the other (in the forward
pass; autograd's backward still runs the GPUs side by side).

The timeline holds both passes. Forward: CUDA events around each stage's call. Backward: hooks on
the autograd nodes that one stage's call made for one micro-batch record an event on the stage's
stream when the first of them is about to run (the gradient of the stage's output has arrived) and
one after the last of them ran (every gradient of that stage and micro-batch is launched on the
stream, so the event completes when they are computed). A backward that runs only part of the
graph (``torch.autograd.grad`` with ``inputs=``) leaves the stages it skipped without an event.

Not run in CI (no GPU there): the tests marked ``gpu`` / ``multigpu`` cover it, and
``tests/parallel/pipeline/test_streams.py`` runs it on GPUs on paper (``tests/fake_cuda.py``).
"""

from __future__ import annotations

import threading
from typing import NamedTuple, Sequence

import torch
from torch import nn

from gpulab.devices import LogicalDevice
from gpulab.parallel import comm
from gpulab.parallel.pipeline.bubble import StageEvent

__all__ = ["forward_streams"]


class _Mark(NamedTuple):
    """CUDA events around one stage's work on one micro-batch, read into a StageEvent later."""

    stage: int
    micro_batch: int
    phase: str  # "forward" or "backward"
    origin: torch.cuda.Event  # the start mark of the stage's GPU: events time only against their own GPU's
    start: torch.cuda.Event
    end: torch.cuda.Event


def forward_streams(stages: Sequence[nn.Module], devices: Sequence[LogicalDevice], micro: list[torch.Tensor],
                    overlap: bool = True) -> tuple[list[torch.Tensor], list[StageEvent]]:
    """Pipeline the micro-batches through the stages on CUDA streams.

    Returns:
        The last stage's output for each micro-batch (ready on the caller's current stream of the
        last device) and the timeline, timed with CUDA events.
    """
    num, m = len(stages), len(micro)  # S stages, M micro-batches
    streams = [torch.cuda.Stream(device=d.physical) for d in devices]
    for st, d in zip(streams, devices):
        st.wait_stream(torch.cuda.current_stream(d.physical))  # the input and weights are ready
    origins = {}  # CUDA events time only against events of their own GPU: one start mark per GPU
    for d in dict.fromkeys(d.physical for d in devices):
        origins[d] = torch.cuda.Event(enable_timing=True)
        origins[d].record(torch.cuda.current_stream(d))
    # handoff[s][j]: stage s's output for micro-batch j, already on stage s + 1's device, and the
    # event recorded after its copy; taken (and cleared) by stage s + 1
    handoff: list[list[tuple[torch.Tensor, torch.cuda.Event] | None]] = [[None] * m for _ in range(num)]
    timeline = _Timeline()
    outs: list[torch.Tensor | None] = [None] * m
    for tick in range(m + num - 1):  # stage s runs micro-batch tick - s: M + S - 1 ticks fill and drain
        for s in reversed(range(num)):  # downstream first: its input is from an earlier tick
            j = tick - s
            if not 0 <= j < m:
                continue
            dev, st = devices[s], streams[s]
            with dev, torch.cuda.stream(st):
                if s == 0:
                    x = micro[j]
                    if x.is_cuda:
                        x.record_stream(st)  # the caller's tensor, read on this stream
                    x = comm.to(x, dev, non_blocking=True)
                else:
                    x, ready = handoff[s - 1][j]
                    handoff[s - 1][j] = None
                    st.wait_event(ready)  # the copy from the stage before has landed
                    x.record_stream(st)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(st)
                out = stages[s](x)
                end.record(st)
                if out.grad_fn is not None:  # the graph this call made: time its backward too
                    _time_backward(out, x, st, timeline, s, j, origins[dev.physical])
                if s + 1 < num:  # copy on this stream, then say so with an event
                    out = comm.to(out, devices[s + 1], non_blocking=True)
                    ready = torch.cuda.Event()
                    ready.record(st)
                    handoff[s][j] = (out, ready)
                else:
                    outs[j] = out
            timeline.add(_Mark(s, j, "forward", origins[dev.physical], start, end))
            if not overlap:
                st.synchronize()  # the host waits: nothing else is launched meanwhile
    last = torch.cuda.current_stream(devices[-1].physical)
    last.wait_stream(streams[-1])
    for out in outs:
        out.record_stream(last)
    return outs, timeline


def _stage_nodes(out: torch.Tensor, x: torch.Tensor) -> list:
    """The autograd nodes one stage's call made: those between its output and its input ``x``,
    without the parameters' AccumulateGrad nodes (every micro-batch shares them)."""
    stop = {x.grad_fn} if x.grad_fn is not None else set()
    nodes, todo, seen = [], [out.grad_fn], set()
    while todo:
        node = todo.pop()
        if node is None or node in seen or node in stop or type(node).__name__ == "AccumulateGrad":
            continue
        seen.add(node)
        nodes.append(node)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return nodes


def _time_backward(out: torch.Tensor, x: torch.Tensor, stream: torch.cuda.Stream, timeline: "_Timeline",
                   stage: int, micro_batch: int, origin: torch.cuda.Event) -> None:
    """Hooks that record stage ``stage``'s backward of ``micro_batch`` on ``stream``: a start event
    before the first of its nodes runs, an end event after the last one ran."""
    nodes = _stage_nodes(out, x)
    if not nodes:  # the stage returned its input: no work of its own to time
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    left, lock = [len(nodes)], threading.Lock()  # the hooks run in autograd's thread for this GPU

    def begin(grad_outputs):
        start.record(stream)

    def done(grad_inputs, grad_outputs):
        with lock:
            left[0] -= 1
            if left[0]:
                return
        end.record(stream)  # after every kernel this stage's backward launched on its stream
        timeline.add(_Mark(stage, micro_batch, "backward", origin, start, end))

    out.grad_fn.register_prehook(begin)
    for node in nodes:
        node.register_hook(done)


class _Timeline(list):
    """StageEvents read lazily from CUDA events: reading them waits for the GPU, so only the
    caller who looks at ``timeline`` pays for it. Backward marks arrive later, from autograd's
    threads, as each stage's backward of each micro-batch is launched."""

    def __init__(self) -> None:
        super().__init__()
        self._marks: list[_Mark] = []
        self._lock = threading.Lock()

    def add(self, mark: _Mark) -> None:
        with self._lock:
            self._marks.append(mark)

    def _resolve(self) -> None:
        with self._lock:
            marks, self._marks = self._marks, []
        for mark in marks:
            mark.end.synchronize()
            # elapsed_time is in milliseconds; StageEvents are in seconds from the origin
            self.append(StageEvent(mark.stage, mark.micro_batch, mark.phase,
                                   mark.origin.elapsed_time(mark.start) / 1e3,
                                   mark.origin.elapsed_time(mark.end) / 1e3))

    def __iter__(self):
        self._resolve()
        return super().__iter__()

    def __len__(self) -> int:
        self._resolve()
        return super().__len__()

    def __getitem__(self, i):
        self._resolve()
        return super().__getitem__(i)
