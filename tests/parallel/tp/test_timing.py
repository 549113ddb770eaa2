"""The timing rank bodies return what they promise (never a speed: benchmarks/tensor_parallel.py
reports those)."""

from __future__ import annotations

from gpulab.parallel import launch
from gpulab.parallel.tp import TensorParallelMLP
from gpulab.parallel.tp.timing import comm_compute_sweep, time_block, time_single


def _body(rank, world_size):
    return comm_compute_sweep(rank, world_size, [16, 32], 8, repeats=2), time_block(rank, world_size, TensorParallelMLP,
                                                                                  16, 8, num_steps=2, warmup=1)


def test_sweep_and_step_times():
    for sweep, step in launch(_body, 2, timeout=120, echo=False):
        assert list(sweep) == [16, 32]
        assert sweep[32]["bytes"] == 8 * 32 * 4
        assert all(v["compute_s"] > 0 and v["comm_s"] > 0 for v in sweep.values())
        assert step > 0
    assert time_single(16, 8, num_steps=2, warmup=1) > 0
