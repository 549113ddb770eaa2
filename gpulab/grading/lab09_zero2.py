"""Lab 09's graders for the ZeRO-2 exercise: the student's ``MyZeRO2(params, optimizer_cls, **kwargs)``
(``zero_grad()``, ``step()``, its torch optimizer kept as ``local_optimizer``), run inside real ranks.

Code inside ranks cannot send evidence: :func:`run_zero2` returns what each rank holds, for the test
cell's checks to send; the source's ``MyZeRO2``, run the same way in the reference run, gives the
expected side, and the function next to each value gives a visible test's interactive expected
value (gpulab's :class:`ZeRO2Optimizer` is masked in the student's kernel):

- every rank's parameters after training, against :func:`single_process_params` (torch's
  optimizer in one process, on the whole batch), and its shard against :func:`expected_shards`;
- the collectives of each iteration, counted by name through ``torch.distributed``
  (:func:`~gpulab.parallel.sharding.accumulation.count_collectives`) and at the dispatcher, where
  any import path shows, against :func:`reference_zero2` (gpulab's ZeRO-2 in the same ranks);
- the optimizer state bytes, and the bytes the object keeps after ``step()`` beyond the model's
  parameters and gradients (each storage once: a shard that is a view of a full-size buffer
  counts as the full buffer), at most the shard's state and two shard-sized tensors;
- torch's ``ZeroRedundancyOptimizer``, DDP and FSDP (1 and 2) objects built: refused.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types
from typing import Any, Callable

import torch
from torch import nn

from gpulab.grading.lab09 import OPTIMIZERS, _data, _model, counting_built, single_process_params
from gpulab.parallel import launch, rank_device
from gpulab.parallel.sharding.accumulation import COUNTED, C10dOps, count_collectives
from gpulab.parallel.sharding.state_bytes import optimizer_state_bytes
from gpulab.parallel.sharding.zero2 import ZeRO2Optimizer

__all__ = ["run_zero2", "reference_zero2", "single_process_params", "expected_shards", "REFUSED"]

REFUSED = ("ZeroRedundancyOptimizer", "DistributedDataParallel", "FullyShardedDataParallel", "fully_shard")


def _refused_classes() -> dict[str, type]:
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState  # what fully_shard attaches to a module
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    return dict(zip(REFUSED, (ZeroRedundancyOptimizer, DistributedDataParallel, FullyShardedDataParallel, FSDPState)))


def _held_bytes(opt: Any, model: nn.Module) -> int:
    """Bytes of the storages reachable from ``opt`` (attributes, containers, optimizer state and
    ``.grad``), each counted once, leaving out the model's parameters and their gradients."""
    own = {t.untyped_storage().data_ptr() for p in model.parameters() for t in (p, p.grad) if t is not None}
    storages: dict[int, int] = {}
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(opt, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > 10 or isinstance(obj, (type, types.ModuleType, types.FunctionType, str, bytes)):
            continue
        seen.add(id(obj))
        nxt = depth + 1
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.data_ptr() not in own and storage.nbytes():
                storages[storage.data_ptr()] = storage.nbytes()
            if obj.grad is not None:
                stack.append((obj.grad, nxt))
        elif isinstance(obj, nn.Module):
            stack.extend((t, nxt) for t in [*obj.parameters(), *obj.buffers()])
        elif isinstance(obj, dict):
            stack.extend((x, nxt) for kv in obj.items() for x in kv)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend((x, nxt) for x in obj)
        else:
            with contextlib.suppress(TypeError):  # objects without a __dict__ (C++ process groups...)
                stack.extend((x, nxt) for x in vars(obj).values())
    return sum(storages.values())


def _zero2_rank(rank, world_size, zero_cls, model_name, optimizer, num_steps, seed):
    device = rank_device(rank)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data(seed=seed))  # this rank's shard of the batch
    model = _model(model_name).to(device)
    calls, c10d = [], []
    with counting_built(_refused_classes()) as built:
        opt = zero_cls(model.parameters(), opt_cls, **kwargs)
        for _ in range(num_steps):
            with count_collectives() as counted, C10dOps() as ops:  # the whole iteration: hooks count too
                opt.zero_grad()
                nn.functional.cross_entropy(model(inputs), targets).backward()
                opt.step()
            calls.append({k: counted[k] for k in COUNTED})
            c10d.append(ops.count)
    holder = getattr(opt, "local_optimizer", None)
    if not isinstance(holder, torch.optim.Optimizer):
        raise TypeError("your ZeRO-2 class must keep its torch optimizer in self.local_optimizer")
    shard = [p.detach().cpu().clone() for g in holder.param_groups for p in g["params"]]
    return {
        "params": {n: p.detach().cpu() for n, p in model.named_parameters()},
        "shard": shard,
        "state_bytes": optimizer_state_bytes(holder),
        "held_bytes": _held_bytes(opt, model),
        "calls": calls,
        "c10d_ops": c10d,
        "refused_built": {k: built[k] for k in REFUSED},
    }


@functools.lru_cache(maxsize=8)
def run_zero2(
    zero_cls: Callable[..., Any],
    world_size: int = 2,
    *,
    model: str = "mlp",
    optimizer: str = "adamw",
    num_steps: int = 3,
    seed: int = 1,
    timeout: float = 90,
) -> list[dict[str, Any]]:
    """Train ``model`` ("mlp": 1280 parameters, "tied": 824, "tiny": 72) ``num_steps`` with
    ``zero_cls`` over ``optimizer`` ("adamw", or "sgd" with momentum) on ``world_size`` ranks, each
    with its shard of a 24-sample batch drawn from ``seed``, without DDP. One launch per arguments
    (kept, so the test cells of one run share it; redefining the class starts a new one).

    Returns:
        Per rank: ``params``; ``shard`` (the tensors its ``local_optimizer`` updates);
        ``state_bytes`` (that optimizer's state); ``held_bytes`` (what the object keeps after the
        last step beyond the model's parameters and gradients); per iteration ``calls``
        (``{collective: count}``, through ``torch.distributed``) and ``c10d_ops`` (collectives
        at the dispatcher); ``refused_built`` (torch ZeRO / DDP / FSDP objects built: all 0).
    """
    return launch(
        _zero2_rank, world_size, args=(zero_cls, model, optimizer, num_steps, seed), timeout=timeout, echo=False
    )


@functools.lru_cache(maxsize=8)
def reference_zero2(
    world_size: int = 2, model: str = "mlp", optimizer: str = "adamw", num_steps: int = 3, seed: int = 1
) -> list[dict[str, Any]]:
    """:func:`run_zero2` of gpulab's :class:`ZeRO2Optimizer`."""
    return run_zero2(ZeRO2Optimizer, world_size, model=model, optimizer=optimizer, num_steps=num_steps, seed=seed)


def expected_shards(
    world_size: int, model: str = "mlp", optimizer: str = "adamw", num_steps: int = 3, seed: int = 1
) -> list[list[torch.Tensor]]:
    """Per rank, ``[shard]``: its contiguous piece of the single-process parameters, flattened in
    ``model.parameters()`` order and padded with zeros to a multiple of ``world_size``."""
    flat = torch.cat([p.reshape(-1) for p in single_process_params(model, optimizer, num_steps, seed).values()])
    size = math.ceil(flat.numel() / world_size)
    flat = torch.cat([flat, flat.new_zeros(size * world_size - flat.numel())])  # (world_size * size,)
    return [[piece.clone()] for piece in flat.split(size)]
