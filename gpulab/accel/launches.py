"""Launch cost and CUDA-graph replay on a simulated device: why many tiny kernels leave a GPU idle (lab 12).

    python -c "from gpulab.accel.launches import *; k = [2e-6] * 40; print(simulate_eager(k), capture(k).replay())"

A GPU kernel starts only after the host has *launched* it: a few microseconds of CPU time per
kernel (Python, the dispatcher, the driver). When a kernel's own work is shorter than that, the
device finishes it and waits for the next launch: GPU-Util can read 100 % while the device is
idle most of the time. A CUDA graph (``torch.cuda.CUDAGraph``; ``torch.compile(mode=
"reduce-overhead")``) records the kernels once and replays them all with **one** launch, so the
device runs them back to back (NVIDIA's CUDA Programming Guide, "CUDA Graphs"; PyTorch's blog
"Accelerating PyTorch with CUDA Graphs", 2021).

This module models that on a virtual clock: the host pays ``launch_s`` per kernel (or
``graph_launch_s`` per replay), and the device runs each kernel as soon as it is launched and the
previous one is done. Nothing waits and nothing is computed, so the timelines are exact and the
same on every machine. Every figure from it is **simulated**: say so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["LaunchCosts", "Timeline", "simulate_eager", "CapturedGraph", "capture", "plot_timelines"]


@dataclass(frozen=True)
class LaunchCosts:
    """The simulated costs, in seconds.

    Args:
        launch_s: host time to launch one kernel eagerly (a few µs on a GPU through PyTorch).
        graph_launch_s: host time to launch one replay of a whole captured graph.
        graph_gap_s: device time between two kernels of a replayed graph (small, not zero).
    """

    launch_s: float = 8e-6
    graph_launch_s: float = 10e-6
    graph_gap_s: float = 0.5e-6

    def __post_init__(self) -> None:
        if min(self.launch_s, self.graph_launch_s, self.graph_gap_s) < 0:
            raise ValueError(f"launch costs must be >= 0 seconds, got {self}")


@dataclass
class Timeline:
    """What the host and the device did, in simulated seconds from 0."""

    host: list[tuple[float, float]] = field(default_factory=list)  # launches
    device: list[tuple[float, float]] = field(default_factory=list)  # kernels

    @property
    def seconds(self) -> float:
        """When the last kernel (or launch) ended: the step time."""
        ends = [e for _, e in self.device] + [e for _, e in self.host]
        return max(ends, default=0.0)

    @property
    def busy_fraction(self) -> float:
        """Share of the step the device spent running kernels."""
        return sum(e - s for s, e in self.device) / self.seconds if self.seconds else 0.0

    def __str__(self) -> str:
        return (f"{len(self.device)} kernels in {self.seconds * 1e6:.1f} µs (simulated), device busy "
                f"{self.busy_fraction:.0%}, {len(self.host)} launch(es)")


def _check(kernels_s: Sequence[float], steps: int) -> None:
    if steps < 1 or any(k < 0 for k in kernels_s):
        raise ValueError(f"need steps >= 1 and kernel times >= 0, got steps={steps}")


def simulate_eager(kernels_s: Sequence[float], costs: LaunchCosts = LaunchCosts(), steps: int = 1) -> Timeline:
    """Each kernel launched on its own: the host pays ``launch_s``, then the device runs it once
    it is free. ``steps`` repeats the whole list."""
    _check(kernels_s, steps)
    tl, host, free = Timeline(), 0.0, 0.0
    for _ in range(steps):
        for k in kernels_s:
            tl.host.append((host, host + costs.launch_s))
            host += costs.launch_s
            start = max(host, free)  # the device starts once launched and done with the previous kernel
            tl.device.append((start, start + k))
            free = start + k
    return tl


@dataclass
class CapturedGraph:
    """A captured sequence of kernels (``torch.cuda.graph(g)``'s recording), ready to replay."""

    kernels_s: tuple[float, ...]

    def replay(self, costs: LaunchCosts = LaunchCosts(), steps: int = 1) -> Timeline:
        """``steps`` replays: one launch each, then every kernel back to back on the device."""
        _check(self.kernels_s, steps)
        tl, host, free = Timeline(), 0.0, 0.0
        for _ in range(steps):
            tl.host.append((host, host + costs.graph_launch_s))
            host += costs.graph_launch_s
            t = max(host, free)
            for i, k in enumerate(self.kernels_s):
                t += costs.graph_gap_s if i else 0.0
                tl.device.append((t, t + k))
                t += k
            free = t
        return tl


def capture(kernels_s: Sequence[float]) -> CapturedGraph:
    """Record a sequence of kernel times once (capture launches nothing that counts)."""
    _check(kernels_s, 1)
    return CapturedGraph(tuple(float(k) for k in kernels_s))


def plot_timelines(timelines: dict[str, Timeline], ax: Any = None, until_s: float | None = None) -> Any:
    """Host launches and device kernels, one pair of lanes per timeline (labelled simulated)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * len(timelines)))
    until = until_s or max(t.seconds for t in timelines.values())
    labels = []
    for i, (name, tl) in enumerate(timelines.items()):
        y = 2 * (len(timelines) - 1 - i)
        for lane, spans, color in ((y + 1, tl.host, "tab:orange"), (y, tl.device, "tab:blue")):
            ax.broken_barh([(s * 1e6, (e - s) * 1e6) for s, e in spans if s < until], (lane + 0.1, 0.8),
                           facecolors=color)
        labels += [(y + 0.5, f"{name}: device"), (y + 1.5, f"{name}: host launches")]
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize="small")
    ax.set(xlim=(0, until * 1e6), xlabel="simulated µs")
    return ax
