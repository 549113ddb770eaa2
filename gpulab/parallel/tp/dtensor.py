"""PyTorch's own tensor parallelism beside gpulab's: DTensor's ``parallelize_module`` (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_dtensor.py      # 2 and 4 gloo ranks

``torch.distributed.tensor.parallel.parallelize_module(module, mesh, plan)`` replaces the named
linears' weights by ``DTensor``s sharded over a ``DeviceMesh``: ``ColwiseParallel`` shards a
weight by output features (``Shard(0)``), ``RowwiseParallel`` by input features (``Shard(1)``),
and the input/output hooks insert the same collectives as Megatron's ``f`` and ``g``. The plans
below shard :func:`~gpulab.parallel.tp.mlp.feed_forward` and
:class:`~gpulab.parallel.tp.attention.SelfAttention` the way the lab's own layers do, so both
run on the same weights and can be compared number for number (the PyTorch tutorial "Large
Scale Transformer model training with Tensor Parallel" uses the same plans).
"""

from __future__ import annotations

from torch import nn

__all__ = ["mlp_plan", "attention_plan", "parallelize", "local_tensor"]


def mlp_plan() -> dict:
    """``feed_forward``'s plan: the first linear (``"0"``) column-wise, the last (``"2"``) row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def attention_plan() -> dict:
    """``SelfAttention``'s plan: q, k and v column-wise (whole heads per rank), ``out`` row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "out": RowwiseParallel()}


def parallelize(block: nn.Module, world_size: int, device_type: str = "cpu") -> nn.Module:
    """``block`` (every rank builds the same one) sharded in place by DTensor over all ``world_size`` ranks.

    Args:
        block: a ``feed_forward`` (``nn.Sequential``) or a ``SelfAttention``.
        world_size: the ranks of the default process group.
        device_type: ``"cpu"`` (gloo) or ``"cuda"`` (nccl): where the mesh's tensors live.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    plan = mlp_plan() if isinstance(block, nn.Sequential) else attention_plan()
    mesh = init_device_mesh(device_type, (world_size,))
    return parallelize_module(block, mesh, plan)


def local_tensor(t):
    """This rank's shard of a ``DTensor`` (``.to_local()``), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t
