"""Verdicts decided outside any kernel: pure functions of what the kernels sent, no I/O.

- :mod:`~gpulab.verdict.rules`: the registry of *rules*, grader-side judgements of one check
  (``grading.check_rule`` and ``grading.check_measured`` name one): a rule gets the student's
  decoded value and the reference run's, and says why the student's fails, or None.
- ``gpulab.verdict.labNN``: each lab's rules, registered under ``"labNN.<name>"``; a rule's module
  is imported by the grader the first time a check names it.

Rules judge properties: several correct answers (a placement that keeps the rules, a schedule of
the right shape) pass, and a wrong one fails with a message that names the property it breaks.
"""
