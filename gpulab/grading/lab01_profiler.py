"""Lab 01's graders for the torch.profiler exercises (5-7): made-up ``key_averages()`` tables for
``top_ops`` and ``label_shares``, a seeded model for ``profile_training``, and the student's own loop
profiled under gpulab's stopwatch for ``profile_phases``. Re-exported by :mod:`gpulab.grading.lab01`,
which masks their references.

Everything here returns plain values for the test cells to send; nothing decides a verdict.
"""

from __future__ import annotations

import json
import os
import random
from types import SimpleNamespace
from typing import Any, Callable

import torch

from gpulab.profiling.phases import DATA, STEP, Stopwatch, trace_shares

__all__ = [
    "LABELS",
    "key_averages_table",
    "key_averages_cases",
    "annotations",
    "seeded_training",
    "train_plain",
    "phases_case",
    "phases_run",
    "placement",
    "plain_loop",
]

_OPS = (
    "aten::convolution",
    "aten::mkldnn_convolution",
    "aten::convolution_backward",
    "aten::addmm",
    "aten::mm",
    "aten::relu",
    "aten::threshold_backward",
    "aten::native_batch_norm",
    "aten::max_pool2d_with_indices",
    "aten::add_",
    "aten::zero_",
    "aten::copy_",
    "aten::empty",
    "aten::_log_softmax",
    "aten::nll_loss_forward",
)
_OTHERS = (
    "autograd::engine::evaluate_function: ConvolutionBackward0",
    "ConvolutionBackward0",
    "MmBackward0",
    "Optimizer.step#SGD.step",
    "cudaLaunchKernel",
    "[memory]",
)
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
        table.append(
            SimpleNamespace(
                key=name, count=rng.randint(1, 9), self_cpu_time_total=float(self_us), cpu_time_total=float(total)
            )
        )
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


def train_plain(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor, steps: int
) -> list[torch.Tensor]:
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
    return {
        "active": rng.randint(3, 5),
        "batch_size": rng.choice([8, 12, 16]),
        "sample_cost_s": rng.choice([0.0005, 0.001, 0.002, 0.003]),
        "lr": rng.choice([0.01, 0.05, 0.1]),
    }


def _loop_parts(seed: int, case: dict[str, Any]) -> tuple[Any, Callable[[Any], Any], torch.nn.Module]:
    """A seeded loader of ``2 + active`` batches and a SmallCNN training step on the host."""
    from gpulab.models import SmallCNN
    from gpulab.profiling.workloads import BusyDataset

    n = (2 + case["active"]) * case["batch_size"]
    loader = torch.utils.data.DataLoader(
        BusyDataset(n, case["sample_cost_s"], seed=int(seed) % 2**31), batch_size=case["batch_size"]
    )
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


FETCH_MARK, STEP_MARK = "gpulab-watch:fetch", "gpulab-watch:step"  # the kit's markers, not the student's ranges


def _marked(watch: Stopwatch, loader: Any, train_step: Callable[[Any], Any]) -> tuple[Any, Callable[[Any], Any]]:
    """The stopwatch's loader and step, each call also marked in the trace by a kit range (inside the
    stopwatch's timing): every ``next()`` that yields one of the ``len(loader)`` batches and every step."""
    from torch.profiler import record_function

    class _Marked:
        def __len__(self) -> int:
            return len(loader)

        def __iter__(self):
            it = iter(loader)
            for _ in range(len(loader)):  # no fetch past the last batch: each mark holds a batch
                with record_function(FETCH_MARK):
                    batch = next(it)
                yield batch

    def step(batch: Any) -> Any:
        with record_function(STEP_MARK):
            return train_step(batch)

    return watch.loader(_Marked()), watch.step(step)


def _spans(trace: dict[str, Any]) -> dict[str, list[tuple[Any, float, float]]]:
    """The CPU timeline's ranges by name: ``[(thread, start, end)]`` in the trace's microseconds."""
    spans: dict[str, list[tuple[Any, float, float]]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("cat") == "user_annotation" and e.get("ph") == "X":
            t0 = float(e["ts"])
            spans.setdefault(e.get("name"), []).append(((e.get("pid"), e.get("tid")), t0, t0 + float(e.get("dur", 0))))
    return spans


def placement(trace_path: str) -> dict[str, int]:
    """Where the recorded fetches and steps sit among the student's ``data`` and ``step`` ranges, read
    from the nesting of the kit's marks in the trace (no clock compared): a right loop has every
    fetch inside a data range and every step inside a step range, and neither inside the other."""
    with open(trace_path) as fh:
        spans = _spans(json.load(fh))

    def inside(mark: tuple[Any, float, float], name: str) -> bool:
        thread, t0, t1 = mark
        return any(th == thread and r0 <= t0 and t1 <= r1 for th, r0, r1 in spans.get(name, []))

    fetches, steps = spans.get(FETCH_MARK, []), spans.get(STEP_MARK, [])
    return {
        "recorded fetches": len(fetches),
        "fetches outside your data ranges": sum(not inside(m, DATA) for m in fetches),
        "fetches inside your step ranges": sum(inside(m, STEP) for m in fetches),
        "recorded steps": len(steps),
        "steps outside your step ranges": sum(not inside(m, STEP) for m in steps),
        "steps inside your data ranges": sum(inside(m, DATA) for m in steps),
    }


def phases_run(profile_fn: Callable[..., Any], seed: int, case: dict[str, Any], trace_path: str) -> dict[str, Any]:
    """Run ``profile_fn(loader, train_step, trace_path, active=...)`` on :func:`phases_case`'s loop,
    with gpulab's :class:`~gpulab.profiling.phases.Stopwatch` around the loader and the step, and the
    kit's marks (:func:`placement`) inside it.

    Returns:
        ``ranges`` (:func:`annotations` of the trace, the kit's marks left out), ``placement`` (where
        the recorded fetches and steps sit among the ranges), ``profiler`` (the ``data`` and ``step``
        ranges' shares of their sum over the recorded steps, read from the trace), ``stopwatch`` (the
        same shares timed by the stopwatch over the same steps: shown, never graded, as two clocks on a
        busy machine disagree), ``batches`` (how many the loop fetched) and ``params`` (the model's
        parameters afterwards).
    """
    if os.path.exists(trace_path):
        os.remove(trace_path)
    loader, train_step, model = _loop_parts(seed, case)
    watch = Stopwatch()
    profile_fn(*_marked(watch, loader, train_step), trace_path, active=case["active"])
    ranges = {k: v for k, v in annotations(trace_path).items() if k not in (FETCH_MARK, STEP_MARK)}
    out: dict[str, Any] = {"batches": len(watch.data_s), "ranges": ranges, "placement": placement(trace_path)}
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
