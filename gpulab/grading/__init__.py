"""Grading: the checks the notebooks' test cells call, and each lab's graders.

- :mod:`~gpulab.grading.checks`: :class:`GradingError` and the ``check_*`` helpers (re-exported
  here, so test cells write ``grading.check_close(...)``). Interactively they decide at once;
  under ``make grade`` they only send evidence, and the grader decides outside the kernel
  (:mod:`~gpulab.grading.evidence`, :mod:`~gpulab.grading.judge`).
- :func:`by_reference`, :func:`seed`, :func:`rng`: expected values computed only in the reference
  kernel, and inputs drawn from the grading run's seed.
- :func:`check_speedup` (:mod:`~gpulab.grading.speedup`): a speed-up the grader times itself.
- ``gpulab.grading.labNN``: one module per lab with the graders its hidden tests call, and a
  public ``REFERENCES`` tuple: gpulab's reference implementations of that lab's exercises, which
  are masked in the student's kernel while it is graded (:mod:`gpulab.course.mask`).

The library (instruments and references) never imports this package; it imports the library.
Importing it does not import torch: the grader's own process uses :mod:`~gpulab.grading.judge`.
"""

from gpulab.grading.checks import (
    GradingError,
    by_reference,
    catch,
    check,
    check_between,
    check_close,
    check_equal,
    check_raises,
    check_ratio,
    check_shape,
)
from gpulab.grading.evidence import rng, seed
from gpulab.grading.speedup import check_speedup

__all__ = ["GradingError", "catch", "check", "check_equal", "check_close", "check_shape", "check_between", "check_ratio",
           "check_raises", "by_reference", "seed", "rng", "check_speedup"]
