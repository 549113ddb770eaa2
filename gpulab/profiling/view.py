"""Views of a :class:`gpulab.profiling.LoopProfile`: a text report and a timeline plot."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["format_profile", "plot_profile"]


def format_profile(prof: Any) -> str:
    """Steps, device, throughput, the share of each phase, and the verdict."""
    f = prof.fractions
    unit = "samples/s" if prof.batch_size else "steps/s"
    lines = [f"profile_loop: {prof.num_steps} steps on {prof.device}; "
             f"num_workers={prof.num_workers}, {prof.cpu_count} cores, batch_size={prof.batch_size}",
             f"  wall {prof.wall_s:.2f} s, {prof.throughput:.1f} {unit}",
             f"  device busy    {100 * prof.busy_fraction:5.1f} %"]
    # host-side phases; "host" is the step function's own host time (launching work, Python)
    for k, label in (("data", "data wait"), ("copy", "copy"), ("sync", "sync"), ("host", "step work"),
                     ("other", "other")):
        lines.append(f"  host {label:<9} {100 * f[k]:5.1f} %")
    lines.append("verdict: " + prof.verdict)
    return "\n".join(lines)


def plot_profile(prof: Any, max_steps: int = 12, ax: Any = None) -> Any:
    """Host lanes over the device lane for the first ``max_steps`` steps, then the per-step bars
    (only the timeline when drawing into a given ``ax``). Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 5.2), gridspec_kw={"height_ratios": [1.2, 1]})
    else:
        fig, ax2 = ax.figure, None
    end = float(prof.host_times[min(max_steps, prof.num_steps) - 1, 3]) if prof.num_steps else prof.wall_s
    lanes = prof.timeline()
    colours = ["tab:red", "tab:orange", "tab:blue", "tab:green"]
    for row, ((name, ivs), colour) in enumerate(zip(lanes.items(), colours)):
        bars = [(a * 1e3, (b - a) * 1e3) for a, b in ivs if a <= end and b > a]
        ax.broken_barh(bars, (row - 0.35, 0.7), color=colour)
    ax.set_yticks(range(len(lanes)), list(lanes))
    ax.invert_yaxis()
    ax.set_xlim(0, end * 1e3 * 1.02)
    ax.set_xlabel("time (ms)")
    label = "simulated accelerator" if prof.mode == "simulated" else prof.device
    ax.set_title(f"{prof.num_steps} steps on {label}: device busy {100 * prof.busy_fraction:.0f} %, {prof.bound}-bound")
    if ax2 is not None:
        steps = np.arange(prof.num_steps)
        bottom = np.zeros(prof.num_steps)
        for name, arr, colour in (("data wait", prof.data_s, "tab:red"), ("copy", prof.copy_s, "tab:orange"),
                                  ("sync", prof.sync_s, "tab:purple"), ("host", prof.host_s, "tab:blue")):
            ax2.bar(steps, arr * 1e3, bottom=bottom, color=colour, label=name)
            bottom += arr * 1e3
        ax2.plot(steps, prof.compute_s * 1e3, "k.-", label="device compute")
        ax2.set(xlabel="step", ylabel="ms", title="per step: host phases (bars) and device compute (line)")
        ax2.legend(fontsize=8, ncol=5)
    fig.tight_layout()
    return fig
