"""gpulab.parallel.workloads.spawn_job: every process builds the same job from a seed, and
single_process_training is what torch DDP on 2 gloo ranks ends with when each rank reads its shard
through torch's DistributedSampler (what a correct mp.spawn script does, here without the script)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from gpulab.parallel import launch
from gpulab.parallel.workloads.spawn_job import make_job, single_process_training


def _torch_ddp_ranks(rank: int, world_size: int, seed: int, epochs: int) -> dict[str, torch.Tensor]:
    job = make_job(seed)
    ddp = nn.parallel.DistributedDataParallel(job.model)
    opt = torch.optim.SGD(ddp.parameters(), lr=job.lr, momentum=job.momentum)
    sampler = DistributedSampler(job.dataset, world_size, rank, shuffle=True, seed=job.seed)
    loader = DataLoader(job.dataset, batch_size=job.global_batch_size // world_size, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
    return {n: p.detach().clone() for n, p in job.model.named_parameters()}


def test_the_same_seed_gives_the_same_job_and_another_seed_another():
    a, b, c = make_job(3), make_job(3), make_job(4)
    for x, y in zip(a.dataset.tensors, b.dataset.tensors):
        assert torch.equal(x, y)
    for (n, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), n
    assert not torch.equal(a.dataset.tensors[0], c.dataset.tensors[0])
    assert not torch.equal(next(a.model.parameters()), next(c.model.parameters()))
    assert len(make_job(0, num_batches=3, global_batch_size=12).dataset) == 36


@pytest.mark.parametrize("kwargs", [dict(num_batches=0), dict(global_batch_size=0)])
def test_an_empty_job_is_refused(kwargs):
    with pytest.raises(ValueError, match="must be >= 1"):
        make_job(0, **kwargs)


def test_single_process_training_is_what_torch_ddp_with_its_sampler_ends_with():
    seed, epochs = 7, 2
    expected = single_process_training(seed, epochs=epochs, world_size=2)
    assert expected["world_size"] == 2
    before = dict(make_job(seed).model.named_parameters())
    per_rank = launch(_torch_ddp_ranks, 2, args=(seed, epochs), echo=False)
    for rank, params in enumerate(per_rank):
        assert params.keys() == expected["params"].keys()
        for n, p in params.items():
            torch.testing.assert_close(p, expected["params"][n], rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {rank} {n}: {m}")
            assert not torch.allclose(p, before[n]), f"{n} did not move: nothing was trained"
