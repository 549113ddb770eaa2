"""Packing small trials onto one device with fractional resources (lab 10's reference).

Ray schedules a trial where its *resource request* fits: by default one CPU and no GPU. A trial
that asks for ``{"gpu": 1}`` holds a whole GPU even if its small model keeps that GPU busy 20 %
of the time; asking for ``{"gpu": 0.25}`` lets four such trials share it, and the idle time of
one is the busy time of another. Ray does not split the device (no memory limit, no time
slicing): the fraction is only bookkeeping, so the trials must fit in its memory together.

    from ray import tune
    resources = packed_resources(trials_per_device=4, num_cpus=16, num_gpus=1)  # {"gpu": 0.25, "cpu": 1.0}
    tuner = tune.Tuner(tune.with_resources(train_classifier, resources), ...)

    .venv/bin/python -m pytest tests/hpo/test_hpo.py -k packed_resources
"""

from __future__ import annotations

import math

# On a CPU-only machine the "device" is a core: ``{"cpu": 0.5}`` runs two trials per core, which
# pays when trials wait (for data, for I/O) instead of computing.
#
# Source: Ray Tune's user guide, "A Guide To Parallelism and Resources for Ray Tune"
# (fractional GPUs, ``tune.with_resources``).

__all__ = ["packed_resources"]

# Ray accounts fractional resources in units of 1/10,000
_GRANULARITY = 1e-4


def _down(x: float) -> float:
    """``x`` rounded down to Ray's granularity, so that k shares of 1/k still fit in one device."""
    return math.floor(x / _GRANULARITY + 1e-9) * _GRANULARITY


def packed_resources(trials_per_device: int, num_cpus: int, num_gpus: int = 0) -> dict[str, float]:
    """The resource request that runs ``trials_per_device`` trials on each device at once.

    Args:
        trials_per_device: trials sharing one GPU (or, without GPUs, one CPU core).
        num_cpus: CPUs Ray may use on the machine.
        num_gpus: GPUs Ray may use (0: pack onto CPU cores).

    Returns:
        ``{"cpu": 1 / k}`` without GPUs; with GPUs ``{"gpu": 1 / k, "cpu": c}``, where ``c`` is
        one CPU per trial, or less when ``k * num_gpus`` trials would need more CPUs than there
        are (then each gets ``num_cpus / (k * num_gpus)``), so the GPUs, not the CPUs, limit how
        many trials run. Shares are rounded down to Ray's 1/10,000.

    Raises:
        ValueError: for ``trials_per_device`` < 1, ``num_cpus`` < 1 or ``num_gpus`` < 0.
    """
    if not isinstance(trials_per_device, int) or trials_per_device < 1:
        raise ValueError(f"trials_per_device must be an int >= 1, got {trials_per_device!r}")
    if num_cpus < 1 or num_gpus < 0:
        raise ValueError(f"need num_cpus >= 1 and num_gpus >= 0, got num_cpus={num_cpus}, num_gpus={num_gpus}")
    if num_gpus == 0:
        return {"cpu": _down(1 / trials_per_device)}
    concurrent = trials_per_device * num_gpus
    return {"gpu": _down(1 / trials_per_device), "cpu": _down(min(1.0, num_cpus / concurrent))}
