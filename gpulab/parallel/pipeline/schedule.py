"""The CPU schedule's length, predicted from what each stage costs (a list-scheduling simulation).

:mod:`~gpulab.parallel.pipeline.threads` runs one thread per device; a thread with several pieces
of work ready runs the one from the earliest stage first (then the lowest micro-batch). With equal
stages the length of a pass has a formula (``(M + S - 1)`` stage times for GPipe; for interleaved
stages, see :func:`~gpulab.parallel.pipeline.bubble.bubble_fraction`). With unequal stages, and
interleaved ones especially, it has none: :func:`pass_span` replays the same rule on given stage
costs, with free hand-offs and a free device for every thread, and returns when the pass ends.
:func:`step_span` adds the forward and the backward pass of a GPipe training step;
:func:`fused_step_span` is the step as one sweep (``StageThreads.forward_backward``: each
micro-batch's backward starts as soon as its loss exists).
:func:`gpulab.parallel.pipeline.balance.interleaved_boundaries` uses it to choose a cut.
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["pass_span", "step_span", "fused_step_span"]


def pass_span(costs: Sequence[float], lanes: Sequence[int], micro_batches: int) -> float:
    """How long one pass of ``micro_batches`` takes through stages that cost ``costs[p]`` each, in
    the order of the pass, stage ``p`` running on device (thread) ``lanes[p]``.

    Every micro-batch is ready at 0 for the first stage; each stage's work on micro-batch j is
    ready when the stage before finished j; a device starts its ready work from the earliest
    stage (then the lowest micro-batch) as soon as it is free.

    Raises:
        ValueError: ``costs`` and ``lanes`` of different lengths or empty, a negative cost, or
            ``micro_batches`` not a positive int.
    """
    if len(costs) != len(lanes) or not costs:
        raise ValueError(f"one lane per stage: got {len(costs)} costs and {len(lanes)} lanes")
    if any(c < 0 for c in costs):
        raise ValueError(f"stage costs must be >= 0, got {list(costs)}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    stages = len(costs)
    free = dict.fromkeys(lanes, 0.0)  # when each device is next free
    ready = {(0, j): 0.0 for j in range(micro_batches)}  # (stage, micro-batch) -> when its input exists
    end = 0.0
    while ready:
        # the next piece of work to start, over all devices: chronological order means every
        # piece that ends before it starts has already been placed, and its output is in ready
        best = None
        for lane in free:
            mine = [(p, j, t) for (p, j), t in ready.items() if lanes[p] == lane]
            if not mine:
                continue
            start = max(free[lane], min(t for _, _, t in mine))
            p, j = min((p, j) for p, j, t in mine if t <= start)  # earliest stage, then micro-batch
            if best is None or start < best[0]:
                best = (start, lane, p, j)
        start, lane, p, j = best
        del ready[p, j]
        free[lane] = finish = start + costs[p]
        end = max(end, finish)
        if p + 1 < stages:
            ready[p + 1, j] = finish
    return end


def step_span(forward: Sequence[float], backward: Sequence[float], lanes: Sequence[int],
              micro_batches: int) -> float:
    """A GPipe training step's two passes: ``forward[s]`` and ``backward[s]`` are stage s's costs
    per micro-batch, stage s on device ``lanes[s]``; the backward pass visits the stages in reverse."""
    if len(forward) != len(backward):
        raise ValueError(f"one forward and one backward cost per stage: got {len(forward)} and {len(backward)}")
    return (pass_span(forward, lanes, micro_batches)
            + pass_span(list(backward)[::-1], list(lanes)[::-1], micro_batches))


def fused_step_span(forward: Sequence[float], backward: Sequence[float], lanes: Sequence[int],
                    micro_batches: int) -> float:
    """A training step as one sweep of 2S positions (forward through the stages, then backward
    through them in reverse), as :meth:`StageThreads.forward_backward
    <gpulab.parallel.pipeline.threads.StageThreads.forward_backward>` runs it: a device's forward
    and backward work share its time, so only their sum per device needs to be balanced. With
    equal stages it is as long as :func:`step_span` (the same bubble formula)."""
    if len(forward) != len(backward):
        raise ValueError(f"one forward and one backward cost per stage: got {len(forward)} and {len(backward)}")
    return pass_span(list(forward) + list(backward)[::-1], list(lanes) + list(lanes)[::-1], micro_batches)
