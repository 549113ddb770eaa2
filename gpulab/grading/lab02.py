"""Lab 02's graders: the references the input-pipeline exercises must not call."""

from __future__ import annotations

from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import tuned_pipeline
from gpulab.data.transfer import normalize_on_host, to_device_normalize

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (to_device_normalize, normalize_on_host, BatchEcho, tuned_pipeline)
