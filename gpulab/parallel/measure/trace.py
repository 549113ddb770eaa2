"""When does each all-reduce start, compared with backward? A trace of one training step (lab 06).

Overlap means a gradient's all-reduce starts while backward is still computing earlier layers.
This module records it from the outside, without asking the wrapper anything:

- a hook of its own on every parameter (``register_post_accumulate_grad_hook``, registered
  *before* the wrapper is built, so it runs before the wrapper's hook of the same parameter)
  records when each gradient is ready;
- a ``TorchDispatchMode`` (:class:`CollectiveRecorder`) sees every collective that reaches
  torch's dispatcher (``c10d::allreduce_`` ...), however the Python code called it
  (``dist.all_reduce``, an alias, the process group object), with its size;
- the end of ``backward()`` and of the wrapper's ``finish()``.

Events come back in the order they happened (and with a ``perf_counter`` time each, for plots):
"an all-reduce started before the last gradient was ready" is a fact about order, not speed.
torch's own view of the same thing is ``torch.profiler`` (the ``c10d::allreduce_`` events on each
rank's CPU timeline) or Nsight Systems on GPUs.

    traces = launch(trace_sync, 2, args=([("bucketed", lambda m: BucketedDDP(m, 1.0))], StepTimingConfig()))
    plot_sync_timeline(traces[0])      # rank 0's view
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.measure.timing import StepTimingConfig, deep_mlp

__all__ = ["SyncEvent", "CollectiveRecorder", "trace_step", "trace_sync", "launched_before_last_gradient",
           "plot_sync_timeline"]


@dataclass
class SyncEvent:
    """One thing that happened during a traced step.

    Attributes:
        kind: ``"ready"`` (a gradient), ``"all_reduce"`` (or another collective's name),
            ``"backward_end"``, ``"finish_end"``.
        t: seconds since backward started.
        label: the parameter's name for ``"ready"``; the op for a collective.
        numel: elements the collective carries (0 for the other kinds).
    """

    kind: str
    t: float
    label: str = ""
    numel: int = 0


class CollectiveRecorder(TorchDispatchMode):
    """Records every ``c10d`` collective dispatched while it is active (this thread and autograd's)."""

    def __init__(self, events: list[SyncEvent], t0: float) -> None:
        super().__init__()
        self.events, self.t0 = events, t0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = str(func)  # e.g. "c10d.allreduce_.default"
        if name.startswith("c10d."):
            tensors = args[0] if args and isinstance(args[0], (list, tuple)) else []
            kind = "all_reduce" if name.startswith("c10d.allreduce_.") else name.split(".")[1]
            self.events.append(SyncEvent(kind, time.perf_counter() - self.t0, name,
                                         sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))))
        return func(*args, **(kwargs or {}))


def trace_step(module: nn.Module, wrap: Callable[[nn.Module], nn.Module], inputs: torch.Tensor,
               targets: torch.Tensor, num_steps: int = 2) -> list[SyncEvent]:
    """Wrap ``module`` with ``wrap`` and train ``num_steps`` steps; the events of the last one.

    The wrapper must have ``finish()`` (called after backward, before the optimizer step). The
    gradient-ready hooks are registered on ``module`` before ``wrap`` runs.
    """
    events: list[SyncEvent] = []
    clock = {"t0": time.perf_counter()}
    for name, p in module.named_parameters():
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(
                lambda _p, name=name: events.append(SyncEvent("ready", time.perf_counter() - clock["t0"], name)))
    model = wrap(module)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    for _ in range(num_steps):  # the first step may set things up lazily: the last one is kept
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        events.clear()
        clock["t0"] = time.perf_counter()
        with CollectiveRecorder(events, clock["t0"]):
            loss.backward()
            events.append(SyncEvent("backward_end", time.perf_counter() - clock["t0"]))
            model.finish()
            events.append(SyncEvent("finish_end", time.perf_counter() - clock["t0"]))
        opt.step()
    return list(events)


def trace_sync(rank: int, world_size: int, wrappers: Sequence[tuple[str, Callable[[nn.Module], nn.Module]]],
               cfg: StepTimingConfig | None = None, num_steps: int = 2) -> dict[str, list[SyncEvent]]:
    """Rank body (for :func:`~gpulab.parallel.launcher.launch`): trace one step of each named wrapper.

    Args:
        rank, world_size: as passed by ``launch``.
        wrappers: ``[(name, wrap), ...]``; ``wrap(module)`` returns a DDP wrapper with ``finish()``.
        cfg: the model (``deep_mlp(cfg.width, cfg.depth)``) and the global batch size.
        num_steps: steps per wrapper; the last one is traced.

    Returns:
        ``{name: [SyncEvent, ...]}`` seen on this rank.
    """
    cfg = cfg or StepTimingConfig()
    device = rank_device(rank)
    g = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    local = cfg.batch_size // world_size
    inputs = torch.randn(local, cfg.width, generator=g).to(device)
    targets = torch.randint(0, 10, (local,), generator=g).to(device)
    return {name: trace_step(deep_mlp(cfg.width, cfg.depth, seed=cfg.seed).to(device), wrap, inputs, targets, num_steps)
            for name, wrap in wrappers}


def launched_before_last_gradient(events: Sequence[SyncEvent]) -> tuple[int, int]:
    """``(calls, elements)`` of the all-reduces that started before the last gradient was ready."""
    ready = [i for i, e in enumerate(events) if e.kind == "ready"]
    if not ready:
        return 0, 0
    early = [e for e in events[: ready[-1]] if e.kind == "all_reduce"]
    return len(early), sum(e.numel for e in early)


def plot_sync_timeline(traces: dict[str, list[SyncEvent]], ax: Any = None, title: str = "") -> Any:
    """One row per wrapper: gradients ready (grey ticks), all-reduce launches (markers sized by
    elements), the end of backward and of ``finish()``. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.3 + 0.8 * len(traces)))
    biggest = max((e.numel for evs in traces.values() for e in evs if e.kind == "all_reduce"), default=1) or 1
    for row, (name, events) in enumerate(traces.items()):
        y = len(traces) - 1 - row
        ready = [1e3 * e.t for e in events if e.kind == "ready"]
        ax.plot(ready, [y + 0.18] * len(ready), "|", color="0.5", ms=9, label="gradient ready" if row == 0 else None)
        launches = [e for e in events if e.kind == "all_reduce"]
        ax.scatter([1e3 * e.t for e in launches], [y - 0.12] * len(launches), s=[15 + 150 * e.numel / biggest for e in launches],
                   color="tab:blue", alpha=0.7, label="all-reduce launched (size: elements)" if row == 0 else None)
        for kind, color, label in (("backward_end", "tab:red", "backward() returned"), ("finish_end", "tab:green", "finish() returned")):
            t = [1e3 * e.t for e in events if e.kind == kind]
            if t:
                ax.plot([t[0]] * 2, [y - 0.35, y + 0.35], color=color, lw=2, label=label if row == 0 else None)
    ax.set_yticks(range(len(traces)), list(reversed(list(traces))))
    ax.set_xlabel("ms since backward() started")
    ax.set_title(title or "one training step: when each all-reduce starts")
    ax.set_ylim(-0.6, len(traces) - 0.4)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=4, frameon=False)  # below: rows stay clear
    return ax
