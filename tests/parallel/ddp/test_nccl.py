"""The hand-written DDPs on 2 GPUs under NCCL train like one process on the whole
batch (the CPU tests prove the same under gloo; these need 2+ GPUs and are skipped elsewhere).

Tolerance: the reference is a single CPU process; GPU kernels sum in another order, so every
parameter is compared at rtol 1e-4 / atol 1e-5 after 3 SGD or AdamW steps. TF32 is switched off in
the ranks (cuDNN enables it by default on Ampere and later; its 10-bit mantissa would need ~1e-3)."""

from __future__ import annotations

import pytest
import torch

from gpulab.parallel import launch, rank_device

from .nets import Net, _data
from .test_allreduce import WRAPPERS, _single_process, _train


def _no_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _wrappers_on_gpus(rank, world_size):
    _no_tf32()
    device = rank_device(rank)
    assert device.type == "cuda" and torch.distributed.get_backend() == "nccl"
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data())
    out = {}
    for name in WRAPPERS:
        model = Net().to(device)
        ddp = WRAPPERS[name](model, False)
        _train(ddp, inputs, targets, ddp.finish)
        out[name] = {n: p.detach().cpu() for n, p in model.named_parameters()}
    return out


@pytest.mark.multigpu
def test_the_hand_written_ddps_under_nccl_train_like_one_process():
    ref = _single_process(Net, _data())
    for rank, variants in enumerate(launch(_wrappers_on_gpus, 2, backend="nccl", timeout=300, echo=False)):
        for name, params in variants.items():
            for n, p in ref.named_parameters():
                torch.testing.assert_close(params[n], p.detach(), rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"rank {rank} {name} {n}: {m}")
