"""What a bigger batch buys: time to a target loss, with the learning rate scaled (lab 05).

Lab 05 finds that the balanced criterion fits a batch several times larger in the same memory.
Fewer steps per epoch is not the same as less training time: a bigger batch changes the learning
rate the optimiser needs, and the number of steps (and samples) it takes to reach a given loss.
:func:`scaled_lr` is the linear scaling rule with warmup; :func:`time_to_target` measures the time
to a target loss on a small CPU task (:class:`ScalingTask`). Sources, and what is measured: the
comment below the imports.

    task = ScalingTask()
    run = time_to_target(task, 256, lambda step: scaled_lr(step, 0.04, 64, 256, warmup_steps=10), 0.5)
    print(run.steps, run.samples, run.seconds, run.reached)

    .venv/bin/python -m pytest tests/parallel/dp/test_batch_scaling.py
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from gpulab.models import MLP

# - Linear scaling rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training ImageNet in
#   1 Hour", arXiv 1706.02677): when the batch grows ``k`` times, multiply the learning rate by ``k``,
#   and ramp it up from the base rate over the first steps ("gradual warmup"), because the first
#   steps of a large rate can diverge. ``scaled_lr`` is that schedule.
# - Steps to a result stop falling past a workload-dependent batch size: perfect scaling
#   (``k`` times the batch, ``k`` times fewer steps) up to it, diminishing returns after it
#   (Shallue et al. 2018, "Measuring the Effects of Data Parallelism on Neural Network Training",
#   arXiv 1811.03600; McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", arXiv
#   1812.06162, call it the critical batch size).
#
# ``time_to_target`` measures it on a small CPU task (``ScalingTask``: an MLP learning a fixed
# random teacher network's labels): SGD with momentum at one batch size and learning-rate
# schedule, the loss on a held-out set every ``eval_every`` samples, until it crosses ``target``.
# Every training sample is new (one pass over a large pool), so the held-out loss is the loss on the
# task itself, not a measure of overfitting a small set. The clock counts training steps only (the
# evaluations are paused out of it), one intra-op thread, so runs of different batch sizes compete
# for the same core the same way.

__all__ = ["ScalingTask", "TargetRun", "scaled_lr", "time_to_target"]


@dataclass(frozen=True)
class ScalingTask:
    """A classification task small enough to train to a target loss in about a second on a CPU.

    Inputs are Gaussian; the label is the arg-max of a fixed random two-layer "teacher" network, so
    the task is learnable, not noise. The student model is an MLP (``dim -> hidden -> classes``).
    The training pool is large enough for one pass to reach the targets used in lab 05 (34 MiB).

    Attributes:
        dim: input width.
        classes: number of labels.
        hidden: the student MLP's hidden width.
        train_size: training samples, each seen at most once.
        eval_size: held-out samples on which the loss is measured.
        seed: for the teacher, the data and the student's initial weights.
    """

    dim: int = 32
    classes: int = 10
    hidden: int = 128
    train_size: int = 262_144
    eval_size: int = 4_096
    seed: int = 0

    def data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x_train, y_train, x_eval, y_eval)``: float32 (N, dim) inputs, int64 (N,) labels.
        Made once per task (cached): every run trains on the same samples in the same order."""
        return _task_data(self)

    def _make_data(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed)
        w1 = torch.randn(self.dim, 64, generator=g) / self.dim ** 0.5
        w2 = torch.randn(64, self.classes, generator=g) / 8
        x = torch.randn(self.train_size + self.eval_size, self.dim, generator=g)
        y = (torch.relu(x @ w1) @ w2).argmax(dim=1)  # (N,) the teacher's labels
        n = self.train_size
        return x[:n], y[:n], x[n:], y[n:]

    def model(self) -> MLP:
        """The student network, the same initial weights for every run."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 1)
            return MLP([self.dim, self.hidden, self.classes])


@functools.lru_cache(maxsize=2)
def _task_data(task: ScalingTask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return task._make_data()


def scaled_lr(step: int, base_lr: float, base_batch: int, batch_size: int, warmup_steps: int = 0) -> float:
    """The learning rate of ``step`` under the linear scaling rule with gradual warmup (Goyal et al.).

    ``k = batch_size / base_batch``; the rate is ``k * base_lr`` after warmup, and during the first
    ``warmup_steps`` steps it rises in a straight line from ``base_lr`` (step 0) towards it. A batch
    no larger than ``base_batch`` has nothing to warm up: ``k * base_lr`` from step 0.

    Args:
        step: the optimiser step, counted from 0.
        base_lr: the rate tuned for ``base_batch``.
        base_batch: the batch size ``base_lr`` was tuned for.
        batch_size: the batch size being trained.
        warmup_steps: length of the ramp; 0 for none.

    Returns:
        The learning rate for that step.

    Raises:
        ValueError: for a negative step or warmup, or a non-positive rate or batch size.
    """
    if step < 0 or warmup_steps < 0:
        raise ValueError(f"step and warmup_steps count from 0, got step={step}, warmup_steps={warmup_steps}")
    if base_lr <= 0 or base_batch <= 0 or batch_size <= 0:
        raise ValueError(f"base_lr, base_batch and batch_size must be positive, got {base_lr}, {base_batch}, {batch_size}")
    peak = base_lr * batch_size / base_batch
    if step >= warmup_steps or peak <= base_lr:
        return peak
    return base_lr + (peak - base_lr) * step / warmup_steps


@dataclass
class TargetRun:
    """One training run until the loss crossed a target.

    Attributes:
        batch_size: the batch size trained.
        target: the loss to reach.
        trace: ``(step, samples, seconds, loss)`` at every evaluation, in order; ``seconds`` counts
            training steps only.
    """

    batch_size: int
    target: float
    trace: list[tuple[int, int, float, float]] = field(default_factory=list)

    @property
    def reached(self) -> bool:
        """Whether the last evaluation is at or below the target."""
        return bool(self.trace) and self.trace[-1][3] <= self.target

    @property
    def steps(self) -> int:
        """Optimiser steps taken (to the target, if it was reached)."""
        return self.trace[-1][0] if self.trace else 0

    @property
    def samples(self) -> int:
        """Training samples seen."""
        return self.trace[-1][1] if self.trace else 0

    @property
    def seconds(self) -> float:
        """Training time (evaluations excluded)."""
        return self.trace[-1][2] if self.trace else 0.0


def time_to_target(task: ScalingTask, batch_size: int, lr_at: Callable[[int], float], target: float, *,
                   max_samples: int | None = None, eval_every: int = 4096, momentum: float = 0.9) -> TargetRun:
    """Train ``task.model()`` with SGD until the held-out loss is at most ``target``.

    Args:
        task: the data and model.
        batch_size: samples per step.
        lr_at: the learning rate of each step, ``lr_at(step)`` (e.g. :func:`scaled_lr`).
        target: the held-out cross-entropy to reach.
        max_samples: give up after this many training samples (the run is then not ``reached``);
            at most, and by default, ``task.train_size`` (one pass: no sample is seen twice).
        eval_every: evaluate the loss every this many samples (every step when the batch is larger).
        momentum: SGD's momentum.

    Returns:
        The :class:`TargetRun`, its trace starting at step 0 and ending at the first evaluation at
        or below ``target`` (or at ``max_samples``).

    Raises:
        ValueError: if ``batch_size`` or ``max_samples`` is not between 1 and ``task.train_size``.
    """
    if not 1 <= batch_size <= task.train_size:
        raise ValueError(f"batch_size={batch_size}: use 1 to {task.train_size} (the task's training samples)")
    max_samples = task.train_size if max_samples is None else max_samples
    if not 1 <= max_samples <= task.train_size:
        raise ValueError(f"max_samples={max_samples}: use 1 to {task.train_size} (one pass over the training "
                         "samples), or a ScalingTask with a larger train_size")
    x, y, x_eval, y_eval = task.data()
    model = task.model()
    opt = torch.optim.SGD(model.parameters(), lr=lr_at(0), momentum=momentum)
    run = TargetRun(batch_size, target)
    step = samples = next_eval = 0
    seconds = 0.0
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same single core for every batch size (restored below)
    try:
        while True:
            if samples >= next_eval or samples + batch_size > max_samples:
                with torch.no_grad():  # off the clock
                    loss = F.cross_entropy(model(x_eval), y_eval).item()
                run.trace.append((step, samples, seconds, loss))
                next_eval += eval_every
                if loss <= target or samples + batch_size > max_samples:
                    return run
            t0 = time.perf_counter()
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss_t = F.cross_entropy(model(x[samples:samples + batch_size]), y[samples:samples + batch_size])
            opt.zero_grad(set_to_none=True)
            loss_t.backward()
            opt.step()
            seconds += time.perf_counter() - t0
            step += 1
            samples += batch_size
    finally:
        torch.set_num_threads(threads)
