"""What throttling looks like: temperature, power and the SM clock, with NVML's reasons decoded.

A GPU that runs too hot or hits its power limit lowers its clocks, and every kernel takes longer:
the same training step slows down with no change in the code. ``nvidia-smi -q -d PERFORMANCE``
prints the reasons; :class:`gpulab.monitor.UtilizationMonitor` samples them with the temperature,
the power draw and the SM clock, and this module reads them back::

    with UtilizationMonitor(interval=0.1) as mon:
        train()
    print(format_thermals(mon))     # per GPU: hottest, most power, clock range, reasons seen
    plot_thermals(mon)              # temperature, power and SM clock over time, throttled samples shaded

The reasons are NVML's ``nvmlClocksEventReasons`` bit mask (NVML API Reference Guide,
"NvmlClocksEventReasons"; called ``ClocksThrottleReasons`` before driver R535). The bits in
:data:`THROTTLING` cost speed under load; ``gpu_idle`` and the clock settings are not throttling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["REASONS", "THROTTLING", "decode_reasons", "ThermalSummary", "summarize_thermals", "format_thermals",
           "plot_thermals"]

# bit -> (name, what NVML's reference says it means)
REASONS: dict[int, tuple[str, str]] = {
    0x001: ("gpu_idle", "nothing runs on the GPU; the clocks drop to idle"),
    0x002: ("applications_clocks_setting", "clocks held at the application clocks someone set (nvidia-smi -ac)"),
    0x004: ("sw_power_cap", "the driver lowers the clocks to stay under the power limit"),
    0x008: ("hw_slowdown", "hardware slowdown (clocks cut by 2x or more): too hot, a power brake, or power too high"),
    0x010: ("sync_boost", "clocks held to the slowest GPU of a sync-boost group"),
    0x020: ("sw_thermal_slowdown", "the driver lowers the clocks because the GPU or its memory is too hot"),
    0x040: ("hw_thermal_slowdown", "hardware slowdown (2x or more) because the GPU is too hot"),
    0x080: ("hw_power_brake_slowdown", "hardware slowdown (2x or more): the power supply asserted the power brake"),
    0x100: ("display_clock_setting", "clocks limited by the display clock setting"),
}
THROTTLING = 0x004 | 0x008 | 0x020 | 0x040 | 0x080  # the reasons that slow a busy GPU down


def decode_reasons(mask: int | float | None) -> list[str]:
    """The names of the bits set in an NVML clocks-event-reasons mask (``[]`` for 0, None or NaN).

    Unknown bits (reasons added after this table) come out as ``"bit 0x..."``.
    """
    if mask is None or mask != mask:  # None or NaN: no reading
        return []
    m = int(mask)
    names = [name for bit, (name, _) in REASONS.items() if m & bit]
    names += [f"bit {1 << k:#x}" for k in range(m.bit_length()) if m & (1 << k) and (1 << k) not in REASONS]
    return names


@dataclass
class ThermalSummary:
    """One GPU over a monitored run. Temperatures in °C, power in W, clocks in MHz; None where NVML
    gave no reading. ``reasons`` maps each reason seen to the share of samples that had it."""

    index: int
    samples: int
    temp_max: float | None
    slowdown_temp: float | None
    power_mean: float | None
    power_max: float | None
    power_limit: float | None
    sm_clock_min: float | None
    sm_clock_max: float | None
    max_sm_clock: float | None
    reasons: dict[str, float] = field(default_factory=dict)

    @property
    def throttled_share(self) -> float:
        """Share of samples with at least one throttling reason (power or thermal)."""
        return self.reasons.get("_throttled", 0.0)


def _stat(fn: Any, x: np.ndarray) -> float | None:
    return None if x.size == 0 or np.all(np.isnan(x)) else float(fn(x))


def summarize_thermals(mon: Any) -> list[ThermalSummary]:
    """Per NVML GPU: temperature, power, SM clock and reasons over the monitor's samples (``[]``
    without GPU readings)."""
    a = mon.arrays()
    limits = {lim.index: lim for lim in getattr(mon, "gpu_limits", [])}
    out = []
    for j in range(a["gpu_util"].shape[1]):
        masks = a["gpu_clock_reasons"][:, j]
        read = masks[~np.isnan(masks)].astype(int)
        reasons: dict[str, float] = {}
        for m in read:
            for name in decode_reasons(m):
                reasons[name] = reasons.get(name, 0.0) + 1 / len(read)
        if read.size:
            reasons["_throttled"] = float(np.mean((read & THROTTLING) != 0))
        lim = limits.get(j)
        out.append(ThermalSummary(
            j, len(a["t"]), _stat(np.nanmax, a["gpu_temp"][:, j]), getattr(lim, "slowdown_temp", None),
            _stat(np.nanmean, a["gpu_power"][:, j]), _stat(np.nanmax, a["gpu_power"][:, j]), getattr(lim, "power_limit", None),
            _stat(np.nanmin, a["gpu_sm_clock"][:, j]), _stat(np.nanmax, a["gpu_sm_clock"][:, j]),
            getattr(lim, "max_sm_clock", None), reasons))
    return out


def _f(x: float | None, unit: str, spec: str = ".0f") -> str:
    return "-" if x is None else f"{x:{spec}} {unit}"


def format_thermals(mon: Any) -> str:
    """Per GPU: the hottest reading against the slowdown temperature, power against the limit, the
    SM clock range against its maximum, and each reason seen with its share of samples."""
    summaries = summarize_thermals(mon)
    if not summaries:
        return (f"no GPU temperature, power or clock readings: {mon.status}. These come from NVML on an NVIDIA GPU; "
                "a CPU-only machine has none to show (its own sensors are not what throttles a GPU job).")
    lines = []
    for s in summaries:
        lines.append(f"gpu{s.index}: {s.samples} samples")
        lines.append(f"  temperature max {_f(s.temp_max, 'C')} (slowdown at {_f(s.slowdown_temp, 'C')})")
        lines.append(f"  power mean {_f(s.power_mean, 'W')}, max {_f(s.power_max, 'W')} (limit {_f(s.power_limit, 'W')})")
        lines.append(f"  SM clock {_f(s.sm_clock_min, 'MHz')} .. {_f(s.sm_clock_max, 'MHz')} (max {_f(s.max_sm_clock, 'MHz')})")
        seen = {k: v for k, v in s.reasons.items() if not k.startswith("_")}
        if not seen:
            lines.append("  clock reasons: none reported" + ("" if "_throttled" in s.reasons else " (not supported here)"))
        for name, share in sorted(seen.items(), key=lambda kv: -kv[1]):
            bit = next((b for b, (n, _) in REASONS.items() if n == name), 0)
            flag = "THROTTLING" if bit & THROTTLING else "not throttling"
            lines.append(f"  {name:<24} in {100 * share:5.1f} % of samples ({flag}): {REASONS.get(bit, ('', ''))[1]}")
        lines.append(f"  throttled (power or thermal) in {100 * s.throttled_share:.1f} % of samples")
    return "\n".join(lines)


def plot_thermals(mon: Any) -> Any:
    """Temperature, power and SM clock of every NVML GPU over time, with the limits as dashed lines
    and the throttled samples shaded. Returns the figure.

    Raises:
        ValueError: the monitor has no GPU readings (a CPU-only machine); the message says why.
    """
    import matplotlib.pyplot as plt

    a = mon.arrays()
    if a["gpu_util"].shape[1] == 0:
        raise ValueError(f"no GPU readings to plot ({mon.status}); temperature, power and clocks come from NVML")
    limits = {lim.index: lim for lim in getattr(mon, "gpu_limits", [])}
    fig, axes = plt.subplots(3, 1, figsize=(10, 6), sharex=True)
    t = a["t"]
    panels = (("gpu_temp", "temperature (C)", "slowdown_temp"), ("gpu_power", "power (W)", "power_limit"),
              ("gpu_sm_clock", "SM clock (MHz)", "max_sm_clock"))
    for j in range(a["gpu_util"].shape[1]):
        masks = np.nan_to_num(a["gpu_clock_reasons"][:, j], nan=0).astype(int)
        throttled = (masks & THROTTLING) != 0
        for ax, (key, ylabel, limit) in zip(axes, panels):
            line, = ax.plot(t, a[key][:, j], label=f"gpu{j}")
            value = getattr(limits.get(j), limit, None)
            if value is not None:
                ax.axhline(value, ls="--", color=line.get_color(), alpha=0.6, label=f"gpu{j} {limit.replace('_', ' ')}")
            ax.fill_between(t, 0, 1, where=throttled, transform=ax.get_xaxis_transform(), color="tab:red", alpha=0.15,
                            label="throttled (power/thermal)" if j == 0 and ax is axes[0] else None)
            ax.set_ylabel(ylabel)
    axes[0].legend(fontsize=8, ncol=3)
    axes[-1].set_xlabel("time (s)")
    axes[0].set_title("NVML: temperature, power and SM clock (red: a throttling reason was set)")
    fig.tight_layout()
    return fig
