"""Lab 12's graders: the references masked while the launch-bound lab is graded, and the seeded
cases its hidden tests run the student's functions on.

- exercise 1 (``block_flops``): transformer-block shapes drawn from the seed; the expected counts
  are what ``FlopCounterMode`` counts on a real block of each shape (:func:`counted_flops`);
- exercise 2 (``classify_step``): steps and machines drawn from the seed, near every boundary
  between two bounds and on it (:func:`step_cases`);
- exercise 3 (the block without its graph break): its outputs and what ``explain`` finds on
  seeded inputs of three shapes (:func:`block_outputs`, :func:`block_graphs`). Its speed-up over
  eager is shown, not graded: it is CPU time, which a busy grading machine stretches.

Everything here returns plain values for the test cells to send; nothing decides a verdict.
"""

from __future__ import annotations

import random
from typing import Any, Callable

import torch

from gpulab.launchbound.bound import BOUNDS, Machine, StepCounts, classify_step
from gpulab.launchbound.flops import TransformerBlock, count_flops, transformer_block_flops
from gpulab.launchbound.fusion import clipped_block_fused, explain_block

__all__ = [
    "REFERENCES",
    "flops_cases",
    "counted_flops",
    "analytic_flops",
    "step_cases",
    "classify_cases",
    "block_input",
    "block_outputs",
    "block_graphs",
    "SHAPES",
    "SMALL",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask). count_flops and TransformerBlock stay: FlopCounterMode is the instrument the
# exercise is checked against, not its answer.
REFERENCES: tuple = (transformer_block_flops, classify_step, clipped_block_fused)

SMALL = (16, 64)  # the overhead-bound size of exercise 3: about 40 ops of 1024 elements
SHAPES = (SMALL, (1, 33), (5, 300))  # the held-out inputs' shapes: the small size, one row, a wide one


def flops_cases(rng: random.Random, n: int = 6) -> dict[str, tuple[int, int, int, int, int]]:
    """``n`` shapes ``(batch_size, seq_len, d_model, n_heads, d_ff)``: one head and many, sequences
    long enough for attention's T² products to matter (and a sequence of 1), an MLP narrower than
    the stream, widths that are not powers of two."""
    cases = {}
    for i in range(n):
        n_heads = rng.choice([1, 2, 3, 4, 8])
        d_model = n_heads * rng.randint(2, 24)
        shape = (
            rng.randint(1, 4),
            rng.choice([1, rng.randint(8, 64), rng.randint(32, 96)]),
            d_model,
            n_heads,
            rng.choice([d_model // 2 or 1, 4 * d_model, rng.randint(8, 200)]),
        )
        cases[f"block_flops{shape}"] = shape
    return cases


def counted_flops(cases: dict[str, tuple[int, int, int, int, int]]) -> dict[str, int]:
    """What ``FlopCounterMode`` counts for the forward pass of a real :class:`TransformerBlock` of each shape."""
    out = {}
    for name, (B, T, d, h, d_ff) in cases.items():
        torch.manual_seed(0)
        out[name] = count_flops(TransformerBlock(d, h, d_ff), torch.randn(B, T, d)).total
    return out


def analytic_flops(fn: Callable[..., Any], cases: dict[str, tuple[int, int, int, int, int]]) -> dict[str, float]:
    """``fn(*shape)`` for every case, as a float (an exception's name where it raised)."""
    out: dict[str, Any] = {}
    for name, shape in cases.items():
        try:
            out[name] = float(fn(*shape))
        except Exception as err:  # the student's code raised: that is the answer sent
            out[name] = f"raises {type(err).__name__}"
    return out


def step_cases(rng: random.Random, n: int = 36) -> dict[str, tuple[StepCounts, Machine]]:
    """``n`` held-out steps on random machines, CPU-like or GPU-like, whose three floors are drawn
    around each other (within a factor of 3, never closer than 2 %, so rounding decides nothing),
    and exact ties on machines of powers of two (every way of computing the floors gives the same
    float); plus an empty step."""
    cases = {}
    for i in range(n):
        gpu = rng.random() < 0.5
        ops = rng.randint(1, 400)
        if rng.random() < 0.15:  # a tie, exact in floating point: the order of BOUNDS decides
            m = Machine(
                overhead_s=2.0**-18, flops_per_s=2.0 ** (47 if gpu else 37), bytes_per_s=2.0 ** (41 if gpu else 34)
            )
            tied = rng.choice([("memory", "compute"), ("overhead", "memory"), ("overhead", "compute"), BOUNDS])
            t = {b: ops * m.overhead_s * (1.0 if b in tied else 0.5) for b in BOUNDS}
        else:
            m = Machine(
                overhead_s=rng.uniform(2e-6, 1e-5),
                flops_per_s=rng.uniform(5e13, 5e14) if gpu else rng.uniform(5e10, 4e11),
                bytes_per_s=rng.uniform(1e12, 3e12) if gpu else rng.uniform(1e10, 6e10),
            )
            while True:
                t = {
                    "overhead": ops * m.overhead_s,
                    **{b: ops * m.overhead_s * 3 ** rng.uniform(-1, 1) for b in BOUNDS[1:]},
                }
                if all(abs(t[a] / t[b] - 1) > 0.02 for a in BOUNDS for b in BOUNDS if a < b):
                    break
        step = StepCounts(ops=ops, flops=t["compute"] * m.flops_per_s, bytes=t["memory"] * m.bytes_per_s)
        cases[
            f"case {i}: ops={ops}, flops={step.flops:.4g}, bytes={step.bytes:.4g} on "
            f"({m.overhead_s:.3g} s/op, {m.flops_per_s:.3g} FLOP/s, {m.bytes_per_s:.3g} B/s)"
        ] = (step, m)
    cases["an empty step"] = (StepCounts(0, 0.0, 0.0), Machine(1e-6, 1e9, 1e9))
    return cases


def classify_cases(fn: Callable[..., Any], cases: dict[str, tuple[StepCounts, Machine]]) -> dict[str, str]:
    """``fn(step, machine)`` for every case (an exception's name where it raised)."""
    out = {}
    for name, (step, machine) in cases.items():
        try:
            out[name] = str(fn(step, machine))
        except Exception as err:  # the student's code raised: that is the answer sent
            out[name] = f"raises {type(err).__name__}"
    return out


def block_input(seed: int, shape: tuple[int, int] = SMALL) -> torch.Tensor:
    """A float32 input of ``shape`` drawn from ``seed``."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(int(seed)))


def block_outputs(fn: Callable[[torch.Tensor], torch.Tensor], seed: int) -> list[torch.Tensor]:
    """``fn`` on three inputs drawn from ``seed``, one of each of :data:`SHAPES`."""
    return [fn(block_input(seed + i, shape)).detach() for i, shape in enumerate(SHAPES)]


def block_graphs(fn: Callable[[torch.Tensor], torch.Tensor], seed: int) -> dict[str, list[int]]:
    """``{"R x C": [graphs, graph breaks]}``: what ``torch._dynamo.explain`` finds in ``fn`` on the
    inputs of :func:`block_outputs` (the same counts for every right answer: one graph, no break)."""
    out = {}
    for i, shape in enumerate(SHAPES):
        seen = explain_block(fn, block_input(seed + i, shape))
        out[f"{shape[0]} x {shape[1]}"] = [seen.graphs, seen.breaks]
    return out
