"""Views of a :class:`gpulab.monitor.UtilizationMonitor`: text, a matplotlib timeline, a live widget.

The text view imitates the two screens the source posts watched: an ``nvidia-smi``-like table of
devices and ``htop``-like bars per CPU core. The live view puts that text in an ipywidgets HTML
box that the sampling thread refreshes, so it moves while training runs in the same notebook.
Headless (nbgrader autograde, a script) it degrades to printing the summary when the monitor stops.
"""

from __future__ import annotations

import html
import time
from typing import Any

import numpy as np

__all__ = ["format_sample", "format_summary", "plot_monitor", "attach_live_view"]

GiB = 2**30


def _bar(pct: float, width: int = 20) -> str:
    n = int(round(width * min(max(pct, 0.0), 100.0) / 100.0))
    return "[" + "|" * n + " " * (width - n) + f"{pct:5.1f}%]"


def _fmt(x: float | None, spec: str, unit: str) -> str:
    return "   -" if x is None or x != x else f"{x:{spec}}{unit}"


def format_sample(mon: Any, s: Any) -> str:
    """One reading: devices (nvidia-smi) above, CPU bars (htop) below."""
    # mon.status (e.g. why NVML gives no readings) is said once, by whoever prints it, not on every frame
    lines = [f"t = {s.t:6.1f} s", "devices   util                            memory                 temp    power"]
    for g in s.gpus:
        mem = (f"{g.mem_used / GiB:6.1f} / {g.mem_total / GiB:5.1f} GiB" if g.mem_used is not None and g.mem_total
               else "      -")
        lines.append(f"gpu{g.index:<5} {_bar(g.util or 0.0)}  {mem:22} {_fmt(g.temp, '4.0f', ' C')}  {_fmt(g.power, '5.0f', ' W')}")
    for a, u in zip(mon.accelerators, s.sim):
        lines.append(f"{getattr(a, 'name', 'sim'):<9} {_bar(u)}  (simulated accelerator: busy share, no memory/temp)")
    if not s.gpus and not s.sim:
        lines.append("  (no GPU readings)")
    lines.append("cpu cores (psutil)")
    cores = [f"{i:>3} {_bar(c, 16)}" for i, c in enumerate(s.cpu)]
    for k in range(0, len(cores), 4):
        lines.append("  ".join(cores[k:k + 4]))
    lines.append(f"this process + children: {s.process:6.1f} % of one core, RSS {s.rss / GiB:.2f} GiB")
    return "\n".join(lines)


def format_summary(mon: Any) -> str:
    """Mean / max over the run, then the latest reading."""
    a = mon.arrays()
    n = len(a["t"])
    if n == 0:
        return f"UtilizationMonitor: no samples yet ({mon.status})"
    lines = [f"{n} samples over {a['t'][-1]:.1f} s every {mon.interval:g} s"]
    for j in range(a["gpu_util"].shape[1]):
        u = a["gpu_util"][:, j]
        lines.append(f"  gpu{j}: util mean {np.nanmean(u):5.1f} %, max {np.nanmax(u):5.1f} %")
    for j, acc in enumerate(mon.accelerators):
        u = a["sim_util"][:, j]
        lines.append(f"  {getattr(acc, 'name', 'sim')} (simulated): busy mean {u.mean():5.1f} %, max {u.max():5.1f} %")
    per_core = a["cpu"].mean(axis=0)
    lines.append("  cpu cores mean: " + ", ".join(f"{c:.0f} %" for c in per_core)
                 + f"; busiest core {a['cpu'].max(axis=1).mean():.0f} % on average")
    lines.append(f"  this process + children: mean {a['process'].mean():.0f} % of one core")
    if mon.errors:
        lines.append(f"  sampling errors: {mon.errors[:3]}")
    return "\n".join(lines + ["latest:", format_sample(mon, mon.samples[-1])])


def plot_monitor(mon: Any) -> Any:
    """Device utilisation (NVML GPUs and simulated accelerators) above CPU per core below."""
    import matplotlib.pyplot as plt

    a = mon.arrays()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 5), sharex=True)
    t = a["t"]
    for j in range(a["gpu_util"].shape[1]):
        ax1.plot(t, a["gpu_util"][:, j], label=f"gpu{j} GPU-Util (NVML)")
    for j, acc in enumerate(mon.accelerators):
        ax1.plot(t, a["sim_util"][:, j], label=f"{getattr(acc, 'name', 'sim')} (simulated)")
    if not ax1.lines:
        ax1.text(0.5, 0.5, "no GPU readings: " + mon.status.split(";")[0], ha="center", va="center",
                 transform=ax1.transAxes, fontsize=9, wrap=True)
    else:
        ax1.legend(fontsize=8, loc="upper right")
    ax1.set(ylabel="device busy %", ylim=(-3, 103), title="device utilisation (share of each period with work running)")
    for j in range(a["cpu"].shape[1]):
        ax2.plot(t, a["cpu"][:, j], lw=0.8, alpha=0.7, label=f"core {j}" if a["cpu"].shape[1] <= 8 else None)
    ax2.plot(t, a["process"], "k-", lw=2, label="this process + workers (% of one core)")
    ax2.set(xlabel="time (s)", ylabel="CPU %", title="CPU per core (htop) and this process")
    ax2.legend(fontsize=8, loc="upper right", ncol=2)
    for ax in (ax1, ax2):
        for when, label in mon.marks:
            ax.axvline(when, color="grey", ls="--", lw=1)
            if ax is ax1:
                ax.text(when, 101, " " + label, fontsize=8, va="bottom", rotation=0)
    fig.tight_layout()
    return fig


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


def attach_live_view(mon: Any, refresh: float = 0.5) -> Any:
    """Display an HTML widget that the sampling thread refreshes every ``refresh`` seconds."""
    widget = None
    if _in_kernel():
        try:
            import ipywidgets
            from IPython.display import display

            widget = ipywidgets.HTML(value="<pre>waiting for the first sample...</pre>")
            display(widget)
        except Exception as err:  # no ipywidgets, no frontend: fall back to text
            mon.errors.append(f"live view: {err!r}")
            widget = None
    last = [0.0]

    def update(m: Any, sample: Any) -> None:
        if widget is None:
            if sample is None:  # stopped: the text fallback prints once
                print(format_summary(m))
            return
        now = time.perf_counter()
        if sample is None:  # stopped: keep the last frame; the summary is print(mon.summary())'s to say, once
            text = format_sample(m, m.samples[-1]) if m.samples else "no samples"
            widget.value = "<pre>" + html.escape("[stopped] " + text) + "</pre>"
        elif now - last[0] >= refresh:
            last[0] = now
            widget.value = "<pre>" + html.escape(format_sample(m, sample)) + "</pre>"

    if widget is None:
        print("live view needs a Jupyter kernel with ipywidgets; the summary prints when the monitor stops")
    mon.on_sample(update)
    return widget
