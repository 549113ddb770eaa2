"""LeakFinder: watch live memory step by step, say when it grows steadily, and name what survives.

A training loop that leaks (a loss summed as a tensor, outputs kept with their graphs, a hidden
state carried across steps with ``retain_graph=True``) holds a little more memory after every
step until it runs out. :class:`LeakFinder` records the live bytes after each step, flags a
steady growth with a criterion that a one-off allocation or noise does not fool
(:class:`~gpulab.memory.trend.LeakCriterion`), and lists the tensors made during earlier steps that are still alive,
grouped by the line of *your* loop that made them (:mod:`gpulab.memory.origins`)::

    with LeakFinder(track=model) as finder:
        for inputs, targets in finder.watch(batches):      # or call finder.step() per iteration
            ...
    print(finder.report())                                  # the verdict and the surviving tensors
    finder.plot()

Live bytes come from the meter you pass (``meter=``), else ``torch.cuda.memory_allocated`` on a
GPU, else a :class:`~gpulab.devices.MemoryMeter` of its own (a CPU has no allocator statistics).
"""

from __future__ import annotations

import sys
from collections import Counter
from types import CodeType
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from gpulab.devices import registry as placement
from gpulab.devices.meter import MemoryMeter
from gpulab.devices.physical import cuda_device_count
from gpulab.memory.leak_report import LeakReport, LeakSite
from gpulab.memory.origins import Frame, Origin, OriginTracer
from gpulab.memory.trend import LeakCriterion

__all__ = ["LeakFinder", "LeakCriterion", "LeakReport", "LeakSite"]

CodeLine = tuple[CodeType, int]  # a line of Python code, as OriginTracer records each frame


class LeakFinder:
    """Live memory per step, a leak verdict, and the surviving tensors with where they were made.

    Args:
        meter: an active :class:`~gpulab.devices.MemoryMeter` to read live bytes from (the sum
            over its devices). None: ``torch.cuda.memory_allocated`` if ``device`` is a GPU, else
            a meter of the finder's own.
        track: a module or tensors made before the finder (the model) to count in its meter,
            so that relative growth is relative to everything the loop holds.
        device: where the loop runs (default: the device of ``track``, else the CPU).
        window, segments, threshold: the :class:`LeakCriterion`.
        max_records: storages traced at once (bounds the tracer's memory and time).

    Attributes:
        history: live bytes after each step.
        leaking: set (and kept) once the criterion holds; ``leak_step`` says when.

    Raises:
        ValueError: for a bad criterion, or a ``meter`` that is not active.
    """

    def __init__(self, meter: MemoryMeter | None = None, *, track: nn.Module | torch.Tensor | Iterable | None = None,
                 device: torch.device | str | None = None, window: int = 12, segments: int = 4,
                 threshold: int = 1024, max_records: int = 100_000) -> None:
        self.criterion = LeakCriterion(window, segments, threshold)
        if meter is not None and not isinstance(meter, MemoryMeter):
            raise TypeError(f"meter must be a gpulab.devices.MemoryMeter, got {type(meter).__name__}")
        if track is not None and not isinstance(track, (nn.Module, torch.Tensor)):
            track = list(track)  # read twice (device, then meter.track): a generator would be empty
        self._given = meter
        self._track = track
        self._device = torch.device(device) if device is not None else _device_of(track)
        self._max_records = max_records
        self.history: list[int] = []
        self.leaking = False
        self.leak_step: int | None = None
        self._meter: MemoryMeter | None = None
        self._tracer: OriginTracer | None = None
        self._loop_code: CodeType | None = None  # the code whose loop calls step() (see step)
        self._state = "new"
        self.mode = ""

    # -- entering and leaving -------------------------------------------------------------------

    def __enter__(self) -> "LeakFinder":
        if self._state != "new":
            raise RuntimeError("a LeakFinder watches one loop: create a new LeakFinder() for another")
        dev = placement.default_for(self._device)
        if self._given is not None:
            if not self._given.active:
                raise ValueError("meter= must be active: enter it first (`with meter, LeakFinder(meter) as f:`)")
            self._meter = self._given
            self.mode = "the given MemoryMeter"
        elif self._device.type == "cuda" and cuda_device_count():
            self.mode = f"CUDA allocator on {self._device} (torch.cuda.memory_allocated)"
        else:
            self._meter = MemoryMeter(timeline=False)
            self.mode = f"MemoryMeter on {self._device}"
        if self._meter is not None and self._track is not None:
            self._meter.track(self._track, dev)
        if self._meter is not None and self._given is None:
            self._meter.__enter__()
        self._tracer = OriginTracer(max_records=self._max_records)
        self._tracer.__enter__()
        self._state = "active"
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._state != "active":
            raise RuntimeError("this LeakFinder is not active: use it as `with LeakFinder() as finder:`")
        self._state = "done"
        self._tracer.__exit__(*exc)
        if self._meter is not None and self._given is None:
            self._meter.__exit__(*exc)

    # -- per step --------------------------------------------------------------------------------

    def live(self) -> int:
        """Bytes live now, from the finder's source (see ``mode``)."""
        if self._meter is not None:
            return sum(self._meter.live(d) for d in self._meter.devices)
        return int(torch.cuda.memory_allocated(self._device))

    def step(self) -> None:
        """Record the live bytes after one iteration, and judge the trend. Call once per iteration."""
        # The caller's code object is the function (or notebook cell) whose loop calls step():
        # the report names the lines of that code. sys._getframe is CPython's (underscored but
        # documented): the calling frame, without the cost of building a traceback.
        self._record(loop_code=sys._getframe(1).f_code)

    def _record(self, loop_code: CodeType) -> None:
        if self._state != "active":
            raise RuntimeError("step() outside the finder: call it inside `with LeakFinder() as finder:`")
        self._loop_code = loop_code
        self.history.append(self.live())
        self._tracer.step = len(self.history)
        if not self.leaking and self.criterion.check(self.history):
            self.leaking, self.leak_step = True, len(self.history) - 1

    def watch(self, iterable: Iterable) -> Iterator:
        """Yield the items of ``iterable``, calling :meth:`step` after each iteration of your loop."""
        # In a generator, the frame above this one is whoever resumed it: the `for` loop that
        # iterates over watch(...), so its code is the loop's, as in step().
        started = False
        for item in iterable:
            if started:  # the loop asks for the next item: its previous iteration is over
                self._record(loop_code=sys._getframe(1).f_code)
            started = True
            yield item
        if started:  # the loop asked for one more item than there is: its last iteration is over
            self._record(loop_code=sys._getframe(1).f_code)

    # -- reading the results ---------------------------------------------------------------------

    @property
    def growth_per_step(self) -> float:
        """Least-squares slope of live bytes over the latest ``window`` steps (bytes per step)."""
        ys = self.history[-self.criterion.window:]
        n = len(ys)
        if n < 2:
            return 0.0
        x_mean, y_mean = (n - 1) / 2, sum(ys) / n  # x: the step's index in the window, 0..n-1
        covariance = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(ys))
        variance = sum((i - x_mean) ** 2 for i in range(n))
        return covariance / variance

    def growth(self, since: int = 1) -> float:
        """Relative growth of live bytes from after step ``since`` to the last step (0.01 = 1 %).

        Step 0 makes one-off state (gradients, optimizer buffers), so the default starts after it.
        """
        if len(self.history) <= since:
            raise ValueError(f"growth(since={since}) needs more than {since} steps, have {len(self.history)}")
        base = self.history[since]
        return (self.history[-1] - base) / base if base else float(self.history[-1] > 0)

    def survivors(self, min_age: int = 1) -> list[Origin]:
        """Tensors made while watching, still alive, made at least ``min_age`` steps before the last
        one (the last step's own tensors are normally alive)."""
        if self._tracer is None:
            return []
        last = len(self.history)
        return [o for o in self._tracer.alive() if o.step <= last - 1 - min_age]

    def report(self, top: int = 8, min_age: int = 1) -> LeakReport:
        """The verdict and the ``top`` sites holding the most surviving bytes."""
        by_site: dict[CodeLine | None, list[Origin]] = {}
        for origin in self.survivors(min_age):
            by_site.setdefault(self._site(origin), []).append(origin)
        sites = []
        for where, origins in by_site.items():
            biggest = max(origins, key=lambda o: o.nbytes)
            sites.append(LeakSite(
                where=_frame(where), via=_frame(_most_common_via(where, origins)),
                nbytes=sum(o.nbytes for o in origins), tensors=len(origins),
                steps=sorted({o.step for o in origins}),
                example=f"{biggest.shape} {str(biggest.dtype).replace('torch.', '')}"))
        sites.sort(key=lambda site: site.nbytes, reverse=True)
        return LeakReport(self.leaking, self.leak_step, self.growth_per_step, list(self.history), sites[:top],
                          self.mode, self._tracer.dropped if self._tracer else 0)

    def _site(self, origin: Origin) -> CodeLine | None:
        """The line a surviving tensor is reported under: the line of the watched loop that led
        to it (found in its stack, innermost first), else its innermost user frame; None when it
        was made with no Python frame (autograd's device thread on CUDA)."""
        for code, line in origin.stack:
            if code is self._loop_code:
                return code, line
        return origin.stack[0] if origin.stack else None

    def plot(self, ax: Any = None, budget: int | None = None, label: str | None = None) -> Any:
        """Live MiB after each step (the budget dashed, the leak flag marked). Returns the Axes."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(6, 3))
        ax.plot(range(len(self.history)), [b / 2**20 for b in self.history], "o-", ms=3,
                label=label or ("leaking" if self.leaking else "steady"))
        drawn = {line.get_label() for line in ax.get_lines()}  # a second finder on the same axes
        budget = budget if budget is not None else (self._meter.budget if self._meter is not None else None)
        if budget is not None and "budget" not in drawn:
            ax.axhline(budget / 2**20, color="red", linestyle="--", label="budget")
        if self.leak_step is not None:
            ax.axvline(self.leak_step, color="gray", linestyle=":", label="_" if "flagged" in drawn else "flagged")
        ax.set(xlabel="step", ylabel="live MiB after the step")
        ax.legend(fontsize="small")
        return ax


def _most_common_via(where: CodeLine | None, origins: list[Origin]) -> CodeLine | None:
    """The innermost user frame (model code, say) under most of a site's tensors, unless it is
    the site itself."""
    vias: Counter[CodeLine] = Counter()
    for origin in origins:
        if origin.stack and origin.stack[0] != where:
            vias[origin.stack[0]] += 1
    return vias.most_common(1)[0][0] if vias else None


def _frame(entry: CodeLine | None) -> Frame | None:
    """A recorded ``(code, line)`` as a printable :class:`Frame`."""
    if entry is None:
        return None
    code, line = entry
    return Frame(code.co_filename, line, code.co_name)


def _device_of(track: Any) -> torch.device:
    if isinstance(track, nn.Module):
        for t in (*track.parameters(), *track.buffers()):
            return t.device
    elif isinstance(track, torch.Tensor):
        return track.device
    elif track is not None:
        for t in track:  # a list by now
            if isinstance(t, torch.Tensor):
                return t.device
    return torch.device("cpu")
