"""Lab 00's graders: the references the setup exercises must not call."""

from __future__ import annotations

from gpulab.devices.doctor import diagnose, probe, report
from gpulab.devices.machine import choose_backend, place_ranks

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (choose_backend, place_ranks, diagnose, report, probe)
