"""The pipeline bubble: what theory predicts, what a timeline measured, and a picture of both (lab 07).

GPipe (Huang et al. 2019, arXiv 1811.06965) streams M micro-batches through S stages. With equal
stages of t each, a pass takes (M + S - 1) t: S - 1 ticks to fill and as many to drain, so each
stage idles ``bubble_fraction = (S - 1) / (M + S - 1)`` of it (:func:`bubble_fraction`, lab 07's
reference), and the speedup over the same micro-batches one after another is S M / (M + S - 1).

- :func:`measured_bubble` reads the fraction off a :class:`StageEvent` timeline, and
  :func:`plot_timeline` draws it as a Gantt chart;
- :func:`replay` reschedules the measured events with free hand-offs: the bubble that unequal
  stages alone give (in GPipe each pass fills and drains, so each needs balanced stages);
- :func:`handoff_delays`: how long each stage sat ready with its input produced before it
  started (queue wake-up, the GIL, the thread scheduler; on GPUs the copy): the other culprit.

Used by lab 07 and ``benchmarks/model_parallel.py``; ``pytest tests/parallel/pipeline/test_bubble.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["StageEvent", "bubble_fraction", "fused", "measured_bubble", "replay", "handoff_delays", "plot_timeline"]


@dataclass(frozen=True)
class StageEvent:
    """One stage working on one micro-batch.

    Attributes:
        stage: the stage index.
        micro_batch: the micro-batch index.
        phase: ``"forward"`` or ``"backward"``.
        start: seconds since the run began.
        end: seconds since the run began.
        lane: the worker that ran it (the stage's device, counted in order of first use), where
            several stages share one (interleaved stages); None: the stage is its own worker.
    """

    stage: int
    micro_batch: int
    phase: str
    start: float
    end: float
    lane: int | None = None

    @property
    def duration(self) -> float:
        """Seconds of work."""
        return self.end - self.start

    @property
    def worker(self) -> int:
        """The worker (device) that ran it: ``lane``, or the stage when every stage has its own."""
        return self.stage if self.lane is None else self.lane


def bubble_fraction(num_stages: int, num_micro_batches: int, chunks_per_device: int = 1) -> float:
    """The idle share of an ideal pipeline: (S - 1) / (M + S - 1).

    With interleaved stages (each of the S devices holds ``chunks_per_device`` = v equal stages,
    :class:`gpulab.parallel.PipelinedModel`), fill and drain take S - 1 small stages of 1/v the
    work each: (S - 1) / (v M + S - 1).

    Args:
        num_stages: S, the number of pipeline stages (devices), >= 1.
        num_micro_batches: M, the number of micro-batches, >= 1.
        chunks_per_device: v, the stages each device holds, >= 1.

    Raises:
        ValueError: if any is not a positive int.
    """
    for name, v in (("num_stages", num_stages), ("num_micro_batches", num_micro_batches),
                    ("chunks_per_device", chunks_per_device)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return (num_stages - 1) / (chunks_per_device * num_micro_batches + num_stages - 1)


def fused(timeline: Sequence[StageEvent]) -> bool:
    """Whether the timeline is one sweep for the whole step (``PipelinedModel.forward_backward`` on
    the CPU): a backward began before the last forward ended. GPipe's backward pass starts only
    once every forward, and the loss, are done."""
    forward = [e.end for e in timeline if e.phase == "forward"]
    backward = [e.start for e in timeline if e.phase == "backward"]
    return bool(forward and backward) and min(backward) < max(forward)


def measured_bubble(timeline: Sequence[StageEvent], phase: str | None = None) -> float:
    """The idle share of the workers over the span of ``timeline`` (1 - busy / (W x span)).

    A worker is a device: one per stage, or one per device for interleaved stages (``lane``).

    Args:
        timeline: events from one run (``PipelinedModel.timeline``).
        phase: only ``"forward"`` or ``"backward"`` events; None takes each phase's span
            separately and adds them (the loss, computed between them, is nobody's bubble), or the
            whole span where the phases overlap (:func:`fused`).

    Raises:
        ValueError: for an empty timeline or phase.
    """
    busy = span = 0.0
    workers = {e.worker for e in timeline}
    for name, events in _groups(timeline, phase):
        if not events:
            raise ValueError(f"the timeline has no {name!r} events")
        span += max(e.end for e in events) - min(e.start for e in events)
        busy += sum(e.duration for e in events)
    if not workers or span <= 0:
        raise ValueError("the timeline is empty: run the pipelined model first")
    return max(0.0, 1.0 - busy / (len(workers) * span))


def _groups(timeline: Sequence[StageEvent], phase: str | None = None) -> list[tuple[str, list[StageEvent]]]:
    """The parts of the timeline that each fill and drain: each phase of a GPipe step (or only
    ``phase``), or the whole of a fused step."""
    if phase:
        return [(phase, [e for e in timeline if e.phase == phase])]
    if fused(timeline):
        return [("step", list(timeline))]
    return [(ph, [e for e in timeline if e.phase == ph]) for ph in sorted({e.phase for e in timeline})]


def _chain(events: Sequence[StageEvent]) -> list[tuple[str, int]]:
    """The (phase, stage) positions in the order a micro-batch visits them: 0, 1, ... forward,
    then the stages reversed backward."""
    stages = sorted({e.stage for e in events})
    phases = {e.phase for e in events}
    return ([("forward", s) for s in stages if "forward" in phases]
            + [("backward", s) for s in reversed(stages) if "backward" in phases])


def _dependencies(timeline: Sequence[StageEvent]):
    """Each event with the event that produced its input (None on the first position of a pass,
    or of a fused step) and the event its worker ran just before it (None for its first). Yielded
    so that every event comes after both: in order of start time, which is the order the work
    really ran in."""
    for _, group in _groups(timeline):
        events = sorted(group, key=lambda ev: (ev.start, ev.end))
        chain = _chain(events)
        position = {key: p for p, key in enumerate(chain)}
        at = {(e.phase, e.stage, e.micro_batch): e for e in events}
        before: dict[int, StageEvent] = {}
        for e in events:
            p = position[e.phase, e.stage]
            yield e, (at.get((*chain[p - 1], e.micro_batch)) if p else None), before.get(e.worker)
            before[e.worker] = e


def replay(timeline: Sequence[StageEvent]) -> list[StageEvent]:
    """The same schedule with free hand-offs: every event keeps its measured duration and its
    worker's order of work, and starts as soon as its input exists and its worker is free.

    The bubble of the result (:func:`measured_bubble`) is what the stages' durations alone cause:
    above the formula by the imbalance between stages (per pass), below the measured one by what
    the hand-offs cost. Each phase starts at its measured start (a fused step, at its own).

    Raises:
        ValueError: for an empty timeline.
    """
    if not timeline:
        raise ValueError("the timeline is empty: run the pipelined model first")
    done: dict[tuple[str, int, int], StageEvent] = {}
    origin = {e.phase: min(x.start for x in group) for _, group in _groups(timeline) for e in group}
    for e, producer, before in _dependencies(timeline):
        ready = max([origin[e.phase]] + [done[(x.phase, x.stage, x.micro_batch)].end
                                         for x in (producer, before) if x is not None])  # both done: see _dependencies
        done[(e.phase, e.stage, e.micro_batch)] = StageEvent(e.stage, e.micro_batch, e.phase, ready,
                                                             ready + e.duration, e.lane)
    return list(done.values())


def handoff_delays(timeline: Sequence[StageEvent]) -> list[float]:
    """Seconds each event waited with its input ready and its worker free (a hand-off's cost).

    For each event after a pass's first stage: its start minus the later of (the end of the event
    that produced its input, the end of its worker's previous event). Negative values (clock
    noise) count as 0.
    """
    return [max(0.0, e.start - max(producer.end, before.end if before is not None else producer.end))
            for e, producer, before in _dependencies(timeline) if producer is not None]


def plot_timeline(timeline: Sequence[StageEvent], ax: Any = None, title: str = "") -> Any:
    """A Gantt chart: one row per worker (a stage, or a device of interleaved stages), one box per
    piece of work (forward solid, backward hatched).

    Returns:
        The matplotlib axes.
    """
    import matplotlib.pyplot as plt

    shared = any(e.lane is not None and e.lane != e.stage for e in timeline)  # interleaved stages
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len({e.worker for e in timeline})))
    colors = plt.get_cmap("tab10")
    for e in timeline:
        back = e.phase == "backward"
        ax.barh(e.worker, e.duration * 1e3, left=e.start * 1e3, color=colors(e.micro_batch % 10),
                edgecolor="black", linewidth=0.5, hatch="//" if back else None, alpha=0.6 if back else 0.9)
        if e.duration > 0.04 * max(x.end for x in timeline):
            label = f"{e.stage}:{e.micro_batch}" if shared else str(e.micro_batch)
            ax.text((e.start + e.duration / 2) * 1e3, e.worker, label, ha="center", va="center", fontsize=7)
    workers = sorted({e.worker for e in timeline})
    if shared:
        names = [f"device {w} (stages {', '.join(map(str, sorted({e.stage for e in timeline if e.worker == w})))})"
                 for w in workers]
    else:
        names = [f"stage {w}" for w in workers]
    ax.set_yticks(workers, names)
    ax.invert_yaxis()
    ax.set_xlabel("ms (forward solid, backward hatched; the number is the micro-batch"
                  + (", after the stage)" if shared else ")"))
    if title:
        ax.set_title(title)
    return ax
