"""Reading a loop profile: busy fraction, which resource bounds the loop, and what to try next.

Pure functions on numbers (no timing), so they are easy to test and they are the references that
lab 01's hidden tests compare the student's versions with:

- :func:`busy_fraction` - the share of a time window covered by device busy intervals, which is
  what NVML's GPU-Util approximates by sampling;
- :func:`sm_activity` - the share of the device's SMs that worked, time-averaged: what GPU-Util
  does *not* show (one tiny kernel reads 100 % GPU-Util);
- :func:`classify` - ``"compute"``, ``"data"``, ``"copy"``, ``"sync"`` or ``"host"``-bound
  (:func:`classify_profile` reads the two figures off a profile, as lab 01's exercise does);
- :func:`workers_advice` / :func:`verdict` - one sentence with a recommendation derived from the
  loader's ``num_workers`` and the machine's core count (see the comment below the imports).

    .venv/bin/python -m pytest tests/profiling/test_bottleneck.py
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

# The recommendation is derived, not fixed: the source posts swept ``num_workers`` from 2 to 10 by
# hand on 16 cores and settled on 4.

__all__ = ["busy_fraction", "sm_activity", "classify", "classify_profile", "suggested_workers", "workers_advice", "verdict", "COMPUTE_BOUND_AT", "PHASES"]

#: A loop whose device is busy at least this share of the time is compute-bound.
COMPUTE_BOUND_AT = 0.85
#: The host-side phases of a step; each is a share of the wall time, and they sum to at most 1.
PHASES = ("data", "copy", "sync", "host")


def busy_fraction(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Share of ``[start, end]`` covered by at least one busy interval.

    Intervals may be unsorted, overlap each other (two streams), or stick out of the window;
    overlapping time counts once and only the part inside the window counts.

    Args:
        intervals: ``(begin, finish)`` pairs in seconds, ``begin <= finish``.
        start: window start (seconds, same clock).
        end: window end, ``> start``.

    Returns:
        A number in ``[0, 1]``.

    Raises:
        ValueError: if ``end <= start`` or an interval ends before it begins.
    """
    if not end > start:
        raise ValueError(f"the window must have end > start, got start={start!r}, end={end!r}")
    clipped = []
    for b, f in intervals:
        if f < b:
            raise ValueError(f"interval ({b!r}, {f!r}) ends before it begins")
        b, f = max(b, start), min(f, end)
        if f > b:
            clipped.append((b, f))
    clipped.sort()
    covered, cur_b, cur_f = 0.0, None, None
    for b, f in clipped:
        if cur_f is None or b > cur_f:  # a gap: close the running union
            if cur_f is not None:
                covered += cur_f - cur_b
            cur_b, cur_f = b, f
        else:
            cur_f = max(cur_f, f)
    if cur_f is not None:
        covered += cur_f - cur_b
    return covered / (end - start)


def sm_activity(kernels: Iterable[tuple[float, float, float]], start: float, end: float) -> float:
    """Time-averaged share of the SMs in use over ``[start, end]`` (one stream: kernels do not overlap).

    GPU-Util counts a period as busy if *any* kernel ran; SM activity weights each kernel by the
    share of the streaming multiprocessors it occupied (DCGM reports it as ``SM_ACTIVE``). A
    one-block kernel on a 132-SM H100 running the whole window gives GPU-Util 100 % and SM
    activity 1/132, about 0.8 %.

    Args:
        kernels: ``(begin, finish, sm_share)`` with ``0 <= sm_share <= 1``.
        start, end: the window, ``end > start``.

    Raises:
        ValueError: for an empty window, an interval that ends before it begins, or a share
            outside ``[0, 1]``.
    """
    if not end > start:
        raise ValueError(f"the window must have end > start, got start={start!r}, end={end!r}")
    total = 0.0
    for b, f, share in kernels:
        if f < b:
            raise ValueError(f"kernel ({b!r}, {f!r}) ends before it begins")
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"sm_share must be in [0, 1], got {share!r}")
        total += max(0.0, min(f, end) - max(b, start)) * share
    return total / (end - start)


def classify(busy: float, fractions: Mapping[str, float]) -> str:
    """Which resource bounds the loop.

    Args:
        busy: the device busy fraction.
        fractions: host-side shares of the wall time with keys ``data``, ``copy``, ``sync``,
            ``host`` (see :data:`PHASES`); missing keys count as 0.

    Returns:
        ``"compute"`` when ``busy >= COMPUTE_BOUND_AT``; otherwise the phase with the largest
        share (ties go to the earlier phase in :data:`PHASES`).
    """
    if busy >= COMPUTE_BOUND_AT:
        return "compute"
    return max(PHASES, key=lambda k: (fractions.get(k, 0.0), -PHASES.index(k)))


def classify_profile(profile: Any) -> str:
    """:func:`classify` of a profile, from its ``busy_fraction`` and ``fractions`` alone (lab 01's
    exercise: not from ``profile.bound``)."""
    return classify(profile.busy_fraction, profile.fractions)


def suggested_workers(cpu_count: int) -> tuple[int, int]:
    """A ``num_workers`` range to try: 4-8 on 16 cores, 2-4 on 8 or 4, 1-2 on 2.

    Leave cores for the main process (which runs the step) and the intra-op threads; beyond about
    8 workers per GPU the returns usually vanish while memory grows (each worker holds a copy of
    the dataset object and ``prefetch_factor`` batches).
    """
    n = max(1, int(cpu_count))
    hi = n if n <= 4 else min(8, max(4, n // 2))
    return max(1, hi // 2), hi


def workers_advice(num_workers: int | None, cpu_count: int) -> str:
    """What to try next for a data-bound loop, from its loader's ``num_workers`` and the cores."""
    n = max(1, int(cpu_count))
    if num_workers is None:
        return ("the loader is not a torch DataLoader, so batches are prepared in the main process: "
                "wrap the data in a DataLoader with num_workers > 0")
    if n == 1:
        return ("this machine has 1 core, so workers cannot help: make each sample cheaper "
                "(store uint8, cache decoded data in memory, lighter augmentation) or echo batches")
    lo, hi = suggested_workers(n)
    span = f"{lo}-{hi}" if lo < hi else f"{hi}"
    if num_workers == 0:
        return f"num_workers=0 on {n} cores, try {span}"
    if num_workers < hi:
        first = max(num_workers + 1, lo)
        return (f"num_workers={num_workers} on {n} cores, try {first if first == hi else f'{first}-{hi}'} "
                "with persistent_workers=True")
    if num_workers < n:
        return (f"num_workers={num_workers} on {n} cores: add persistent_workers=True and a larger "
                "prefetch_factor, or make each sample cheaper (uint8, caching)")
    return (f"num_workers={num_workers} already uses all {n} cores: make each sample cheaper "
            "(uint8 instead of float32, cache decoded data in memory) or echo batches")


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def verdict(busy: float, fractions: Mapping[str, float], num_workers: int | None, cpu_count: int,
            device_work_seen: bool = True) -> str:
    """One sentence: the bound, its size, and a recommendation.

    Example: ``"data-bound: 63 % of each step waits for the next batch (device busy 35 %);
    num_workers=0 on 16 cores, try 4-8"``.
    """
    if not device_work_seen:
        return ("no device work seen: step_fn queued nothing on the device that profile_loop timed; "
                "pass profile_loop the same accelerator your step function uses")
    bound = classify(busy, fractions)
    f = {k: fractions.get(k, 0.0) for k in PHASES}
    if bound == "compute":
        return (f"compute-bound: the device is busy {_pct(busy)} of the time and the input pipeline keeps up; "
                "to go faster make the device work cheaper (torch.amp mixed precision, a larger batch) or add devices")
    if bound == "data":
        return (f"data-bound: {_pct(f['data'])} of each step waits for the next batch (device busy {_pct(busy)}); "
                + workers_advice(num_workers, cpu_count))
    if bound == "copy":
        return (f"copy-bound: {_pct(f['copy'])} of each step is the host-to-device copy (device busy {_pct(busy)}); "
                "send uint8 and normalise on the device (4x fewer bytes than float32), "
                "and on a GPU use pin_memory=True with non_blocking=True")
    if bound == "sync":
        return (f"sync-bound: the host waits for the device {_pct(f['sync'])} of each step (device busy {_pct(busy)}), "
                "so the device idles while the next batch is prepared; remove per-step .item()/print/blocking "
                "copies: keep running totals on the device and read them every N steps")
    return (f"host-bound: step_fn keeps the host busy {_pct(f['host'])} of each step while the device idles "
            f"(device busy {_pct(busy)}); move that work to the device or do it once per batch, not per sample")
