"""gpulab.profiling.view: the text report shows the hand-computed shares of a known profile, and the
plot draws one lane per timeline entry (and the per-step bars unless drawing into a given axis)."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np

from gpulab.profiling import LoopProfile
from gpulab.profiling.view import format_profile, plot_profile

matplotlib.use("Agg")


def _profile() -> LoopProfile:
    """4 steps of 100 ms: 60 ms data wait, 10 ms copy, 10 ms step work, 20 ms of device compute each."""
    starts = np.arange(4) * 0.1
    host_times = np.stack([starts, starts + 0.06, starts + 0.07, starts + 0.08], axis=1)
    return LoopProfile(
        mode="simulated", device="sim:0", step_s=np.full(4, 0.1), data_s=np.full(4, 0.06), copy_s=np.full(4, 0.01),
        sync_s=np.zeros(4), host_s=np.full(4, 0.01), compute_s=np.full(4, 0.02), host_times=host_times,
        device_intervals=[(s + 0.08, s + 0.10) for s in starts], wall_s=0.4, num_workers=0, cpu_count=8, batch_size=8)


def test_the_text_report_shows_every_share() -> None:
    prof = _profile()
    lines = format_profile(prof).splitlines()
    assert lines[0] == "profile_loop: 4 steps on sim:0; num_workers=0, 8 cores, batch_size=8"
    assert lines[1] == "  wall 0.40 s, 80.0 samples/s"
    assert lines[2] == "  device busy     20.0 %"
    assert lines[3:8] == ["  host data wait  60.0 %", "  host copy       10.0 %", "  host sync        0.0 %",
                          "  host step work  10.0 %", "  host other      20.0 %"]
    assert lines[-1] == "verdict: " + prof.verdict
    assert str(prof) == prof.summary() == format_profile(prof)


def test_the_plot_has_a_lane_per_timeline_entry_and_the_per_step_bars() -> None:
    prof = _profile()
    fig = plot_profile(prof)
    timeline, bars = fig.axes
    assert [t.get_text() for t in timeline.get_yticklabels()] == list(prof.timeline())
    assert len(timeline.collections) == 4  # one broken_barh per lane
    assert len(bars.patches) == 4 * 4  # data, copy, sync, host bars for each of the 4 steps
    assert "20 %" in timeline.get_title() and "data-bound" in timeline.get_title()
    plt.close(fig)
    fig2, ax = plt.subplots()
    assert plot_profile(prof, ax=ax) is fig2 and len(fig2.axes) == 1
    plt.close(fig2)
