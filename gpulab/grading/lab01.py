"""Lab 01's graders: the references masked while it is graded, and the inputs its hidden tests draw
from the grading run's seed (intervals, kernels, loop profiles, ``key_averages()`` tables, loop C's
batches, a model to profile).

Everything here returns plain values for the test cells to send (:mod:`gpulab.evidence.codec`);
nothing decides a verdict. The expected values are the references' answers on the same inputs,
computed only in the reference kernel (``grading.by_reference``).
"""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace
from typing import Any, Callable

import torch

from gpulab.accel import spin
from gpulab.profiling.bottleneck import busy_fraction, classify, classify_profile, sm_activity
from gpulab.profiling.phases import DATA, STEP, Stopwatch, profile_phases, trace_shares
from gpulab.profiling.torch_trace import label_shares, profile_training, top_ops

__all__ = ["REFERENCES", "outcome", "outcomes", "interval_cases", "kernel_cases", "profile_cases", "key_averages_table",
           "key_averages_cases", "loop_c_batches", "run_loop_c", "loop_c_reference", "LOOP_C_DEVICE_S",
           "annotations", "seeded_training", "train_plain", "phases_case", "phases_run", "plain_loop"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask). profile_loop's LoopProfile survives the busy fraction and the classification
# being masked (gpulab.profiling.result). Left out: profile_loop and TorchTrace (the demos record with
# them; a profile_training that calls them shows their gpulab/... ranges in its trace, which the test
# compares with the reference's), and DeviceValue.item / __repr__ (methods cannot be masked; the sync
# exercise is timed by the grader instead).
REFERENCES: tuple = (busy_fraction, sm_activity, classify, classify_profile, top_ops, label_shares, profile_training,
                     profile_phases)


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
    shown = ", ".join(f"({a:.3g}, {b:.3g})" if len(iv) == 2 else f"({a:.3g}, {b:.3g}, {iv[2]:.2g})"
                      for iv in intervals[:k] for a, b in [iv[:2]])
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
        cases[f"case {i}: busy_fraction={busy:.4g}, fractions {shown}"] = SimpleNamespace(busy_fraction=busy, fractions=f)
    return cases


_OPS = ("aten::convolution", "aten::mkldnn_convolution", "aten::convolution_backward", "aten::addmm", "aten::mm",
        "aten::relu", "aten::threshold_backward", "aten::native_batch_norm", "aten::max_pool2d_with_indices",
        "aten::add_", "aten::zero_", "aten::copy_", "aten::empty", "aten::_log_softmax", "aten::nll_loss_forward")
_OTHERS = ("autograd::engine::evaluate_function: ConvolutionBackward0", "ConvolutionBackward0", "MmBackward0",
           "Optimizer.step#SGD.step", "cudaLaunchKernel", "[memory]")
LABELS = ("forward", "backward", "optimizer")


def key_averages_table(rng: random.Random) -> list[SimpleNamespace]:
    """A made-up ``key_averages()``: entries with ``key``, ``count``, ``self_cpu_time_total`` and
    ``cpu_time_total`` (integer microseconds, so ties happen), labels and ProfilerStep entries among
    the operators, and some names twice (grouped by input shape, or a range's copy on the GPU's
    timeline with a CPU time of 0)."""
    names = list(rng.sample(_OPS, rng.randint(4, len(_OPS)))) + list(rng.sample(_OTHERS, 3))
    names += [label for label in LABELS if rng.random() < 0.9] + ["ProfilerStep*"]
    names += [rng.choice(names) for _ in range(rng.randint(1, 4))]  # duplicates
    rng.shuffle(names)
    table = []
    for name in names:
        self_us = rng.choice([0, 50, 100, 300, rng.randint(1, 2000), rng.randint(1, 2000)])
        total = self_us + rng.choice([0, rng.randint(0, 50_000)])
        if name in LABELS:
            total += rng.randint(1_000, 30_000)
        if name == "ProfilerStep*":
            total += rng.randint(50_000, 100_000)  # the recorded steps hold everything else
        table.append(SimpleNamespace(key=name, count=rng.randint(1, 9), self_cpu_time_total=float(self_us),
                                     cpu_time_total=float(total)))
    if rng.random() < 0.5:
        table.append(SimpleNamespace(key="forward", count=3, self_cpu_time_total=0.0, cpu_time_total=0.0))
    return table


def key_averages_cases(rng: random.Random, tables: int = 4) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """``(top_ops cases, label_shares cases)``, each ``{name: (table, argument)}``, over a few random
    tables: several ``n`` (0 and one past the number of operators included), the labels present, a
    label that is missing, and a table without ProfilerStep entries."""
    tops: dict[str, tuple] = {}
    shares: dict[str, tuple] = {}
    for t in range(tables):
        table = key_averages_table(rng)
        n_ops = sum(e.key.startswith("aten::") for e in table)
        for n in sorted({1, rng.randint(2, 6), n_ops + 1, 0}):
            tops[f"table {t}, n={n}"] = (table, n)
        present = [label for label in LABELS if any(e.key == label for e in table)]
        shares[f"table {t}, labels {present}"] = (table, present)
        shares[f"table {t}, labels {present[:1] + ['not_recorded']}"] = (table, present[:1] + ["not_recorded"])
        no_steps = [e for e in table if not e.key.startswith("ProfilerStep")]
        shares[f"table {t} without its ProfilerStep entry"] = (no_steps, present[:1])
    return tops, shares


# --- exercise 3: loop C, with and without the per-step sync --------------------------------------

LOOP_C_DEVICE_S = 0.020   # device work per step (accel.compute(0.020, inputs), as in step_with_sync)
LOOP_C_SAMPLE_S = 0.0005  # CPU per sample: 8 ms per batch of 16


def loop_c_batches(seed: int, steps: int, batch_size: int = 16, sample_cost_s: float = LOOP_C_SAMPLE_S) -> Any:
    """Loop C's batches, drawn from ``seed``: ``(inputs, targets)`` uint8 images and labels, each
    costing ``sample_cost_s`` of CPU per sample (a busy loop, as the lab's loader)."""
    gen = torch.Generator().manual_seed(int(seed))
    for _ in range(steps):
        spin(sample_cost_s * batch_size)  # "decode + augment"
        yield (torch.randint(0, 256, (batch_size, 3, 32, 32), dtype=torch.uint8, generator=gen),
               torch.randint(0, 10, (batch_size,), generator=gen))


def run_loop_c(step_fn: Callable[[Any], Any], accel: Any, seed: int, steps: int) -> None:
    """Loop C: fetch a batch, copy it (``non_blocking=True``), call ``step_fn`` on it. Waits for nothing."""
    for batch in loop_c_batches(seed, steps):
        step_fn(accel.copy(batch, non_blocking=True))


def loop_c_reference(accel: Any, seed: int, steps: int) -> float:
    """Loop C without the sync, as the lab's solution writes it: the sum of the losses, read once."""
    total: Any = 0.0

    def step(batch: Any) -> None:
        nonlocal total
        total = total + accel.compute(LOOP_C_DEVICE_S, batch[0])

    run_loop_c(step, accel, seed, steps)
    return float(total)


# --- exercise 5: profile_training ----------------------------------------------------------------

def annotations(path: str) -> dict[str, int]:
    """How many ranges of each name a Chrome trace holds on the CPU's timeline (``user_annotation``:
    ``record_function`` ranges and the ``ProfilerStep#N`` steps)."""
    with open(path) as fh:
        trace = json.load(fh)
    counts: dict[str, int] = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "user_annotation":
            counts[e.get("name")] = counts.get(e.get("name"), 0) + 1
    return dict(sorted(counts.items()))


def seeded_training(seed: int, device: torch.device, batch_size: int, lr: float) -> tuple:
    """``(model, optimizer, inputs, targets)``: a SmallCNN initialised from ``seed``, SGD, and a
    batch drawn from ``seed``; the same every time for the same arguments."""
    from gpulab.models import SmallCNN

    gen = torch.Generator().manual_seed(int(seed))
    inputs = torch.randn(batch_size, 3, 32, 32, generator=gen).to(device)  # (B, C, H, W)
    targets = torch.randint(0, 10, (batch_size,), generator=gen).to(device)
    torch.manual_seed(int(seed))
    model = SmallCNN(num_classes=10).to(device)
    return model, torch.optim.SGD(model.parameters(), lr=lr), inputs, targets


def train_plain(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor,
                steps: int) -> list[torch.Tensor]:
    """``steps`` training steps without a profiler; the parameters after them (on the host)."""
    for _ in range(steps):
        torch.nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().cpu() for p in model.parameters()]


# --- exercise 7: torch.profiler on your own loop -------------------------------------------------

def phases_case(rng: random.Random) -> dict[str, Any]:
    """The loop the hidden test profiles: ``active`` recorded steps, a batch size and a CPU cost per
    sample (the loop is data-bound at the largest costs, step-bound at the smallest)."""
    return {"active": rng.randint(3, 5), "batch_size": rng.choice([8, 12, 16]),
            "sample_cost_s": rng.choice([0.0005, 0.001, 0.002, 0.003]), "lr": rng.choice([0.01, 0.05, 0.1])}


def _loop_parts(seed: int, case: dict[str, Any]) -> tuple[Any, Callable[[Any], Any], torch.nn.Module]:
    """A seeded loader of ``2 + active`` batches and a SmallCNN training step on the host."""
    from gpulab.models import SmallCNN
    from gpulab.profiling.workloads import BusyDataset

    n = (2 + case["active"]) * case["batch_size"]
    loader = torch.utils.data.DataLoader(BusyDataset(n, case["sample_cost_s"], seed=int(seed) % 2**31),
                                         batch_size=case["batch_size"])
    torch.manual_seed(int(seed))
    model = SmallCNN(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=case["lr"])

    def train_step(batch: Any) -> Any:
        images, labels = batch  # uint8 (B, 3, 32, 32)
        loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return loader, train_step, model


def phases_run(profile_fn: Callable[..., Any], seed: int, case: dict[str, Any], trace_path: str) -> dict[str, Any]:
    """Run ``profile_fn(loader, train_step, trace_path, active=...)`` on :func:`phases_case`'s loop,
    with gpulab's :class:`~gpulab.profiling.phases.Stopwatch` around the loader and the step.

    Returns:
        ``ranges`` (:func:`annotations` of the trace), ``profiler`` (the ``data`` and ``step``
        ranges' shares of their sum over the recorded steps, read from the trace), ``stopwatch`` (the same shares
        timed by the stopwatch over the same steps), ``batches`` (how many the loop fetched) and
        ``params`` (the model's parameters afterwards).
    """
    if os.path.exists(trace_path):
        os.remove(trace_path)
    loader, train_step, model = _loop_parts(seed, case)
    watch = Stopwatch()
    profile_fn(watch.loader(loader), watch.step(train_step), trace_path, active=case["active"])
    out: dict[str, Any] = {"batches": len(watch.data_s), "ranges": annotations(trace_path)}
    out["profiler"] = trace_shares(trace_path, [DATA, STEP], of_labels=True)  # as the stopwatch counts
    out["stopwatch"] = watch.shares(skip=2)
    out["params"] = [p.detach().clone() for p in model.parameters()]
    return out


def plain_loop(seed: int, case: dict[str, Any]) -> list[torch.Tensor]:
    """The parameters after the same loop run without a profiler."""
    loader, train_step, model = _loop_parts(seed, case)
    for batch in loader:
        train_step(batch)
    return [p.detach().clone() for p in model.parameters()]
