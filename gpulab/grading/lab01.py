"""Lab 01's graders: the references masked while it is graded, and the inputs its hidden tests draw
from the grading run's seed (intervals, kernels, loop profiles, loop C's batches).

Everything here returns plain values for the test cells to send (:mod:`gpulab.evidence.codec`);
nothing decides a verdict, and nothing computes an expected value: the same test run against the
solution in the reference kernel gives it. Exercise 3's loop C is timed by the grader
(``grading.check_measured``), on device time that a busy CPU does not stretch. The torch.profiler
exercises' graders (``key_averages()`` tables, a model to profile, your own loop under a
stopwatch) are in :mod:`gpulab.grading.lab01_profiler`, re-exported here.
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any, Callable

import torch

from gpulab.accel import spin
from gpulab.grading.lab01_profiler import (
    LABELS,
    annotations,
    key_averages_cases,
    key_averages_table,
    phases_case,
    phases_run,
    plain_loop,
    seeded_training,
    train_plain,
)
from gpulab.profiling.bottleneck import busy_fraction, classify, classify_profile, sm_activity
from gpulab.profiling.phases import profile_phases
from gpulab.profiling.torch_trace import label_shares, profile_training, top_ops

__all__ = [
    "REFERENCES",
    "outcome",
    "outcomes",
    "interval_cases",
    "kernel_cases",
    "profile_cases",
    "key_averages_table",
    "key_averages_cases",
    "loop_c_batches",
    "run_loop_c",
    "LOOP_C_DEVICE_S",
    "LABELS",
    "annotations",
    "seeded_training",
    "train_plain",
    "phases_case",
    "phases_run",
    "plain_loop",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask). profile_loop's LoopProfile survives the busy fraction and the classification
# being masked (gpulab.profiling.result). Left out: profile_loop and TorchTrace (the demos record with
# them; a profile_training that calls them shows their gpulab/... ranges in its trace, which the test
# compares with the reference's), and DeviceValue.item / __repr__ (methods cannot be masked; the sync
# exercise is timed by the grader instead).
REFERENCES: tuple = (
    busy_fraction,
    sm_activity,
    classify,
    classify_profile,
    top_ops,
    label_shares,
    profile_training,
    profile_phases,
)


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or ``"raises <ExceptionType>"`` (a ValueError of any kind counts as
    ValueError), so that cases where an error is the answer can be sent beside the others."""
    try:
        return fn(*args, **kwargs)
    except ValueError:
        return "raises ValueError"
    except Exception as err:  # the student's code raised: that is the answer sent
        return f"raises {type(err).__name__}"


def outcomes(fn: Callable[..., Any], cases: dict[str, tuple]) -> dict[str, Any]:
    """``{name: outcome(fn, *args)}`` for every case."""
    return {name: outcome(fn, *args) for name, args in cases.items()}


def _short(intervals: list, k: int = 3) -> str:
    shown = ", ".join(
        f"({a:.3g}, {b:.3g})" if len(iv) == 2 else f"({a:.3g}, {b:.3g}, {iv[2]:.2g})"
        for iv in intervals[:k]
        for a, b in [iv[:2]]
    )
    return f"[{shown}{', ...' if len(intervals) > k else ''}]"


def interval_cases(rng: random.Random, n: int = 40) -> dict[str, tuple[list[tuple[float, float]], float, float]]:
    """``n`` random ``(intervals, start, end)`` cases for ``busy_fraction``: unsorted, overlapping,
    nested, touching, empty and zero-length intervals, windows that cut them, a profile-like device
    lane, and a few empty windows (``end <= start``: a ValueError)."""
    cases: dict[str, tuple[list[tuple[float, float]], float, float]] = {}
    for i in range(n):
        kind = rng.randrange(6)
        if kind == 0:  # a device lane: one queue, gaps between steps
            t, ivs = rng.uniform(-0.05, 0.05), []
            for _ in range(rng.randint(5, 30)):
                t += rng.uniform(0.0, 0.03)
                d = rng.uniform(0.005, 0.025)
                ivs.append((t, t + d))
                t += d
            a, b = 0.0, t + rng.uniform(0.0, 0.05)
        elif kind == 1:  # touching and nested intervals
            base = [(float(k), float(k + 1)) for k in range(rng.randint(1, 6))]
            ivs = base + [(k + 0.25, k + 0.5) for k, _ in base if rng.random() < 0.5]
            a, b = rng.uniform(-1, 1), rng.uniform(2, 8)
        else:  # anything
            ivs = []
            for _ in range(rng.randint(0, 12)):
                s = round(rng.uniform(-1, 10), rng.choice([1, 6]))  # rounded: ties and shared ends
                ivs.append((s, s + rng.choice([0.0, round(rng.uniform(0, 3), 2), rng.uniform(0, 3)])))
            a, b = sorted(rng.uniform(-0.5, 10) for _ in range(2))
            if rng.random() < 0.1:
                a, b = b, min(a, b - 1e-3)  # an empty window: end < start, a ValueError
        rng.shuffle(ivs)
        cases[f"case {i}: busy_fraction({_short(ivs)} ({len(ivs)} intervals), {a:.4g}, {b:.4g})"] = (ivs, a, b)
    cases["an empty window: busy_fraction([(0, 1)], 2.0, 2.0)"] = ([(0.0, 1.0)], 2.0, 2.0)
    cases["a window that ends before it starts: busy_fraction([(0, 1)], 2.0, 1.0)"] = ([(0.0, 1.0)], 2.0, 1.0)
    return cases


def kernel_cases(rng: random.Random, n: int = 30) -> dict[str, tuple[list[tuple[float, float, float]], float, float]]:
    """``n`` random ``(kernels, start, end)`` cases for ``sm_activity``: kernels one after another
    with random SM shares (0 and 1 included), windows that cut them, and an empty window."""
    cases: dict[str, tuple[list[tuple[float, float, float]], float, float]] = {}
    for i in range(n):
        t, ks = rng.uniform(-1, 1), []
        for _ in range(rng.randint(0, 10)):
            t += rng.uniform(0, 0.5)
            d = rng.uniform(0, 0.8)
            ks.append((t, t + d, rng.choice([0.0, 1.0, 1 / 132, rng.random(), rng.random()])))
            t += d
        a, b = sorted(rng.uniform(-0.5, 4) for _ in range(2))
        if b - a < 1e-3:
            b = a + 0.5
        cases[f"case {i}: sm_activity({_short(ks)} ({len(ks)} kernels), {a:.4g}, {b:.4g})"] = (ks, a, b)
    cases["no kernels"] = ([], 0.0, rng.uniform(0.5, 2))
    cases["an empty window (end == start)"] = ([(0.0, 1.0, 0.5)], 1.0, 1.0)
    return cases


def profile_cases(rng: random.Random, n: int = 40) -> dict[str, SimpleNamespace]:
    """``n`` made-up loop profiles for ``classify``: only ``busy_fraction`` and ``fractions`` (with the
    ``other`` and ``compute`` keys a real profile has), around the 0.85 threshold and with ties."""
    cases: dict[str, SimpleNamespace] = {}
    for i in range(n):
        busy = rng.choice([0.85, 0.8499, 0.9, 1.0, 0.0, round(rng.random(), 2), rng.random()])
        grid = rng.random() < 0.5  # coarse values tie often
        f = {k: round(rng.random() * 0.6, 1) if grid else rng.random() * 0.6 for k in ("data", "copy", "sync", "host")}
        f.update(other=rng.random() * 0.2, compute=busy)
        shown = ", ".join(f"{k}={v:.3g}" for k, v in f.items() if k in ("data", "copy", "sync", "host"))
        cases[f"case {i}: busy_fraction={busy:.4g}, fractions {shown}"] = SimpleNamespace(
            busy_fraction=busy, fractions=f
        )
    return cases


# --- exercise 3: loop C, with and without the per-step sync --------------------------------------

LOOP_C_DEVICE_S = 0.020  # device work per step (accel.compute(0.020, inputs), as in step_with_sync)
LOOP_C_SAMPLE_S = 0.0005  # CPU per sample: 8 ms per batch of 16


def loop_c_batches(seed: int, steps: int, batch_size: int = 16, sample_cost_s: float = LOOP_C_SAMPLE_S) -> Any:
    """Loop C's batches, drawn from ``seed``: ``(inputs, targets)`` uint8 images and labels, each
    costing ``sample_cost_s`` of CPU per sample (a busy loop, as the lab's loader)."""
    gen = torch.Generator().manual_seed(int(seed))
    for _ in range(steps):
        spin(sample_cost_s * batch_size)  # "decode + augment"
        yield (
            torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, generator=gen),
            torch.randint(0, 10, (batch_size,), generator=gen),
        )


def run_loop_c(step_fn: Callable[[Any], Any], accel: Any, seed: int, steps: int) -> None:
    """Loop C: fetch a batch, copy it (``non_blocking=True``), call ``step_fn`` on it. Waits for nothing."""
    for batch in loop_c_batches(seed, steps):
        step_fn(accel.copy(batch, non_blocking=True))
