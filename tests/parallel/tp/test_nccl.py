"""The tensor-parallel blocks and DTensor's on 2 GPUs under NCCL (the CPU tests prove the same under
gloo; these need 2+ GPUs and are skipped elsewhere). The reference is one CPU process, and GPU
kernels sum in another order: outputs and gradients are compared at 1e-4."""

from __future__ import annotations

import pytest

from gpulab.parallel import launch
from gpulab.parallel.tp import TensorParallelAttention, TensorParallelMLP, runs
from gpulab.parallel.tp.mesh2d import run_2d

from .blocks import CASES


@pytest.mark.multigpu
@pytest.mark.parametrize("block, make", [("mlp", TensorParallelMLP), ("attention", TensorParallelAttention)])
def test_blocks_on_gpus_match_one_process(block, make):
    expected = runs.expected_shards(block, CASES, 0, 2)
    ours = launch(runs.run_block, 2, args=(make, block, CASES, 0), backend="nccl", timeout=240, echo=False)
    theirs = launch(runs.run_dtensor, 2, args=(block, CASES, 0), backend="nccl", timeout=240, echo=False)
    assert runs.max_abs_diff(ours, expected) < 1e-4
    assert runs.max_abs_diff(theirs, expected) < 1e-4
    assert ours[0][0]["comm"]["all_reduce"]["calls"] == 2


@pytest.mark.multigpu
def test_2d_mesh_on_gpus():
    import torch

    if torch.cuda.device_count() < 4:
        pytest.skip("a 2 x 2 mesh under NCCL needs 4 GPUs")
    assert max(r["max_abs_diff"] for r in launch(run_2d, 4, args=(2,), backend="nccl", timeout=240, echo=False)) < 1e-4
