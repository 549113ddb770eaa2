"""torch.profiler beside ``profile_loop``: the same loop recorded as a Chrome/Perfetto trace.

``profile_loop`` labels every step's phases with ``torch.profiler.record_function`` (:data:`DATA_WAIT`,
:data:`COPY`, :data:`COMPUTE`), so any torch.profiler session that is running sees them. Pass a
:class:`TorchTrace` to let ``profile_loop`` run that session itself::

    trace = TorchTrace("loop.json", wait=1, warmup=1, active=5)
    prof = profile_loop(loader, step_fn, accel, num_steps=trace.steps_needed, trace=trace)
    print(trace.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))
    label_shares(trace.key_averages(), LABELS)   # ~ prof.fractions over the same steps

From a shell: ``python -m gpulab profile --trace loop.json``; open the file in https://ui.perfetto.dev
or Chrome's ``chrome://tracing``. :func:`top_ops`, :func:`label_shares` and :func:`profile_training`
are the references lab 01's exercises are graded against (what is recorded: the comment below the imports).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import Any, ContextManager, Iterable, Sequence

import torch
from torch.profiler import ProfilerActivity, record_function

# Open the trace in https://ui.perfetto.dev (drag it onto the page) or in Chrome at
# ``chrome://tracing`` (Load).
#
# What is recorded (PyTorch's profiler recipe, "Using profiler to analyze execution time", and the
# ``torch.profiler`` API reference):
# - CPU activities always (every ``aten::`` op the host runs, with its time), CUDA activities
#   (kernels, memcpys, on the GPU's own timeline) when the accelerator is a real GPU;
# - the ``schedule(wait, warmup, active, repeat=1)``: the first ``wait`` steps are not recorded, the
#   next ``warmup`` are recorded and thrown away (the profiler's own start-up cost lands there), the
#   ``active`` ones are kept; each step is a ``ProfilerStep#N`` range, N counting from 0;
# - the file is written once, when the active steps are done (``on_trace_ready``).
#
# ``top_ops`` and ``label_shares`` read ``key_averages()``, and ``profile_training`` records a few
# training steps with ``torch.profiler`` directly.

__all__ = ["TorchTrace", "DATA_WAIT", "COPY", "COMPUTE", "LABELS", "label", "top_ops", "label_shares", "profile_training",
           "check_trace_path"]

# The record_function labels profile_loop puts around each phase of a step.
DATA_WAIT = "gpulab/data_wait"  # next(loader)
COPY = "gpulab/copy"  # accel.copy(batch): host -> device
COMPUTE = "gpulab/compute"  # step_fn(batch): the host's side of the step (launches, syncs; all of it on a CPU device)
LABELS = (DATA_WAIT, COPY, COMPUTE)

STEP_PREFIX = "ProfilerStep"  # key_averages() groups ProfilerStep#2, #3 ... as "ProfilerStep*"


def label(name: str) -> ContextManager:
    """``record_function(name)``: a labelled range in any torch.profiler session that is running
    (about 10 µs per range when none is, measured on the kit's 2-core test VM: small beside a step)."""
    return record_function(name)


def check_trace_path(path: str | os.PathLike) -> Path:
    """Where a trace will be written, checked *before* anything runs, so no run is lost to a typo.

    Raises:
        FileNotFoundError: the folder does not exist.
        IsADirectoryError: the path is a folder.
        PermissionError: the folder is not writable.
    """
    p = Path(path).expanduser()
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise IsADirectoryError(f"the trace path {str(p)!r} is a folder; give a file name such as {str(p / 'trace.json')!r}")
    if not parent.is_dir():
        raise FileNotFoundError(f"cannot write the trace to {str(p)!r}: the folder {str(parent)!r} does not exist; "
                                f"create it (mkdir -p {parent}) or choose another path")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise PermissionError(f"cannot write the trace to {str(p)!r}: no write permission there; choose another path")
    return p


class TorchTrace:
    """A torch.profiler session for :func:`gpulab.profiling.profile_loop` (or any loop of your own).

    Args:
        path: write the Chrome/Perfetto trace (JSON; ``.json.gz`` compresses it) here, or None to
            keep it in memory only (``key_averages()`` still works).
        wait: steps skipped before recording.
        warmup: steps recorded and discarded (profiler start-up cost).
        active: steps recorded and kept.
        record_shapes: also record each op's input shapes (``group_by_input_shape``).
        profile_memory: also record tensor allocations (lab 08 uses this).
        with_stack: also record Python stacks (a heavier trace).

    Raises:
        ValueError: negative ``wait``/``warmup`` or ``active < 1``.
        FileNotFoundError, IsADirectoryError, PermissionError: see :func:`check_trace_path`.

    Attributes:
        profiler: the ``torch.profiler.profile`` of the last run (None before one).
        cuda: whether CUDA activities were recorded.
        written: the path the trace was written to (None until the active steps are done).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, wait: int = 1, warmup: int = 1, active: int = 3,
                 record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False) -> None:
        for name, value, low in (("wait", wait, 0), ("warmup", warmup, 0), ("active", active, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.path = None if path is None else check_trace_path(path)
        self.wait, self.warmup, self.active = wait, warmup, active
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.profiler: torch.profiler.profile | None = None
        self.cuda = False
        self.written: Path | None = None

    @property
    def skip(self) -> int:
        """Steps before the recorded ones (``wait + warmup``)."""
        return self.wait + self.warmup

    @property
    def steps_needed(self) -> int:
        """Steps a loop must run for the trace to be complete (``wait + warmup + active``)."""
        return self.wait + self.warmup + self.active

    @property
    def recorded_steps(self) -> range:
        """The step indices the trace keeps (its ``ProfilerStep#N`` numbers)."""
        return range(self.skip, self.steps_needed)

    def activities(self, device_kind: str) -> list[ProfilerActivity]:
        """CPU always; CUDA too on a real GPU (``device_kind == "cuda"``) when torch can record it."""
        acts = [ProfilerActivity.CPU]
        if device_kind == "cuda" and ProfilerActivity.CUDA in torch.profiler.supported_activities():
            acts.append(ProfilerActivity.CUDA)
        return acts

    def _ready(self, prof: torch.profiler.profile) -> None:
        if self.path is not None:
            prof.export_chrome_trace(str(self.path))
            self.written = self.path

    def session(self, device_kind: str) -> torch.profiler.profile:
        """A new (not yet entered) ``torch.profiler.profile`` with this schedule; kept in ``profiler``."""
        acts = self.activities(device_kind)
        self.cuda = ProfilerActivity.CUDA in acts
        self.written = None
        self.profiler = torch.profiler.profile(
            activities=acts,
            schedule=torch.profiler.schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._ready, **self.options)
        return self.profiler

    def key_averages(self, **kwargs: Any) -> Any:
        """``profiler.key_averages(...)`` of the recorded steps.

        Raises:
            RuntimeError: nothing was recorded yet.
        """
        if self.profiler is None:
            raise RuntimeError("nothing recorded yet: pass this TorchTrace to profile_loop(..., trace=...) first")
        return self.profiler.key_averages(**kwargs)

    def __repr__(self) -> str:
        return (f"TorchTrace(path={None if self.path is None else str(self.path)!r}, wait={self.wait}, "
                f"warmup={self.warmup}, active={self.active})")


class NoTrace:
    """What ``profile_loop`` uses when no trace is asked for: a session that does nothing."""

    skip = 0
    steps_needed = 0

    def session(self, device_kind: str) -> ContextManager:
        return nullcontext(self)

    def step(self) -> None:
        pass


# --- reading key_averages(): the references of lab 01's exercise --------------------------------

def _us(event: Any, attr: str) -> float:
    return float(getattr(event, attr))


def top_ops(averages: Iterable[Any], n: int = 5) -> list[tuple[str, float]]:
    """The ``n`` torch operators (``aten::...``) with the most self CPU time, most first.

    Args:
        averages: ``prof.key_averages()`` (entries with ``key`` and ``self_cpu_time_total`` in µs).
        n: how many.

    Returns:
        ``[(name, self CPU milliseconds), ...]``; ties keep ``key_averages()``'s order.

    Raises:
        ValueError: ``n < 1``.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    ops = [(e.key, _us(e, "self_cpu_time_total") / 1e3) for e in averages if e.key.startswith("aten::")]
    return sorted(ops, key=lambda kv: -kv[1])[:n]


def label_shares(averages: Iterable[Any], labels: Sequence[str] = LABELS) -> dict[str, float]:
    """Each labelled range's share of the recorded steps' time.

    A label's total CPU time (``cpu_time_total``: its ranges' wall time, children included)
    divided by the total of the ``ProfilerStep`` ranges.

    Raises:
        ValueError: no ``ProfilerStep`` range (the profile had no schedule, or no ``prof.step()``),
            or a label that the profile never saw.
    """
    events = list(averages)
    steps_us = sum(_us(e, "cpu_time_total") for e in events if e.key.startswith(STEP_PREFIX))
    if steps_us <= 0:
        raise ValueError("no ProfilerStep ranges in this profile: record with a schedule and call prof.step() "
                         "after every step")
    totals: dict[str, float] = {}
    for e in events:  # one entry per key, or several when grouped by input shape
        totals[e.key] = totals.get(e.key, 0.0) + _us(e, "cpu_time_total")
    missing = [name for name in labels if name not in totals]
    if missing:
        raise ValueError(f"labels {missing} are not in this profile; it has e.g. "
                         f"{[k for k in totals if not k.startswith('aten::')][:8]}")
    return {name: totals[name] / steps_us for name in labels}


def profile_training(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor,
                     targets: torch.Tensor, trace_path: str | os.PathLike, active: int = 3) -> torch.profiler.profile:
    """Record ``2 + active`` training steps with torch.profiler (wait 1, warm up 1, keep ``active``).

    Each step is labelled ``forward`` (the model and ``F.cross_entropy``), ``backward`` and
    ``optimizer`` (``step`` then ``zero_grad``); the trace is written to ``trace_path`` after the
    session ends. CUDA activities are recorded when ``inputs`` are on a GPU.

    Returns:
        The profiler (``key_averages()`` holds the ``active`` steps).
    """
    acts = [ProfilerActivity.CPU]
    if inputs.device.type == "cuda" and ProfilerActivity.CUDA in torch.profiler.supported_activities():
        acts.append(ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts,
                                schedule=torch.profiler.schedule(wait=1, warmup=1, active=active)) as prof:
        for _ in range(2 + active):
            with record_function("forward"):
                loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            with record_function("backward"):
                loss.backward()
            with record_function("optimizer"):
                optimizer.step()
                optimizer.zero_grad()
            prof.step()
    prof.export_chrome_trace(str(trace_path))
    return prof
