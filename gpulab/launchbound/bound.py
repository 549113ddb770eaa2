"""Overhead-, memory- or compute-bound: which floor sets a step's time (lab 12).

    python -c "from gpulab.launchbound.bound import *; print(classify_step(StepCounts(40, 1e6, 4e5), Machine(3e-6, 2e11, 1e10)))"

A step cannot be faster than any of three floors, each measured on this machine in the lab:

- **overhead**: ``ops x overhead_s``, the fixed cost of every op (gpulab.launchbound.overhead);
- **memory**: ``bytes / bytes_per_s``, every byte read and written once at the measured bandwidth;
- **compute**: ``flops / flops_per_s``, the arithmetic at the measured matmul peak.

The largest floor names what bounds the step, and what would make it faster: fewer ops (fusion,
CUDA graphs, a bigger batch per op), fewer bytes (fusion, lower precision), or a faster device.
It is the roofline model (Williams, Waterman and Patterson, "Roofline", CACM 2009) with the
overhead floor added in front.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["StepCounts", "Machine", "BOUNDS", "floors", "classify_step"]

BOUNDS = ("overhead", "memory", "compute")  # also the order that breaks a tie


@dataclass(frozen=True)
class StepCounts:
    """What one step does: ops dispatched, FLOPs, and bytes read plus written."""

    ops: int
    flops: float
    bytes: float


@dataclass(frozen=True)
class Machine:
    """This machine's measured costs: seconds per op, FLOP/s and bytes/s."""

    overhead_s: float
    flops_per_s: float
    bytes_per_s: float


def floors(step: StepCounts, machine: Machine) -> dict[str, float]:
    """The three floors of the step's time, in seconds, keyed by :data:`BOUNDS`."""
    return {"overhead": step.ops * machine.overhead_s, "memory": step.bytes / machine.bytes_per_s,
            "compute": step.flops / machine.flops_per_s}


def classify_step(step: StepCounts, machine: Machine) -> str:
    """``"overhead"``, ``"memory"`` or ``"compute"``: the largest of the step's three floors
    (a tie goes to the first in :data:`BOUNDS`).

    Raises:
        ValueError: for a negative count, or a machine rate or overhead that is not positive.
    """
    if min(step.ops, step.flops, step.bytes) < 0:
        raise ValueError(f"a step's ops, flops and bytes must be >= 0, got {step}")
    if min(machine.overhead_s, machine.flops_per_s, machine.bytes_per_s) <= 0:
        raise ValueError(f"the machine's overhead and rates must be positive, got {machine}")
    f = floors(step, machine)
    return max(BOUNDS, key=lambda b: (f[b], -BOUNDS.index(b)))
