"""Lab 03's graders: the references the HDF5 exercises must not call."""

from __future__ import annotations

from gpulab.data.chunk_cache import next_prime, suggest_cache
from gpulab.data.chunk_sampler import ChunkShuffleSampler
from gpulab.data.h5dataset import EagerH5Dataset, H5Dataset, inspect_h5
from gpulab.data.hdf5 import suggest_chunks

__all__ = ["REFERENCES"]

# gpulab's reference implementations of this lab's exercises: a test cell passes them to
# grading.check_not_calling(..., forbidden=REFERENCES) so that a submission cannot call them.
REFERENCES: tuple = (suggest_chunks, suggest_cache, next_prime, H5Dataset, EagerH5Dataset, inspect_h5, ChunkShuffleSampler)
