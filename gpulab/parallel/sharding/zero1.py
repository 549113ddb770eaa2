"""ZeRO stage 1 from scratch: each rank keeps the optimizer state of its share of the parameters
only (lab 09's exercise; Rajbhandari et al., "ZeRO", SC 2020; torch's ``ZeroRedundancyOptimizer``).

1. the parameters are divided among the ranks, balanced by bytes (:func:`balanced_owners`);
2. each rank builds the real optimizer over **its own share**: ``1/world_size`` of the state;
3. the gradients are averaged over the ranks first, as in DDP (every rank has every gradient);
4. ``step()`` updates the owned share, then each owner broadcasts it: the replicas agree again.

Inside a rank started by :func:`gpulab.parallel.launch` (``pytest tests/parallel/sharding/test_zero1.py``)::

    model = NaiveDDP(Net())
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(model(inputs), targets).backward(); model.sync_gradients(); opt.step(); opt.zero_grad()

Checkpoints (the full state gathered and scattered) are in :mod:`~gpulab.parallel.sharding.checkpoint`.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

from gpulab.parallel.sharding.checkpoint import ShardedStateDict

__all__ = ["ShardedOptimizer", "balanced_owners", "owned_parameter_names"]


def balanced_owners(params: Iterable[torch.Tensor], world_size: int) -> list[int]:
    """``owners[i]``: the rank that owns ``params[i]``, balancing the bytes each rank owns.

    Greedy "largest first" (as torch's ``ZeroRedundancyOptimizer``): from the largest parameter to
    the smallest (equal sizes keep their order), each goes to the rank that owns the fewest bytes
    so far (the lowest rank on a tie). Every rank computes the same answer, without communicating.

    Raises:
        ValueError: when ``world_size`` < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return _assign([p.numel() * p.element_size() for p in params], [0] * world_size)


def _assign(sizes: list[int], load: list[int]) -> list[int]:
    """Largest first, each to the least-loaded rank; ``load`` (bytes per rank) is updated in place."""
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # stable: equal sizes keep their order
        rank = min(range(len(load)), key=lambda r: load[r])  # min() returns the first: lowest rank on a tie
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


class ShardedOptimizer(ShardedStateDict, torch.optim.Optimizer):
    """ZeRO stage 1: ``optimizer_cls`` over this rank's share of the parameters, then a broadcast.

    ``param_groups`` lists every parameter (so ``zero_grad``, learning-rate schedulers and
    ``state_dict`` see the whole model); ``state`` is the local optimizer's: the owned share's only.
    Every method except ``zero_grad`` is a collective: all ranks call it, in the same order.

    Args:
        params: the parameters (or param-group dicts), the same on every rank, in the same order.
        optimizer_cls: the optimizer to shard, called as ``optimizer_cls(params, **kwargs)``.
        process_group: the ranks that share the state (default: all).
        bucketed: send each rank's updated share as one flat tensor (``world_size`` broadcasts per
            step) instead of one broadcast per parameter tensor (one round trip each).
        **kwargs: the options of ``optimizer_cls`` (``lr=...``, ``weight_decay=...``).

    Raises:
        RuntimeError: when no process group is initialised.
        TypeError: when ``optimizer_cls`` is not an optimizer class taking the parameters.

    Warning:
        The gradients must already be averaged over the ranks (DDP, :class:`~gpulab.parallel.NaiveDDP`)
        before ``step()``: ZeRO-1 shards the optimizer state, not the gradient communication.
    """

    def __init__(self, params: Iterable[Any], optimizer_cls: Callable[..., torch.optim.Optimizer], *,
                 process_group: Any = None, bucketed: bool = True, **kwargs: Any) -> None:
        _check_optimizer_cls(optimizer_cls)
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("ShardedOptimizer needs an initialised process group: create it inside a rank started by "
                               "gpulab.parallel.launch (or torchrun + torch.distributed.init_process_group)")
        self.optimizer_cls, self.group, self.bucketed = optimizer_cls, process_group, bucketed
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.owner: dict[torch.Tensor, int] = {}  # parameter -> the group rank that updates it
        self.local_optimizer: torch.optim.Optimizer | None = None
        self._load = [0] * self.world_size  # bytes owned by each rank so far (add_param_group adds more)
        super().__init__(params, defaults=dict(kwargs))  # calls add_param_group for each group
        self.state = self.local_optimizer.state  # the owned share's state, nothing else

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group: its parameters are shared out among the ranks, balanced with the earlier ones."""
        super().add_param_group(param_group)  # validates, fills the defaults
        group = self.param_groups[-1]
        new = [p for p in group["params"] if p not in self.owner]
        for p, rank in zip(new, _assign([p.numel() * p.element_size() for p in new], self._load)):
            self.owner[p] = rank
        mine = {**{k: v for k, v in group.items() if k != "params"},
                "params": [p for p in group["params"] if self.owner[p] == self.rank]}  # may be empty
        try:
            if self.local_optimizer is None:
                self.local_optimizer = self.optimizer_cls([mine], **self.defaults)
            else:
                self.local_optimizer.add_param_group(mine)
        except TypeError as err:
            raise TypeError(f"could not build {getattr(self.optimizer_cls, '__name__', self.optimizer_cls)}"
                            f"(params, **{self.defaults}): {err}. optimizer_cls must be a torch.optim.Optimizer "
                            "class, and the keyword arguments its options") from err
        for k, v in self.local_optimizer.param_groups[-1].items():  # the class's own defaults (betas, eps...)
            group.setdefault(k, v)

    def owned(self, rank: int | None = None) -> list[torch.Tensor]:
        """The parameters ``rank`` (default: this rank) updates, in ``param_groups`` order."""
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[p] == rank]

    def _src(self, rank: int) -> int:
        return dist.get_global_rank(self.group, rank) if self.group is not None else rank

    # --- the step ----------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Update this rank's share with ``optimizer_cls``, then send every parameter from its owner.
        ``closure`` (re-evaluates the model, returns the loss) runs on every rank before the update;
        its loss is returned (None without one)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for mine, full in zip(self.local_optimizer.param_groups, self.param_groups):
            mine.update({k: v for k, v in full.items() if k != "params"})  # e.g. a scheduler changed lr
        self.local_optimizer.step()  # only the owned share has state, so only it moves
        if self.bucketed:
            self._broadcast_flat()
        else:
            self._broadcast_per_tensor()
        return loss

    def _broadcast_per_tensor(self) -> None:
        """The naive way: one broadcast per parameter tensor (each pays a collective's round trip)."""
        for group in self.param_groups:
            for p in group["params"]:
                dist.broadcast(p.data, src=self._src(self.owner[p]), group=self.group)

    def _broadcast_flat(self) -> None:
        """One broadcast per rank (and dtype): each owner packs its updated share into one flat tensor.
        All of them start at once (``async_op=True``); the copies into the parameters wait for them."""
        pending = []
        for rank in range(self.world_size):
            by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for p in self.owned(rank):
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for (dtype, device), params in by_kind.items():
                if rank == self.rank:
                    flat = torch.cat([p.data.reshape(-1) for p in params])  # k x (shape_i) -> (sum of numel,)
                else:
                    flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
                work = dist.broadcast(flat, src=self._src(rank), group=self.group, async_op=True)
                pending.append((rank, params, flat, work))
        for rank, params, flat, work in pending:
            work.wait()
            if rank != self.rank:
                for p, chunk in zip(params, flat.split([p.numel() for p in params])):
                    p.data.copy_(chunk.view_as(p))  # (numel_i,) -> shape_i


def _check_optimizer_cls(optimizer_cls: Any) -> None:
    if isinstance(optimizer_cls, torch.optim.Optimizer):
        raise TypeError(f"optimizer_cls must be an optimizer class, got an instance of {type(optimizer_cls).__name__}; "
                        f"pass the class and its options: ShardedOptimizer(params, {type(optimizer_cls).__name__}, lr=...)")
    if not callable(optimizer_cls):
        raise TypeError(f"optimizer_cls must be an optimizer class such as torch.optim.AdamW, got {optimizer_cls!r}")
    try:
        sig = inspect.signature(optimizer_cls)
    except (TypeError, ValueError):
        return  # a builtin we cannot inspect: the call itself will tell
    positional = [p for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        raise TypeError(f"optimizer_cls={getattr(optimizer_cls, '__name__', optimizer_cls)!r} takes no parameters "
                        f"(signature {sig}); ShardedOptimizer calls optimizer_cls(params, **kwargs), as "
                        "torch.optim.AdamW(params, lr=...) is called")


def owned_parameter_names(model: nn.Module, optimizer: ShardedOptimizer) -> dict[int, list[str]]:
    """``{rank: [names]}``: which rank updates which parameter of ``model`` (for printing)."""
    names = {p: n for n, p in model.named_parameters()}
    return {r: [names.get(p, "?") for p in optimizer.owned(r)] for r in range(optimizer.world_size)}
