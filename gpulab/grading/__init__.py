"""Grading: the checks the notebooks' test cells call, and each lab's graders.

- :mod:`~gpulab.grading.checks`: :class:`GradingError` and the generic ``check_*`` helpers
  (re-exported here, so test cells write ``grading.check_close(...)``).
- ``gpulab.grading.labNN``: one module per lab with the graders its hidden tests call, and a
  public ``REFERENCES`` tuple: gpulab's reference implementations of that lab's exercises, the
  ``forbidden`` argument of :func:`check_not_calling`.

The library (instruments and references) never imports this package; it imports the library.

What these checks cannot see: gpulab's references are public (students import gpulab), so a
student can read a reference's source and retype it, with other names or in another order. The
result is the student's own code as far as any program can tell, and :func:`check_not_calling`
passes it: it catches calls to a reference and exact copies of one (the same bytecode, constants
and names), not paraphrases. That case is left to a human reading the submission (see
docs/instructor.md, "Threat model").
"""

from gpulab.grading.checks import (
    GradingError,
    SpeedComparison,
    catch,
    check,
    check_between,
    check_close,
    check_equal,
    check_not_calling,
    check_raises,
    check_ratio,
    check_shape,
    compare_speed,
)

__all__ = ["GradingError", "catch", "check", "check_equal", "check_close", "check_shape", "check_between", "check_ratio",
           "check_raises", "check_not_calling", "compare_speed", "SpeedComparison"]
