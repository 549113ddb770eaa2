"""A hidden test's inputs: drawn from the grading run's seed, the same in the reference kernel and in
every student's, fresh for every ``make grade``, never written in the notebook."""

from __future__ import annotations

import os
import random

DEFAULT_SEED = 20240601  # interactive runs: the same inputs every time


def seed() -> int:
    """This grading run's seed (``GPULAB_SEED``), or a fixed one outside the grader.

    Hidden tests build their inputs from it, so the inputs change with every ``make grade`` and
    cannot be answered from a list.
    """
    raw = os.environ.get("GPULAB_SEED", "")
    return int(raw) % 2**31 if raw.isdigit() else DEFAULT_SEED


def rng(salt: str = "") -> random.Random:
    """A ``random.Random`` drawn from :func:`seed` (``salt`` gives each test its own stream)."""
    return random.Random(f"{seed()}:{salt}")
