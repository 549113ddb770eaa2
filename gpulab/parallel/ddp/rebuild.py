"""Buckets rebuilt from the order backward really produces the gradients, as torch DDP's reducer
does after its first iteration (lab 06, section 10, where the reducer's steps are cited).

Reverse registration order (:func:`~gpulab.parallel.ddp.bucketed.bucket_assignment`) only guesses
that order. Torch 2.13 (``reducer.cpp``, ``nn/parallel/distributed.py``) starts with one bucket
(``find_unused_parameters=False``), records the order in which gradients become ready during the
first backward, then refills buckets in that order: a tensor joins the open bucket of its dtype and
device, which closes once its size reaches the limit (1 MiB for the first, ``bucket_cap_mb`` = 25 MiB
after).

The exercise (masked while lab 06 is graded): :func:`ready_order`, :func:`rebuilt_buckets`.
Instruments: :func:`torch_ddp_buckets` (a rank body for :func:`gpulab.parallel.launch` that reads
the buckets torch's real reducer built) and :class:`OutOfOrderNet` (gradients out of registration
order). Run: ``pytest tests/parallel/ddp/test_rebuild.py``.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
from torch import nn

__all__ = ["FIRST_BUCKET_MB", "ready_order", "rebuilt_buckets", "torch_ddp_buckets", "OutOfOrderNet", "head_first_net"]

FIRST_BUCKET_MB = 1.0  # torch's dist._DEFAULT_FIRST_BUCKET_BYTES, in MiB


def ready_order(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> list[int]:
    """The order in which one cross-entropy backward makes the gradients ready.

    Runs on a ``copy.deepcopy`` of ``model``, so its own ``.grad`` are left alone.

    Returns:
        Indices into ``[p for p in model.parameters() if p.requires_grad]``, first ready first;
        a parameter that gets no gradient is not listed.
    """
    probe = copy.deepcopy(model)
    params = [p for p in probe.parameters() if p.requires_grad]
    order: list[int] = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: order.append(i)) for i, p in enumerate(params)]
    try:
        nn.functional.cross_entropy(probe(inputs), targets).backward()
    finally:
        for h in handles:
            h.remove()
    return order


def rebuilt_buckets(params: Sequence[torch.Tensor], order: Sequence[int], bucket_size_mb: float = 25.0,
                    first_bucket_mb: float = FIRST_BUCKET_MB) -> list[list[int]]:
    """Torch's rebuilt buckets: ``params`` taken in ``order``, each bucket closed once it reaches its limit.

    Args:
        params: the parameters (only sizes, dtypes and devices matter).
        order: every index of ``params`` exactly once, in the order the gradients became ready.
        bucket_size_mb: the limit of every bucket after the first of its dtype and device, in MiB.
        first_bucket_mb: the first bucket's limit, in MiB.

    Returns:
        Lists of indices into ``params``, in the order the buckets fill; the buckets still open at
        the end come last (one per dtype and device, in the order they were opened).

    Raises:
        ValueError: ``order`` is not a permutation of the indices, or a limit is not positive.
    """
    if sorted(order) != list(range(len(params))):
        raise ValueError(f"order must list each of the {len(params)} parameter indices exactly once, got {list(order)}")
    if not (bucket_size_mb > 0 and first_bucket_mb > 0):
        raise ValueError(f"bucket limits must be > 0 MiB, got {first_bucket_mb!r} and {bucket_size_mb!r}")
    limits = (first_bucket_mb * 2**20, bucket_size_mb * 2**20)
    closed: list[list[int]] = []
    open_: dict[tuple[Any, Any], tuple[list[int], int]] = {}  # (dtype, device) -> (indices, bytes)
    filled: dict[tuple[Any, Any], int] = {}                   # buckets closed so far, per key
    for i in order:
        p = params[i]
        key = (p.dtype, p.device)
        indices, size = open_.get(key, ([], 0))
        indices.append(i)
        size += p.numel() * p.element_size()
        if size >= limits[min(filled.get(key, 0), 1)]:
            closed.append(indices)
            filled[key] = filled.get(key, 0) + 1
            open_.pop(key, None)
        else:
            open_[key] = (indices, size)
    return closed + [indices for indices, _ in open_.values()]


def torch_ddp_buckets(rank: int, world_size: int, make_model: Callable[[], nn.Module], inputs: torch.Tensor,
                      targets: torch.Tensor, **ddp_kwargs: Any) -> dict[str, Any]:
    """Rank body for :func:`gpulab.parallel.launch`: the buckets torch's own reducer uses.

    Wraps ``make_model()`` in ``DistributedDataParallel(**ddp_kwargs)`` and trains three steps on
    this rank's shard: the reducer rebuilds its buckets at the second forward, and its logging data
    shows them from the third on.

    Returns:
        ``{"initial_buckets": how many buckets the first step used, "rebuilt": [[index, ...], ...]}``
        from the reducer's logging data (indices into the model's parameters).
    """
    model = make_model()
    ddp = nn.parallel.DistributedDataParallel(model, **ddp_kwargs)
    x, y = inputs.chunk(world_size)[rank], targets.chunk(world_size)[rank]
    initial = None
    for _ in range(3):
        ddp.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        if initial is None:
            initial = len(ddp._get_ddp_logging_data()["bucket_sizes"].split(","))
    data = ddp._get_ddp_logging_data()
    rebuilt = [[int(i) for i in b.split()] for b in str(data.get("rebuilt_per_bucket_param_indices", "")).split(",") if b.strip()]
    return {"initial_buckets": initial, "rebuilt": rebuilt}


class OutOfOrderNet(nn.Module):
    """An MLP whose layers are registered in ``order`` but applied first to last: reverse
    registration order is then a wrong guess at the order backward produces the gradients.

    Args:
        widths: the chain's widths, input first (``len(widths) - 1`` Linear layers).
        order: a permutation of the layer numbers: ``layers[k]`` is the chain's layer ``order[k]``.
    """

    def __init__(self, widths: Sequence[int], order: Sequence[int]) -> None:
        super().__init__()
        if sorted(order) != list(range(len(widths) - 1)):
            raise ValueError(f"order must be a permutation of 0..{len(widths) - 2}, got {list(order)}")
        self.order = list(order)
        self.layers = nn.ModuleList(nn.Linear(widths[k], widths[k + 1]) for k in order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = {k: j for j, k in enumerate(self.order)}
        last = len(self.order) - 1
        for k in range(len(self.order)):
            x = self.layers[position[k]](x)
            if k < last:
                x = torch.relu(x)
        return x


def head_first_net(seed: int = 0) -> OutOfOrderNet:
    """Lab 06's example: a 4-layer MLP (32 → 512 → 512 → 256 → 10, 1.6 MB) whose classifier is
    registered first and runs last; with torch's limits it rebuilds into two buckets."""
    torch.manual_seed(seed)
    return OutOfOrderNet([32, 512, 512, 256, 10], [3, 0, 2, 1])
