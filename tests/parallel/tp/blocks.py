"""Shared launches of the block tests: one per (block, world size), kept for the session."""

from __future__ import annotations

import functools

from gpulab.parallel import launch
from gpulab.parallel.tp import TensorParallelAttention, TensorParallelMLP, runs

CASES = ((3, 4), (5, 8), (1, 2))  # (batch_size, seq_len): odd batch sizes, never split over ranks
MAKE = {"mlp": TensorParallelMLP, "attention": TensorParallelAttention}


@functools.lru_cache(maxsize=None)
def gpulab_run(block: str, world_size: int):
    return launch(runs.run_block, world_size, args=(MAKE[block], block, CASES, 0), timeout=120, echo=False)


@functools.lru_cache(maxsize=None)
def dtensor_run(block: str, world_size: int):
    return launch(runs.run_dtensor, world_size, args=(block, CASES, 0), timeout=120, echo=False)
