"""ZeRO-1 (gpulab's and torch's) and FSDP2 on 2 GPUs under NCCL train like one process on the whole
batch (tests/parallel/sharding/test_state_bytes.py proves the same under gloo; these need 2+ GPUs and
are skipped elsewhere).

Tolerance: the reference is a single CPU process; GPU kernels sum in another order, so every
parameter is compared at rtol 1e-4 / atol 1e-5 after the AdamW steps. TF32 is switched off in the
ranks (cuDNN enables it by default on Ampere and later; its 10-bit mantissa would need ~1e-3)."""

from __future__ import annotations

import pytest
import torch

from gpulab.parallel import launch
from gpulab.parallel.sharding.runs import measure_sharding, preload_sharding

from ..ddp.test_nccl import _no_tf32
from .test_state_bytes import CFG, _single_process_params


def _sharding_on_gpus(rank, world_size, strategies, cfg):
    _no_tf32()
    return measure_sharding(rank, world_size, strategies, cfg)


@pytest.mark.multigpu
def test_zero1_and_fsdp2_under_nccl_train_like_one_process():
    preload_sharding()
    ref = _single_process_params()
    per_rank = launch(_sharding_on_gpus, 2, args=(["ddp", "zero1", "torch_zero", "fsdp2"], CFG), backend="nccl",
                      timeout=300, echo=False)
    for rank, out in enumerate(per_rank):
        for name, run in out.items():
            assert run["bytes"]["cuda_peak"] is not None, f"{name}: a GPU run reports the allocator's peak"
            for n, p in ref.items():
                torch.testing.assert_close(run["params"][n], p.detach(), rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"rank {rank} {name} {n}: {m}")
