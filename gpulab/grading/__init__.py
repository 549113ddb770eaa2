"""Grading: the checks the notebooks' test cells call, and each lab's graders.

- :mod:`~gpulab.grading.checks`: :class:`GradingError` and the generic ``check_*`` helpers
  (re-exported here, so test cells write ``grading.check_close(...)``).
- ``gpulab.grading.labNN``: one module per lab with the graders its hidden tests call, and a
  public ``REFERENCES`` tuple: gpulab's reference implementations of that lab's exercises, the
  ``forbidden`` argument of :func:`check_not_calling`.

The library (instruments and references) never imports this package; it imports the library.
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
