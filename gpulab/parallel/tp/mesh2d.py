"""2-D parallelism: tensor parallel inside groups of ranks, data parallel across them (lab 11).

    from gpulab.parallel import launch
    from gpulab.parallel.tp import mesh2d
    launch(mesh2d.run_2d, 4, args=(2,))     # a 2 x 2 mesh: 2 data-parallel replicas of a 2-way TP block

Large jobs combine both: tensor parallelism within a node (its all-reduces are on the critical
path of every layer and need NVLink), data parallelism across nodes (one gradient all-reduce per
step, which overlaps backward). A ``DeviceMesh`` of shape ``(dp, tp)`` names the two kinds of
groups: with 4 ranks, ``mesh["tp"]`` groups ranks {0, 1} and {2, 3} (each holds one copy of the
model, split), ``mesh["dp"]`` groups {0, 2} and {1, 3} (the same shard in both replicas).

:func:`run_2d` shards :func:`~gpulab.parallel.tp.mlp.feed_forward` with DTensor over ``mesh["tp"]``,
gives each data-parallel replica its part of the batch, and averages the local gradient shards
over ``mesh["dp"]``: the result equals one process on the whole batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.tp.dtensor import local_tensor, mlp_plan
from gpulab.parallel.tp.mlp import feed_forward

__all__ = ["run_2d", "single_process_grads"]


def _data(batch_size: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, hidden, generator=g), torch.randn(batch_size, hidden, generator=g)


def single_process_grads(hidden: int = 16, batch_size: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """The full block's gradients of the mean loss on the whole batch, in one process."""
    block = feed_forward(hidden, 4 * hidden, seed)
    x, target = _data(batch_size, hidden, seed)
    torch.nn.functional.mse_loss(block(x), target).backward()
    return {n: p.grad for n, p in block.named_parameters()}


def run_2d(rank: int, world_size: int, tp_size: int = 2, hidden: int = 16, batch_size: int = 8,
           seed: int = 0) -> dict[str, Any]:
    """Rank body: a ``(world_size // tp_size, tp_size)`` mesh, TP over ``"tp"``, gradients averaged over ``"dp"``.

    Returns:
        ``coords`` (this rank's ``(dp, tp)`` place), ``tp_ranks`` / ``dp_ranks`` (its groups), and
        ``max_abs_diff``: this rank's gradient shards against :func:`single_process_grads`' matching slices.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    if world_size % tp_size:
        raise ValueError(f"world_size={world_size} is not divisible by tp_size={tp_size}")
    dp_size = world_size // tp_size
    device = rank_device(rank)
    mesh = init_device_mesh(device.type, (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    dp_rank, tp_rank = mesh["dp"].get_local_rank(), mesh["tp"].get_local_rank()
    block = parallelize_module(feed_forward(hidden, 4 * hidden, seed).to(device), mesh["tp"], mlp_plan())
    x, target = (t.to(device) for t in _data(batch_size, hidden, seed))
    mine = slice(dp_rank * batch_size // dp_size, (dp_rank + 1) * batch_size // dp_size)  # this replica's samples
    torch.nn.functional.mse_loss(block(x[mine]), target[mine]).backward()
    for p in block.parameters():  # data parallel: average the same shard over the replicas
        grad = local_tensor(p.grad)
        dist.all_reduce(grad, group=mesh["dp"].get_group())
        grad /= dp_size
    ref = single_process_grads(hidden, batch_size, seed)
    cuts = {"0.weight": 0, "0.bias": 0, "2.weight": 1, "2.bias": None}  # how each is sharded over tp
    diff = 0.0
    for name, p in block.named_parameters():
        want = ref[name] if cuts[name] is None else ref[name].chunk(tp_size, cuts[name])[tp_rank]
        diff = max(diff, (local_tensor(p.grad).cpu() - want).abs().max().item())
    return {"coords": (dp_rank, tp_rank), "tp_ranks": dist.get_process_group_ranks(mesh["tp"].get_group()),
            "dp_ranks": dist.get_process_group_ranks(mesh["dp"].get_group()), "max_abs_diff": diff}
