"""Lab 05's graders: the references masked while the balanced-criterion lab is graded, and the
seeded cases its hidden tests run the student's functions on.

Each helper runs the function it is given (the student's, or gpulab's reference inside
``grading.by_reference``) on inputs drawn from a seed, and returns plain values for the test
cell's checks to send: nothing here decides pass or fail.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import LogicalDevices, logical_devices
from gpulab.memory.batch_size import bisect_largest
from gpulab.models import MLP
from gpulab.parallel.dp.balanced import DataParallelCriterion, DataParallelModel
from gpulab.parallel.dp.balanced import parallel_loss as gpulab_parallel_loss
from gpulab.parallel.dp.batch_scaling import scaled_lr
from gpulab.parallel.dp.step_memory import largest_batch

__all__ = ["REFERENCES", "lab_devices", "parallel_step", "single_step", "wide_outputs", "largest_batch_cases",
           "search", "reference_search", "lr_cases", "lr_table", "gpulab_parallel_loss", "largest_batch", "scaled_lr"]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the balanced criterion and its function form (exercise 1), the batch search
# and the bisection it shares with lab 08 (exercise 2), and the learning-rate rule (exercise 3).
# DataParallelModel and time_to_target stay: the demos and the tests run them, and neither is an answer.
REFERENCES: tuple = (DataParallelCriterion, gpulab_parallel_loss, largest_batch, bisect_largest, scaled_lr)


def lab_devices() -> LogicalDevices:
    """The lab's four logical devices (rebuilt by the tests: the notebook's ``devices`` is editable)."""
    return logical_devices(4)


def _mlp_case(rows: int, seed: int, device: torch.device) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small MLP (6 -> 32 -> 5) and a batch of ``rows`` samples, all drawn from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP([6, 32, 5])
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, 6, generator=g), torch.randint(0, 5, (rows,), generator=g)
    return model.to(device), x.to(device), y.to(device)


def parallel_step(parallel_loss: Callable[..., Any], rows: int, seed: int) -> dict[str, Any]:
    """Loss and gradients of one step through ``DataParallelModel`` and ``parallel_loss`` on the four
    logical devices: ``{"loss": ..., "gradients": [...]}`` (compare with :func:`single_step`)."""
    devices = lab_devices()
    model, x, y = _mlp_case(rows, seed, devices[0].physical)
    loss = parallel_loss(DataParallelModel(model, devices)(x), y, F.cross_entropy, devices)
    loss.backward()
    return {"loss": loss, "gradients": [p.grad for p in model.parameters()]}


def single_step(rows: int, seed: int) -> dict[str, Any]:
    """The same step as :func:`parallel_step` on one device: the expected loss and gradients."""
    model, x, y = _mlp_case(rows, seed, lab_devices()[0].physical)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return {"loss": loss, "gradients": [p.grad for p in model.parameters()]}


def wide_outputs(seed: int, rows: int, vocab: int) -> tuple[list[torch.Tensor], torch.Tensor, LogicalDevices]:
    """``(outputs, targets, devices)``: a seeded ``Linear(8, vocab)`` run by ``DataParallelModel`` on
    ``rows`` seeded samples, its per-device outputs, and the batch's targets on ``devices[0]``."""
    devices = lab_devices()
    home = devices[0].physical
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = nn.Linear(8, vocab)
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(rows, 8, generator=g), torch.randint(0, vocab, (rows,), generator=g)
    return DataParallelModel(head.to(home), devices)(x.to(home)), y.to(home), devices


# ---- exercise 2: the batch search ----------------------------------------------------------------

def largest_batch_cases(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """``n`` cases ``(threshold, multiple, limit)``: ``fits(b)`` is ``b <= threshold``, and the
    threshold is sometimes below ``multiple`` (answer 0) or above ``limit`` (answer the largest multiple)."""
    cases = []
    for _ in range(n):
        multiple = rng.choice([1, 2, 3, 4, 8])
        limit = rng.randint(multiple, 6000)
        threshold = rng.choice([rng.randint(0, multiple), rng.randint(0, limit + 50), rng.randint(limit, 10 * limit)])
        cases.append((threshold, multiple, limit))
    return cases


def search(largest_batch: Callable[..., Any], cases: list[tuple[int, int, int]], *, keywords: bool = False
           ) -> tuple[dict[str, Any], list[str], int]:
    """Run ``largest_batch(fits, multiple, limit)`` on every case.

    Returns:
        ``(answers, stray, excess)``: the answer per case; the probes that were not a multiple of
        ``multiple`` or were past ``limit``; and the most calls of ``fits`` past
        ``2 * bit_length(limit // multiple) + 3`` in any case (0 or less: logarithmic).
    """
    answers: dict[str, Any] = {}
    stray: list[str] = []
    excess = -(10**9)
    for threshold, multiple, limit in cases:
        calls: list[int] = []

        def fits(b: int, threshold: int = threshold, calls: list[int] = calls) -> bool:
            calls.append(b)
            return b <= threshold

        name = f"threshold={threshold}, multiple={multiple}, limit={limit}"
        answers[name] = (largest_batch(fits, multiple=multiple, limit=limit) if keywords
                         else largest_batch(fits, multiple, limit))
        stray += [f"{name}: probed {b}" for b in calls if not isinstance(b, int) or b % multiple or not 0 < b <= limit]
        excess = max(excess, len(calls) - (2 * (limit // multiple).bit_length() + 3))
    return answers, stray[:5], excess


def reference_search(cases: list[tuple[int, int, int]]) -> tuple[dict[str, Any], list[str]]:
    """gpulab's ``(answers, stray probes)`` for :func:`search`'s cases (call only inside ``grading.by_reference``)."""
    answers, stray, _ = search(largest_batch, cases, keywords=True)
    return answers, stray


# ---- exercise 3: the learning-rate rule ----------------------------------------------------------

def lr_cases(rng: random.Random, n: int) -> list[tuple[int, float, int, int, int]]:
    """``n`` argument tuples ``(step, base_lr, base_batch, batch_size, warmup_steps)``: batches larger
    and smaller than the base, steps before, at and after the end of the warmup."""
    cases = []
    for _ in range(n):
        warmup = rng.choice([0, 1, rng.randint(2, 50)])
        step = rng.choice([0, rng.randint(0, max(warmup, 1)), warmup, rng.randint(0, 400)])
        cases.append((step, round(rng.uniform(0.001, 0.5), 4), rng.choice([8, 16, 32, 64, 100, 256]),
                      rng.choice([1, 8, 24, 64, 96, 512, 4096, rng.randint(1, 10_000)]), warmup))
    return cases


def lr_table(scaled_lr: Callable[..., Any], cases: list[tuple[int, float, int, int, int]]) -> dict[str, float]:
    """``{"scaled_lr(args)": float(scaled_lr(*args))}`` for every case."""
    return {f"scaled_lr{args}": float(scaled_lr(*args)) for args in cases}
