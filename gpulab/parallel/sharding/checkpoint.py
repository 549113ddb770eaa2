"""Checkpoints of a ZeRO-1 optimizer (lab 09): the full state gathered from its owners, and a full
state scattered back, each rank keeping its share.

:class:`ShardedStateDict` gives :class:`~gpulab.parallel.sharding.zero1.ShardedOptimizer` the
``state_dict`` / ``load_state_dict`` of a one-process optimizer, so a checkpoint written by a
sharded run loads into an unsharded one and back (tests/parallel/sharding/test_zero1.py).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ShardedStateDict"]


class ShardedStateDict:
    """``state_dict`` and ``load_state_dict`` for an optimizer whose ``local_optimizer`` holds the
    state of the parameters this rank owns (``owner[p] == rank``) among all of ``param_groups``."""

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
