"""The pipeline bubble: what theory predicts, what a timeline measured, and a picture of both.

A GPipe-style pipeline (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks
using Pipeline Parallelism", arXiv 1811.06965) cuts a batch into M micro-batches and streams them
through S stages. With equal stages taking t per micro-batch, the pass takes (M + S - 1) t: S - 1
ticks to *fill* the pipe and as many to *drain* it. Each stage is busy M t of that time, so the
idle share, the bubble, is

    bubble_fraction = (S - 1) / (M + S - 1)

and the speedup over running the same micro-batches one after another is S M / (M + S - 1).
More micro-batches shrink the bubble, but each costs a fixed overhead (a thread hand-off, a
kernel launch, a smaller and less efficient operation): hence the U-shaped curve of step time
against micro-batch size that the PyTorch model-parallel tutorial measures.

:func:`measured_bubble` reads the same fraction off a :class:`StageEvent` timeline recorded by
:class:`gpulab.parallel.PipelinedModel`, and :func:`plot_timeline` draws it as a Gantt chart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

__all__ = ["StageEvent", "bubble_fraction", "measured_bubble", "plot_timeline"]


@dataclass(frozen=True)
class StageEvent:
    """One stage working on one micro-batch.

    Attributes:
        stage: the stage index.
        micro_batch: the micro-batch index.
        phase: ``"forward"`` or ``"backward"``.
        start: seconds since the run began.
        end: seconds since the run began.
    """

    stage: int
    micro_batch: int
    phase: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Seconds of work."""
        return self.end - self.start


def bubble_fraction(num_stages: int, num_micro_batches: int) -> float:
    """The idle share of an ideal pipeline: (S - 1) / (M + S - 1).

    Args:
        num_stages: S, the number of pipeline stages (devices), >= 1.
        num_micro_batches: M, the number of micro-batches, >= 1.

    Raises:
        ValueError: if either is not a positive int.
    """
    for name, v in (("num_stages", num_stages), ("num_micro_batches", num_micro_batches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def measured_bubble(timeline: Sequence[StageEvent], phase: str | None = None) -> float:
    """The idle share of the stages over the span of ``timeline`` (1 - busy / (S x span)).

    Args:
        timeline: events from one run (``PipelinedModel.timeline``).
        phase: only ``"forward"`` or ``"backward"`` events; None takes each phase's span
            separately and adds them (the loss, computed between them, is nobody's bubble).

    Raises:
        ValueError: for an empty timeline or phase.
    """
    phases = [phase] if phase else sorted({e.phase for e in timeline})
    busy = span = 0.0
    stages = {e.stage for e in timeline}
    for ph in phases:
        events = [e for e in timeline if e.phase == ph]
        if not events:
            raise ValueError(f"the timeline has no {ph!r} events")
        span += max(e.end for e in events) - min(e.start for e in events)
        busy += sum(e.duration for e in events)
    if not stages or span <= 0:
        raise ValueError("the timeline is empty: run the pipelined model first")
    return max(0.0, 1.0 - busy / (len(stages) * span))


def plot_timeline(timeline: Sequence[StageEvent], ax: Any = None, title: str = "") -> Any:
    """A Gantt chart: one row per stage, one box per micro-batch (forward solid, backward hatched).

    Returns:
        The matplotlib axes.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.2 + 0.5 * len({e.stage for e in timeline})))
    colors = plt.get_cmap("tab10")
    for e in timeline:
        back = e.phase == "backward"
        ax.barh(e.stage, e.duration * 1e3, left=e.start * 1e3, color=colors(e.micro_batch % 10),
                edgecolor="black", linewidth=0.5, hatch="//" if back else None, alpha=0.6 if back else 0.9)
        if e.duration > 0.04 * max(x.end for x in timeline):
            ax.text((e.start + e.duration / 2) * 1e3, e.stage, str(e.micro_batch), ha="center", va="center", fontsize=7)
    stages = sorted({e.stage for e in timeline})
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_xlabel("ms (forward solid, backward hatched; the number is the micro-batch)")
    if title:
        ax.set_title(title)
    return ax
