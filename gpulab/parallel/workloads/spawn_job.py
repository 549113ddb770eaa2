"""The training job of lab 06's spawn-based script: a model, a data set and the hyper-parameters,
all fixed by one seed, so that a script started with ``mp.spawn`` and one process on the whole
batch can be compared parameter for parameter.

The student writes that script (how it is built: the comment below the imports); it builds its job with::

    from gpulab.parallel.workloads.spawn_job import make_job
    job = make_job(seed)          # job.model, job.dataset, job.global_batch_size, job.lr, ...

Every process that calls ``make_job(seed)`` gets the same initial weights and the same samples.
:func:`single_process_training` is what a correct script's rank 0 ends with (the grader's expected
value; masked while lab 06 is graded, since a script could save it instead of training).

    .venv/bin/python -m pytest tests/parallel/workloads/test_spawn_job.py
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

from gpulab.models import MLP

# The source posts start DDP the way PyTorch's ImageNet example does: a script whose
# ``if __name__ == "__main__":`` block calls ``torch.multiprocessing.spawn(main_worker, nprocs=N,
# args=(...))``; each ``main_worker(rank, world_size, ...)`` joins the process group, wraps the
# model in ``DistributedDataParallel`` and reads its shard through a ``DistributedSampler``.

__all__ = ["SpawnJob", "make_job", "single_process_training", "SIZES"]

SIZES = (16, 32, 32, 4)  # the MLP's widths: input, hidden, hidden, classes


@dataclass
class SpawnJob:
    """What to train, on what, and how.

    Attributes:
        model: the MLP, initialised from the seed (every process builds the same one).
        dataset: ``(input, target)`` pairs; its length is a multiple of ``global_batch_size``.
        global_batch_size: samples per optimizer step over all ranks (divisible by 1, 2, 3, 4, 6).
        lr, momentum: for ``torch.optim.SGD``.
        seed: the seed the job came from; also the ``DistributedSampler``'s shuffling seed.
    """

    model: nn.Module
    dataset: TensorDataset
    global_batch_size: int
    lr: float
    momentum: float
    seed: int


def make_job(seed: int, num_batches: int = 4, global_batch_size: int = 24) -> SpawnJob:
    """The job for ``seed``: the same model and data in every process that asks.

    Args:
        seed: fixes the weights, the samples and the shuffling.
        num_batches: optimizer steps per epoch.
        global_batch_size: samples per step, over all ranks.

    Raises:
        ValueError: for a non-positive ``num_batches`` or ``global_batch_size``.
    """
    if num_batches < 1 or global_batch_size < 1:
        raise ValueError(f"num_batches and global_batch_size must be >= 1, got {num_batches} and {global_batch_size}")
    torch.manual_seed(seed)
    model = MLP(SIZES)
    g = torch.Generator().manual_seed(seed + 1)
    n = num_batches * global_batch_size
    inputs = torch.randn(n, SIZES[0], generator=g)                 # (n, 16)
    targets = torch.randint(0, SIZES[-1], (n,), generator=g)       # (n,)
    return SpawnJob(model, TensorDataset(inputs, targets), global_batch_size, lr=0.1, momentum=0.9, seed=seed)


def single_process_training(seed: int, epochs: int = 2, world_size: int = 2) -> dict[str, Any]:
    """What rank 0 of a correct script saves: the job trained in one process on whole global batches,
    each epoch in the order ``DistributedSampler(shuffle=True, seed=job.seed)`` gives after
    ``set_epoch(epoch)`` (rank r reads every ``world_size``-th index of it, so one global batch is a
    contiguous run of that order)."""
    job = make_job(seed)
    model = job.model
    opt = torch.optim.SGD(model.parameters(), lr=job.lr, momentum=job.momentum)
    inputs, targets = job.dataset.tensors
    for epoch in range(epochs):
        order = torch.randperm(len(job.dataset), generator=torch.Generator().manual_seed(job.seed + epoch))
        for batch in order.split(job.global_batch_size):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            opt.step()
    return {"params": {n: p.detach().clone() for n, p in model.named_parameters()}, "world_size": world_size}
