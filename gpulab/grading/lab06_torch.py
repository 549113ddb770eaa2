"""Lab 06's graders for the exercises on torch's own DDP: a mixed-precision step (exercise 6) and
detecting unused parameters before wrapping (exercise 7), and a comparison of gradient averaging
after backward with one process (no test cell uses it any more; demos and tests do).

The student's code runs inside real ranks (:func:`gpulab.parallel.launcher.launch`, fork), which
cannot send evidence: each function returns what the ranks hold, for the test cell to send.

- :func:`run_amp_steps`: the student's step under torch DDP; :func:`amp_reference` (gpulab's
  :func:`~gpulab.parallel.amp.amp_step` in the same ranks) gives a visible test its interactive
  expected value;
- :func:`gated_models` (models with random unused branches and frozen biases) and
  :func:`run_ddp_wrapping`; :func:`single_process_wrapping` is what a right wrapper gives;
- :func:`compare_with_single_process` (:class:`SyncCheck`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.grading.lab06_ddp import preload_torch_ddp
from gpulab.models import MLP
from gpulab.parallel.amp import amp_step, make_grad_scaler
from gpulab.parallel.ddp.allreduce import unused_parameters
from gpulab.parallel.launcher.launch import launch
from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.workloads.ddp_examples import BranchyNet, example_data, sgd_steps

__all__ = ["AMP_SIZES", "run_amp_steps", "amp_reference", "Gated", "gated_models", "run_ddp_wrapping",
           "single_process_wrapping", "SyncCheck", "compare_with_single_process"]


# --- exercise 6: a mixed-precision step under torch DDP -----------------------------------------------

AMP_SIZES = (16, 64, 64, 4)


def _mlp(sizes: Sequence[int]) -> nn.Module:
    torch.manual_seed(0)
    return MLP(sizes)


def _amp_rank(rank, world_size, step_fn, num_steps, seed):
    device = rank_device(rank)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data(AMP_SIZES, seed))
    model = _mlp(AMP_SIZES).to(device)
    seen: list[torch.dtype] = []
    model.net[-1].register_forward_hook(lambda mod, inp, o: seen.append(o.dtype))  # the classifier's output
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    scaler = make_grad_scaler(device)
    losses = [float(step_fn(ddp, inputs, targets, nn.functional.cross_entropy, opt, scaler, device))
              for _ in range(num_steps)]
    return {"losses": losses, "forward_dtypes": sorted({str(d) for d in seen}),
            "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
            "params": {n: p.detach().cpu() for n, p in model.named_parameters()}}


def run_amp_steps(step_fn: Callable, world_size: int = 2, *, num_steps: int = 4, seed: int = 1,
                  timeout: float = 60) -> list[dict[str, Any]]:
    """Per rank, after ``num_steps`` of ``step_fn`` (same signature as :func:`amp_step`) on an MLP
    under torch DDP, on this rank's shard of data drawn from ``seed``: ``losses``,
    ``forward_dtypes`` (of the classifier's output), ``param_dtypes`` and ``params``."""
    preload_torch_ddp()
    return launch(_amp_rank, world_size, args=(step_fn, num_steps, seed), timeout=timeout, echo=False)


@functools.lru_cache(maxsize=8)
def amp_reference(world_size: int = 2, num_steps: int = 4, seed: int = 1) -> list[dict[str, Any]]:
    """:func:`run_amp_steps` of gpulab's :func:`amp_step` (one launch per arguments, kept)."""
    return run_amp_steps(amp_step, world_size, num_steps=num_steps, seed=seed)


# --- exercise 7: unused parameters, and the DDP wrapper --------------------------------------------------

class Gated(nn.Module):
    """Parallel Linear branches summed; only the branches in ``used`` run, and the biases in
    ``frozen`` need no gradient."""

    def __init__(self, used: Sequence[bool], frozen: Sequence[bool], features: int = 8, out: int = 4) -> None:
        super().__init__()
        self.used = list(used)
        self.branches = nn.ModuleList(nn.Linear(features, out) for _ in used)
        for branch, f in zip(self.branches, frozen):
            branch.bias.requires_grad_(not f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum(b(x) for b, u in zip(self.branches, self.used) if u)


def gated_models(rng: random.Random, n: int = 6) -> dict[str, tuple[nn.Module, torch.Tensor]]:
    """``n`` :class:`Gated` models with random used branches (at least one) and frozen biases, and an
    input batch each, keyed by a readable name."""
    out = {}
    for i in range(n):
        k = rng.randint(2, 5)
        used = [rng.random() < 0.5 for _ in range(k)]
        used[rng.randrange(k)] = True
        frozen = [rng.random() < 0.3 for _ in range(k)]
        torch.manual_seed(rng.randrange(10**6))
        out[f"model {i + 1}: branches used {used}, biases frozen {frozen}"] = (Gated(used, frozen), torch.randn(4, 8))
    return out


def _wrap_rank(rank, world_size, wrap_fn, num_steps, seed):
    device = rank_device(rank)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data((8, 4), seed))
    out = {}
    for key, use_aux in (("unused_branch", False), ("all_used", True)):
        model = BranchyNet(use_aux).to(device)
        ddp = wrap_fn(model, device, inputs)
        sgd_steps(ddp, inputs, targets, num_steps, lr=0.2)
        out[key] = {"is_ddp": isinstance(ddp, nn.parallel.DistributedDataParallel),
                    "find_unused": bool(getattr(ddp, "find_unused_parameters", False)),
                    "params": {n: p.detach().cpu() for n, p in model.named_parameters()}}
    return out


def run_ddp_wrapping(wrap_fn: Callable, world_size: int = 2, *, num_steps: int = 3, seed: int = 1,
                     timeout: float = 60) -> dict[str, dict[str, list]]:
    """Train BranchyNet with and without its aux head, each wrapped by ``wrap_fn(model, device,
    inputs)`` on every rank (one launch), on data drawn from ``seed``.

    Returns:
        ``{"unused_branch": r, "all_used": r}``, each with per-rank lists: ``is_ddp`` (a torch
        DistributedDataParallel came back), ``find_unused`` (the flag it was built with) and
        ``params`` after training; compare with :func:`single_process_wrapping`.
    """
    preload_torch_ddp()
    per_rank = launch(_wrap_rank, world_size, args=(wrap_fn, num_steps, seed), timeout=timeout, echo=False)
    return {key: {field: [r[key][field] for r in per_rank] for field in ("is_ddp", "find_unused", "params")}
            for key in ("unused_branch", "all_used")}


def single_process_wrapping(world_size: int = 2, num_steps: int = 3, seed: int = 1) -> dict[str, dict[str, list]]:
    """What :func:`run_ddp_wrapping` must return: torch DDP, ``find_unused_parameters`` exactly when
    :func:`unused_parameters` finds some, and one process's parameters on every rank."""
    out = {}
    inputs, targets = example_data((8, 4), seed)
    for key, use_aux in (("unused_branch", False), ("all_used", True)):
        needs = bool(unused_parameters(BranchyNet(use_aux), inputs[: len(inputs) // world_size]))
        model = BranchyNet(use_aux)
        sgd_steps(model, inputs, targets, num_steps, lr=0.2)
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        out[key] = {"is_ddp": [True] * world_size, "find_unused": [needs] * world_size, "params": [params] * world_size}
    return out


# --- not an exercise any more: gradient averaging after backward, against one process ---------------------

@dataclass
class SyncCheck:
    """Per rank: the largest |parameter - single-process parameter| after training."""

    max_abs_diff: list[float]
    world_size: int
    num_steps: int

    @property
    def worst(self) -> float:
        """The largest difference over all ranks."""
        return max(self.max_abs_diff)


def _sync_rank(rank, world_size, sync_fn, sizes, num_steps, lr):
    device = rank_device(rank)
    model = _mlp(sizes).to(device)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data(sizes))  # this rank's shard
    sgd_steps(model, inputs, targets, num_steps, lr, lambda: sync_fn(model, world_size))
    return {n: p.detach().cpu() for n, p in model.named_parameters()}


def compare_with_single_process(sync_fn: Callable[[nn.Module, int], Any], world_size: int = 2, *,
                                sizes: Sequence[int] = (8, 32, 32, 4), num_steps: int = 3, lr: float = 0.2,
                                timeout: float = 60) -> SyncCheck:
    """Train ``num_steps`` of momentum SGD on ``world_size`` ranks, ``sync_fn(model, world_size)``
    after each backward (e.g. :func:`gpulab.parallel.allreduce_gradients`), and compare with one process on the
    whole batch (a measurement for demos and tests; no lab test cell uses it)."""
    per_rank = launch(_sync_rank, world_size, args=(sync_fn, tuple(sizes), num_steps, lr), timeout=timeout, echo=False)
    ref = _mlp(sizes)
    sgd_steps(ref, *example_data(sizes), num_steps, lr)
    diffs = [max((params[n] - p.detach()).abs().max().item() for n, p in ref.named_parameters()) for params in per_rank]
    return SyncCheck(diffs, world_size, num_steps)
