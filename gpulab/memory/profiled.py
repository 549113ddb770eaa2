"""torch.profiler's view of memory, step by step: the standard tool beside LeakFinder, on any machine.

``torch.profiler.profile(profile_memory=True)`` records every allocation and free of the CPU
allocator (and of the CUDA caching allocator on a GPU) with the op that was running (PyTorch
docs, "PyTorch Profiler" recipe, "Using profiler to analyze memory consumption").
:class:`MemoryProfile` wraps it around a loop and puts each iteration in a
``record_function("step")`` range, so that three views come out of one run:

- :meth:`~MemoryProfile.net_per_step`: bytes allocated minus bytes freed inside each step. A
  loop that keeps something from every step shows the same positive figure step after step; a
  steady loop frees as much as it allocates (about 0).
- :meth:`~MemoryProfile.table`: ``key_averages().table(sort_by="self_cpu_memory_usage")``, bytes
  per op. It names the ops that *allocate* most; a tensor freed later, outside any op, is
  credited to no op, so this table looks the same for a leaking loop and a fixed one.
- :meth:`~MemoryProfile.snapshot`: the memory still alive when profiling stopped, in the CUDA
  snapshot's format (built by torch's ``_memory_viz``), with the Python frames that allocated it:
  :func:`gpulab.memory.snapshot.summarize` reads it, and :meth:`~MemoryProfile.write_html` draws
  it with the viewer of https://pytorch.org/memory_viz.

    with MemoryProfile() as prof:
        for inputs, targets in prof.watch(batches):
            ...
    print(prof.net_per_step())
    print(prof.table(row_limit=8))

Warning:
    With ``with_stack=True`` torch's Python tracer keeps raw pointers to the code objects of the
    frames it saw, and reads their names only when the results are parsed. A code object freed
    in between (a module imported while profiling, a notebook cell that has finished) leaves a
    dangling name, and parsing fails with ``UnicodeDecodeError`` now and then (pytorch/pytorch
    issues 64345 and 136040). So :class:`MemoryProfile` warms the profiler up once per process
    (its first start imports hundreds of modules), and parses everything, the snapshot included,
    as its ``with`` block ends, while the profiled code is still alive.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gpulab.devices.physical import cuda_device_count

__all__ = ["MemoryProfile"]

# the names torch.profiler gives Python calls (with_stack=True): "file.py(12): fn", "<built-in ...>", "nn.Module: X"
_PYTHON_EVENT = re.compile(r"^(<built-in .*|.*\.py\(\d+\): .*|nn\.Module: .*)$")
_warmed: set[bool] = set()  # cuda or not: the kinds of profile started once in this process


def _warm_up(activities: list) -> None:
    """Start and stop a profile once per process, without the Python tracer: the first start imports
    hundreds of modules, and the tracer must never see their code objects, which are freed once
    imported (it caches a pointer to each code object it meets, across profiles)."""
    key = ProfilerActivity.CUDA in activities
    if key in _warmed:
        return
    with profile(activities=activities, profile_memory=True):
        torch.empty(1)
    for name in ("torch.profiler.python_tracer", "torch.profiler._cupti_monitor"):  # imported on a first stop
        try:
            importlib.import_module(name)
        except ImportError:  # not in every torch version
            pass
    _warmed.add(key)


class MemoryProfile:
    """torch.profiler with ``profile_memory=True`` around a loop, one ``record_function`` range per step.

    Args:
        label: the name of each step's range (what the trace and the tables call it).
        with_stack: record Python frames (needed by :meth:`snapshot` and :meth:`write_html`;
            it costs time per Python call while profiling).
        cuda: also record the GPU (default: when CUDA is usable).

    Attributes:
        profiler: the ``torch.profiler.profile`` (for ``key_averages()``, ``export_chrome_trace``...).
    """

    def __init__(self, label: str = "step", *, with_stack: bool = True, cuda: bool | None = None) -> None:
        if not label or not isinstance(label, str):
            raise ValueError(f"label names each step's range: a non-empty str, got {label!r}")
        self.label = label
        self.with_stack = with_stack
        use_cuda = (cuda_device_count() > 0 and torch.cuda.is_available()) if cuda is None else cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        # record_shapes and with_stack are what torch's memory profiler needs to tell tensors apart
        # and to say where they were made (the snapshot below)
        self._activities = activities
        self.profiler = profile(activities=activities, profile_memory=True, record_shapes=with_stack,
                                with_stack=with_stack)
        self.cuda = use_cuda
        self._range: Any = None
        self._events: Any = None
        self._snapshot: dict[str, Any] | None = None
        self._state = "new"

    def __enter__(self) -> "MemoryProfile":
        if self._state != "new":
            raise RuntimeError("a MemoryProfile records one run: create a new MemoryProfile() for another")
        _warm_up(self._activities)
        self.profiler.__enter__()
        self._state = "active"
        return self

    def __exit__(self, *exc: Any) -> None:
        self._end_step()  # a loop that raised (out of memory) leaves its step open
        self.profiler.__exit__(*exc)
        self._state = "done"
        # Parse now, while every profiled frame's code is alive (see the module's Warning).
        self._events = self.profiler.events()
        if self.with_stack:
            from torch.cuda._memory_viz import _profile_to_snapshot  # private: no public name exists

            self._snapshot = _profile_to_snapshot(self.profiler)

    # -- steps ------------------------------------------------------------------------------------

    def _begin_step(self) -> None:
        self._range = record_function(self.label)
        self._range.__enter__()

    def _end_step(self) -> None:
        if self._range is not None:
            rng, self._range = self._range, None
            rng.__exit__(None, None, None)

    def watch(self, iterable: Iterable) -> Iterator:
        """Yield the items of ``iterable``; each iteration of your loop is one step's range."""
        if self._state != "active":
            raise RuntimeError("watch() outside the profile: use it inside `with MemoryProfile() as prof:`")
        for item in iterable:
            self._begin_step()
            try:
                yield item  # your loop's body runs here, inside the range
            finally:
                self._end_step()

    # -- reading the results ----------------------------------------------------------------------

    def _done(self, what: str) -> None:
        if self._state != "done":
            raise RuntimeError(f"{what}() reads a finished profile: call it after the `with MemoryProfile()` block")

    def _steps(self) -> list[Any]:
        events = [e for e in self._events if e.name == self.label]
        return sorted(events, key=lambda e: e.time_range.start)

    def net_per_step(self, device: str | None = None) -> list[int]:
        """Bytes allocated minus bytes freed inside each step, on ``"cpu"`` or ``"cuda"`` (default: the
        GPU when the profile recorded one, as :meth:`table` sorts, else the CPU)."""
        self._done("net_per_step")
        if device is None:
            device = "cuda" if self.cuda else "cpu"
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device is 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not self.cuda:
            raise ValueError("this profile recorded no GPU: net_per_step('cpu'), or profile on a GPU")
        if device == "cpu":
            return [int(e.cpu_memory_usage) for e in self._steps()]
        # FunctionEvent.device_memory_usage (cuda_memory_usage before torch 2.4)
        return [int(getattr(e, "device_memory_usage", None) or getattr(e, "cuda_memory_usage", 0))
                for e in self._steps()]

    def table(self, sort_by: str | None = None, row_limit: int = 10) -> str:
        """``key_averages().table(...)``: time and memory per op, sorted by ``sort_by``
        (default ``"self_cpu_memory_usage"``, or ``"self_device_memory_usage"`` with CUDA)."""
        self._done("table")
        if sort_by is None:
            sort_by = "self_device_memory_usage" if self.cuda else "self_cpu_memory_usage"
        averages = self._events.key_averages()
        # Ops and ranges only: with_stack adds an event per Python call of *every* thread (a notebook
        # kernel's ZMQ threads too), and torch charges memory to such an event by time, not by thread.
        averages[:] = [a for a in averages if not _PYTHON_EVENT.match(a.key or "")]
        return averages.table(sort_by=sort_by, row_limit=row_limit)

    def snapshot(self) -> dict[str, Any]:
        """The memory alive when profiling stopped, as a CUDA-format snapshot dict (CPU memory is the
        device after the GPUs: device 0 on a CPU-only machine). Read it with
        :mod:`gpulab.memory.snapshot`.

        Built by ``torch.cuda._memory_viz._profile_to_snapshot``, the private function behind
        torch's ``profile_plot``; its frames name functions (``"file.py(12): forward"``), not the
        line that allocated.
        """
        self._done("snapshot")
        if self._snapshot is None:
            raise RuntimeError("snapshot() needs the Python frames: MemoryProfile(with_stack=True)")
        return self._snapshot

    def write_html(self, path: str | Path) -> Path:
        """The profile's memory timeline as an HTML page (torch's ``trace_plot``: the viewer of
        pytorch.org/memory_viz, which the page loads from the web)."""
        from torch.cuda._memory_viz import trace_plot

        path = Path(path)
        path.write_text(trace_plot(self.snapshot()))
        return path
