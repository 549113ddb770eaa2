"""The wire between a graded kernel and the grader, in one typed place.

- :mod:`~gpulab.evidence.wire`: the three modes a kernel runs in and how a record leaves it (one
  ``display_data`` message of type :data:`~gpulab.evidence.wire.MIME`);
- :mod:`~gpulab.evidence.records`: the records themselves, typed and versioned: a check's value
  (:class:`~gpulab.evidence.records.Check`), a measured check's announcement
  (:class:`~gpulab.evidence.records.Measured`), a measured run's result
  (:class:`~gpulab.evidence.records.Result`), and :func:`~gpulab.evidence.records.parse`, the one
  place raw JSON from a kernel becomes one of them;
- :mod:`~gpulab.evidence.codec`: a value's encoding (in the kernel) and decoding (in the grader).

The kernel side (``gpulab.grading``) writes records; the grader (``gpulab.autograde``,
``gpulab.verdict``) reads them and never trusts them.
"""
