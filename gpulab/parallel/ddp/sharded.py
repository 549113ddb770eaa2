"""A ZeRO stage-1 optimizer written from scratch: each rank keeps the optimizer state of its share
of the parameters only (lab 09).

With data parallelism every rank holds the full parameters, the full gradients and the full
optimizer state. AdamW keeps two float32 tensors per parameter (``exp_avg``, ``exp_avg_sq``), so
its state is half of the 16 bytes per parameter a rank holds in fp32 training. ZeRO stage 1
(Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC 2020; torch's ``ZeroRedundancyOptimizer``; CS336's sharded optimizer) splits that state:

1. the parameters are divided among the ranks, balanced by size (:func:`balanced_owners`);
2. each rank builds the real optimizer (``optimizer_cls``) over **its own share only**, so it
   holds ``1/world_size`` of the state;
3. gradients are averaged over the ranks as in DDP (every rank still has every gradient);
4. ``step()`` updates the owned share, then every parameter is sent from its owner to every
   rank, so the replicas are identical again.

After k steps the parameters equal single-process training on the full batch
(tests/parallel/ddp/test_sharded.py).

Usage (inside a rank started by :func:`gpulab.parallel.launch`, or under torchrun)::

    model = NaiveDDP(Net())                                # or torch DDP: averages the gradients
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss_fn(model(inputs), targets).backward()
    model.sync_gradients()
    opt.step()                                             # update my share, broadcast from owners
    opt.zero_grad()

Tensors stay on each parameter's device, so the same code runs over gloo on CPUs and NCCL on GPUs.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["ShardedOptimizer", "balanced_owners", "owned_parameter_names"]


def balanced_owners(params: Iterable[torch.Tensor], world_size: int) -> list[int]:
    """The rank that owns each parameter, balancing the bytes each rank owns.

    Greedy "largest first" (as torch's ``ZeroRedundancyOptimizer`` does): walk the parameters from
    the largest to the smallest (equal sizes keep their order) and give each to the rank that owns
    the fewest bytes so far (the lowest rank on a tie). Every rank computes the same answer, with
    no communication.

    Args:
        params: the parameters, in the order the optimizer sees them.
        world_size: the number of ranks (>= 1).

    Returns:
        ``owners[i]`` is the rank that owns ``params[i]``.
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


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO stage 1: ``optimizer_cls`` over this rank's share of the parameters, then a broadcast.

    ``param_groups`` lists every parameter (so ``zero_grad``, learning-rate schedulers and
    ``state_dict`` see the whole model); ``state`` is the local optimizer's, and holds the state of
    the owned share only. All methods except ``zero_grad`` are collectives: every rank calls them,
    in the same order.

    Args:
        params: the parameters (or param-group dicts), the same on every rank, in the same order.
        optimizer_cls: the optimizer to shard, called as ``optimizer_cls(params, **kwargs)``.
        process_group: the ranks that share the state (default: all).
        bucketed: send each rank's updated share as one flat tensor (``world_size`` broadcasts per
            step) instead of one broadcast per parameter tensor (the naive way: one round trip each).
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

    # --- ownership ---------------------------------------------------------------------------------

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

        Args:
            closure: re-evaluates the model and returns the loss (run on every rank, before the update).

        Returns:
            The closure's loss, or None.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for mine, full in zip(self.local_optimizer.param_groups, self.param_groups):
            mine.update({k: v for k, v in full.items() if k != "params"})  # e.g. a scheduler changed lr
        self.local_optimizer.step()
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

        All N broadcasts start at once (``async_op=True``), so they travel together; the copies back
        into the parameters wait for them.
        """
        pending = []
        for rank in range(self.world_size):
            by_kind: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
            for p in self.owned(rank):
                by_kind.setdefault((p.dtype, p.device), []).append(p)
            for (dtype, device), params in by_kind.items():
                if rank == self.rank:
                    flat = torch.cat([p.data.reshape(-1) for p in params])  # (sum of numel,)
                else:
                    flat = torch.empty(sum(p.numel() for p in params), dtype=dtype, device=device)
                work = dist.broadcast(flat, src=self._src(rank), group=self.group, async_op=True)
                pending.append((rank, params, flat, work))
        for rank, params, flat, work in pending:
            work.wait()
            if rank != self.rank:
                for p, chunk in zip(params, flat.split([p.numel() for p in params])):
                    p.data.copy_(chunk.view_as(p))

    # --- checkpoints: the full state, gathered and scattered -------------------------------------------

    def _index(self) -> dict[torch.Tensor, int]:
        """Each parameter's position in ``param_groups`` order, as torch's ``state_dict`` numbers them."""
        return {p: i for i, p in enumerate(p for g in self.param_groups for p in g["params"])}

    def state_dict(self) -> dict[str, Any]:
        """The full optimizer state, gathered from every rank (a collective: call it on all ranks).

        Returns:
            The same layout as ``optimizer_cls(params).state_dict()`` in one process would give
            (state numbered in ``param_groups`` order, tensors on the CPU), on every rank.
        """
        index = self._index()
        mine = {index[p]: {k: v.detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else v for k, v in s.items()}
                for p, s in self.local_optimizer.state.items()}
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, mine, group=self.group)  # pickled: naive, fine for a checkpoint
        state = {i: s for part in everyone for i, s in part.items()}
        groups = []
        for full, local in zip(self.param_groups, self.local_optimizer.param_groups):
            g = {k: v for k, v in local.items() if k != "params"}
            g["params"] = [index[p] for p in full["params"]]
            groups.append(g)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any] | None, src: int | None = None) -> None:
        """Load a full state (from :meth:`state_dict` or a one-process optimizer); each rank keeps its share.

        Args:
            state_dict: the full state on every rank (``torch.load`` on each), or, with ``src``, on
                rank ``src`` only (the others may pass None).
            src: scatter from this group rank: it sends the state to the others, who keep their share.

        Raises:
            ValueError: when the state does not match the parameter groups.
        """
        if src is not None:
            box = [state_dict if self.rank == src else None]
            dist.broadcast_object_list(box, src=self._src(src), group=self.group)
            state_dict = box[0]
        if state_dict is None:
            raise ValueError("load_state_dict got None; pass the state on every rank, or give src= the rank that has it")
        groups = state_dict["param_groups"]
        if [len(g["params"]) for g in groups] != [len(g["params"]) for g in self.param_groups]:
            raise ValueError(f"the state has groups of {[len(g['params']) for g in groups]} parameters, this optimizer "
                             f"{[len(g['params']) for g in self.param_groups]}; load the state of the same model")
        local_groups, local_state, n = [], {}, 0
        for saved, full in zip(groups, self.param_groups):
            ids = []
            for saved_id, p in zip(saved["params"], full["params"]):
                if self.owner[p] != self.rank:
                    continue
                if saved_id in state_dict["state"]:  # copied: training on must not change the caller's dict
                    local_state[n] = {k: v.clone() if isinstance(v, torch.Tensor) else v
                                      for k, v in state_dict["state"][saved_id].items()}
                ids.append(n)
                n += 1
            local_groups.append({**{k: v for k, v in saved.items() if k != "params"}, "params": ids})
            full.update({k: v for k, v in saved.items() if k != "params"})
        self.local_optimizer.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.local_optimizer.state


def owned_parameter_names(model: nn.Module, optimizer: ShardedOptimizer) -> dict[int, list[str]]:
    """``{rank: [names]}``: which rank updates which parameter of ``model`` (for printing)."""
    names = {p: n for n, p in model.named_parameters()}
    return {r: [names.get(p, "?") for p in optimizer.owned(r)] for r in range(optimizer.world_size)}
