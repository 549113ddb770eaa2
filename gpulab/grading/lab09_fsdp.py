"""Lab 09's graders for the FSDP2 exercise: the student's ``wrap_fsdp(model, mesh, reshard_after_forward)``
applies torch's ``fully_shard`` to a :class:`~gpulab.parallel.sharding.fsdp.BlockMLP`, inside real ranks.

Code inside ranks cannot send evidence: :func:`run_fsdp` returns what each rank holds (through
:func:`~gpulab.parallel.sharding.fsdp.probe_fsdp`), for the test cell's checks to send; the
source's ``wrap_fsdp``, run the same way in the reference run, gives the expected side, and the
function next to each value gives a visible test's interactive expected value (gpulab's
:func:`~gpulab.parallel.sharding.fsdp.apply_fsdp` is masked in the student's kernel):

- every rank's parameters after training against :func:`single_process_params` (torch's AdamW in
  one process, on the whole batch);
- the parameter bytes each rank stores against :func:`expected_local_bytes` (each parameter's rows
  split as ``torch.chunk`` splits them: FSDP2's ``Shard(0)``), counted from the tensors;
- the FSDP units, the all-gathers per forward and backward and the peak parameter bytes held whole
  (:func:`structure`) against :func:`reference_fsdp`, gpulab's wrapping in the same ranks.
"""

from __future__ import annotations

import functools
import math
import random
from typing import Any, Callable

import torch
from torch import nn

from gpulab.grading.lab09 import _data
from gpulab.parallel import launch
from gpulab.parallel.sharding.fsdp import ADAM_EPS, BlockMLP, apply_fsdp, probe_fsdp

__all__ = [
    "fsdp_case",
    "run_fsdp",
    "reference_fsdp",
    "single_process_params",
    "expected_local_bytes",
    "peaks",
    "structure",
]

NUM_STEPS, LR = 3, 0.05


def fsdp_case(rng: random.Random) -> dict[str, int]:
    """A model drawn from ``rng``: ``depth`` blocks of ``width`` features (odd widths split unevenly), ``seed``."""
    return {"depth": rng.randint(2, 4), "width": rng.randrange(9, 33), "seed": rng.randrange(10**6)}


def _wrapper(wrap_fn: Callable[..., Any], reshard_after_forward: bool) -> Callable[[nn.Module, Any], Any]:
    return functools.partial(_call, wrap_fn, reshard_after_forward)


def _call(wrap_fn: Callable[..., Any], reshard_after_forward: bool, model: nn.Module, mesh: Any) -> Any:
    return wrap_fn(model, mesh, reshard_after_forward=reshard_after_forward)


@functools.lru_cache(maxsize=8)
def run_fsdp(
    wrap_fn: Callable[..., Any],
    world_size: int = 2,
    *,
    depth: int = 3,
    width: int = 16,
    seed: int = 0,
    reshard_after_forward: bool = True,
    timeout: float = 90,
) -> list[dict[str, Any]]:
    """``wrap_fn(model, mesh, reshard_after_forward=...)`` on a ``BlockMLP(width=width, depth=depth,
    seed=seed)`` in every rank, then 3 AdamW steps, each rank on its part of a 24-sample batch
    drawn from ``seed``. One launch per arguments (kept, so the test cells of one run share it).

    Returns:
        Per rank, :func:`~gpulab.parallel.sharding.fsdp.probe_fsdp`'s record: ``units``,
        ``local_bytes``, ``full_bytes``, ``gathers`` per step, ``timeline``, ``params``.
    """
    make_model = functools.partial(BlockMLP, width=width, depth=depth, seed=seed)
    inputs, targets = _data(seed=seed)
    return launch(
        probe_fsdp,
        world_size,
        args=(_wrapper(wrap_fn, reshard_after_forward), make_model, inputs, targets, NUM_STEPS, LR),
        timeout=timeout,
        echo=False,
    )


@functools.lru_cache(maxsize=8)
def reference_fsdp(
    world_size: int = 2, depth: int = 3, width: int = 16, seed: int = 0, reshard_after_forward: bool = True
) -> list[dict[str, Any]]:
    """:func:`run_fsdp` of gpulab's :func:`~gpulab.parallel.sharding.fsdp.apply_fsdp`."""
    return run_fsdp(
        apply_fsdp, world_size, depth=depth, width=width, seed=seed, reshard_after_forward=reshard_after_forward
    )


def single_process_params(depth: int = 3, width: int = 16, seed: int = 0) -> dict[str, torch.Tensor]:
    """The parameters after :func:`run_fsdp`'s steps taken by one process on the whole batch."""
    model = BlockMLP(width=width, depth=depth, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, eps=ADAM_EPS)
    inputs, targets = _data(seed=seed)
    for _ in range(NUM_STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def expected_local_bytes(world_size: int, depth: int = 3, width: int = 16, seed: int = 0) -> list[int]:
    """Per rank, the parameter bytes it stores when every parameter's rows (dim 0) are split in
    ``world_size`` chunks of ``ceil(rows / world_size)``, the last ones shorter or empty."""
    out = [0] * world_size
    for p in BlockMLP(width=width, depth=depth, seed=seed).parameters():
        rows, chunk = p.shape[0], math.ceil(p.shape[0] / world_size)
        for rank in range(world_size):
            out[rank] += max(0, min(chunk, rows - rank * chunk)) * (p.numel() // rows) * p.element_size()
    return out


def peaks(record: dict[str, Any]) -> dict[str, int]:
    """The most parameter bytes a rank held whole at one Linear, in forward and in backward."""
    return {
        phase: max((b for ph, _, b in record["timeline"] if ph == phase), default=0)
        for phase in ("forward", "backward")
    }


def structure(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: the FSDP units, the all-gathers of each step (forward, backward) and :func:`peaks`."""
    return [{"units": r["units"], "gathers": r["gathers"], "peaks": peaks(r)} for r in runs]
