"""FSDP2 wrapping: one ``fully_shard`` unit per block, then the root (lab 09), and what it changes.

A unit's parameters are stored as 1/N ``DTensor`` shards; the unit all-gathers them just before
it runs (forward, then again in backward) and frees them after. One unit per block holds the
root's parameters and one block whole at a time; a root-only unit gathers the whole model at once. The probe
records both, per rank: all-gathers per forward and backward, and the parameter bytes held whole
at every Linear's forward and backward (PyTorch's FSDP2 tutorial wraps transformer blocks the same
way). Run it on 2 gloo ranks with::

    launch(probe_fsdp, 2, args=(apply_fsdp, BlockMLP))     # [rank 0's record, rank 1's]
    launch(probe_wrappings, 2, args=({"per block": apply_fsdp, "root only": root_only}, BlockMLP))
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from gpulab.parallel.launcher import rank_device
from gpulab.parallel.sharding.accumulation import C10dOps

# AdamW with eps 1e-3: its first step is lr * g / (|g| + eps), which with torch's eps (1e-8) turns a
# 1e-7 rounding difference in a gradient near zero (the ranks sum in another order) into 1e-5 of a
# weight; 1e-3 bounds that gain by lr / eps and leaves every other gradient's step as it was.
ADAM_EPS = 1e-3

__all__ = ["ADAM_EPS", "BlockMLP", "apply_fsdp", "root_only", "local_param_bytes", "probe_fsdp", "probe_wrappings"]


class BlockMLP(nn.Module):
    """``embed``, ``depth`` residual blocks (Linear to 2x width, ReLU, Linear back) in ``blocks``, and a ``head``."""

    def __init__(self, features: int = 8, width: int = 16, depth: int = 3, classes: int = 8, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, 2 * width), nn.ReLU(), nn.Linear(2 * width, width))
                                    for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)  # (B, width)
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)  # (B, classes)


def apply_fsdp(model: nn.Module, mesh: Any, reshard_after_forward: bool = True) -> nn.Module:
    """Make each of ``model.blocks`` an FSDP2 unit, then the root (which takes every other parameter).

    Args:
        model: a module with a ``blocks`` iterable of submodules; sharded in place.
        mesh: the 1-D data-parallel ``DeviceMesh``.
        reshard_after_forward: for the blocks: free the gathered weights after forward (ZeRO-3,
            gathered again in backward) or keep them to backward (ZeRO-2-like).

    Returns:
        ``model``, now an ``FSDPModule``.
    """
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, mesh=mesh)  # the root last: it keeps embed and head, not the blocks


def root_only(model: nn.Module, mesh: Any) -> nn.Module:
    """The coarse baseline: one unit for the whole model (one all-gather of everything)."""
    from torch.distributed.fsdp import fully_shard

    return fully_shard(model, mesh=mesh)


def local_param_bytes(model: nn.Module) -> int:
    """Bytes of parameters this rank stores: a DTensor's local shard, any other tensor whole."""
    local = (getattr(p, "to_local", lambda p=p: p)() for p in model.parameters())
    return sum(t.numel() * t.element_size() for t in local)


def _whole_bytes(model: nn.Module) -> int:
    from torch.distributed.tensor import DTensor

    return sum(p.numel() * p.element_size() for p in model.parameters() if not isinstance(p, DTensor))


def probe_fsdp(rank: int, world_size: int, wrap: Callable[[nn.Module, Any], Any], make_model: Callable[[], nn.Module],
               inputs: torch.Tensor | None = None, targets: torch.Tensor | None = None, num_steps: int = 2,
               lr: float = 0.05) -> dict[str, Any]:
    """Rank body: ``wrap(model, mesh)``, then ``num_steps`` AdamW steps on this rank's part of the batch.

    Returns:
        ``units`` (names of the FSDP modules, ``""`` the root), ``local_bytes`` and ``full_bytes``
        (parameters stored here / the unsharded model), per step ``gathers`` (all-gathers in
        forward, in backward), ``timeline`` (the first step's ``(phase, Linear's name, bytes
        held whole)`` as each Linear starts) and ``params`` (full parameters after training, gathered).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    device = rank_device(rank)
    model = make_model().to(device)
    full_bytes = local_param_bytes(model)
    wrap(model, init_device_mesh(device.type, (world_size,)))
    if inputs is None or targets is None:  # 8 features, 8 classes: BlockMLP's defaults
        g = torch.Generator().manual_seed(1)
        inputs, targets = torch.randn(8 * world_size, 8, generator=g), torch.randint(0, 8, (8 * world_size,), generator=g)
    inputs, targets = inputs.chunk(world_size)[rank].to(device), targets.chunk(world_size)[rank].to(device)
    timeline: list[tuple[str, str, int]] = []
    handles = []
    for name, layer in model.named_modules():  # hooks added after FSDP's own: the unit is gathered first
        if isinstance(layer, nn.Linear):
            for phase, register in (("forward", layer.register_forward_pre_hook),
                                    ("backward", layer.register_full_backward_pre_hook)):
                handles.append(register(lambda *_, at=(phase, name): timeline.append((*at, _whole_bytes(model)))))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, eps=ADAM_EPS)
    gathers = []
    for step in range(num_steps):
        opt.zero_grad()
        with C10dOps() as fwd:
            loss = nn.functional.cross_entropy(model(inputs), targets)
        with C10dOps() as bwd:
            loss.backward()
        opt.step()
        gathers.append((fwd.all_gathers, bwd.all_gathers))
        if step == 0:
            for h in handles:
                h.remove()
    full = {n: getattr(p, "full_tensor", lambda p=p: p)().detach().cpu() for n, p in model.named_parameters()}
    return {"units": [n for n, m in model.named_modules() if isinstance(m, FSDPModule)],
            "local_bytes": local_param_bytes(model), "full_bytes": full_bytes, "gathers": gathers,
            "timeline": timeline, "params": full}


def probe_wrappings(rank: int, world_size: int, wrappings: dict[str, Callable[[nn.Module, Any], Any]],
                    make_model: Callable[[], nn.Module]) -> dict[str, dict[str, Any]]:
    """Rank body: :func:`probe_fsdp` of each named wrapping, one after the other in one launch."""
    return {name: probe_fsdp(rank, world_size, wrap, make_model) for name, wrap in wrappings.items()}
