"""Lab 00's graders: the references the setup exercises must not call."""

from __future__ import annotations

from gpulab.devices.doctor import compatibility_notes, diagnose, probe, report
from gpulab.devices.machine import choose_backend, place_ranks

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
# The doctor's diagnosis (diagnose, compatibility_notes, and report/probe, which run it) is the
# reference of exercise 4 (triage).
REFERENCES: tuple = (choose_backend, place_ranks, diagnose, compatibility_notes, report, probe)
