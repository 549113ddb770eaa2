"""Grading: the checks the notebooks' test cells call, and each lab's graders.

- :mod:`~gpulab.grading.checks`: :class:`GradingError` and the ``check_*`` helpers (re-exported
  here, so test cells write ``grading.check_close(...)``). Interactively they decide at once;
  under ``make grade`` they only send evidence, and the grader decides outside the kernel
  (:mod:`gpulab.evidence`, :mod:`gpulab.verdict`).
- :func:`seed`, :func:`rng`: inputs drawn from the grading run's seed. A hidden test sends only
  what the student's code made of them; the same test run against the solution in the reference
  kernel gives the expected side (:mod:`~gpulab.grading.checks`).
- :func:`interactive_expected`: a visible test's expected value, computed only when the student
  runs it (never under the grader).
- :func:`check_rule`: a property judged by a rule of :mod:`gpulab.verdict` (several right answers).
- :func:`check_measured` (:mod:`~gpulab.grading.measured`): the cost of a piece of work, measured
  by the grader from outside the kernel and judged by a rule.
- ``gpulab.grading.labNN``: one module per lab with the graders its hidden tests call, and a
  public ``REFERENCES`` tuple: gpulab's reference implementations of that lab's exercises, which
  are masked in the student's kernel while it is graded (:mod:`gpulab.autograde.box.mask`).

The library (instruments and references) never imports this package; it imports the library.
Importing it does not import torch: the grader's own process uses :mod:`gpulab.verdict`.
"""

from gpulab.grading.checks import (
    GradingError,
    catch,
    check,
    check_between,
    check_close,
    check_equal,
    check_raises,
    check_rule,
    check_shape,
    interactive_expected,
)
from gpulab.grading.inputs import rng, seed
from gpulab.grading.measured import check_measured

__all__ = ["GradingError", "catch", "check", "check_equal", "check_close", "check_shape", "check_between", "check_rule",
           "check_raises", "interactive_expected", "seed", "rng", "check_measured"]
