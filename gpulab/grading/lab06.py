"""Lab 06's graders: run the student's code (in the kernel, or inside real ranks) and return plain
values; the test cells check them against values computed only in the reference kernel.

Code that runs inside ranks (started by :func:`gpulab.parallel.launcher.launch`, fork, so the function
under test may come from a notebook cell) cannot send evidence: each function here returns what
the ranks hold, and the expected value comes from the function next to it, called only inside
``grading.by_reference``:

- the sampler and the per-rank loader: :func:`sampler_cases` / :func:`sampler_shards` (torch's
  ``DistributedSampler`` gives the expected shards), :func:`loader_cases` / :func:`loader_facts`
  and :func:`expected_loader_facts`;
- the student's DDP classes: :func:`run_ddp_class` against :func:`single_process_run`,
  :func:`trace_overlap` against :func:`overlap_plan`, and :func:`bucketing_run` for the timed
  check (:mod:`gpulab.grading.lab06_ddp`, re-exported here);
- a mixed-precision step under torch DDP: :func:`run_amp_steps` (the student's step) against
  :func:`amp_reference` (gpulab's :func:`amp_step` in the same ranks);
- the unused-parameter probe and the DDP wrapper: :func:`gated_models` against
  :func:`unused_parameters`; :func:`run_ddp_wrapping` against :func:`single_process_wrapping`;
- the α–β cost model and the rebuilt buckets: cases and measured inputs from
  :mod:`gpulab.grading.lab06_cost` (re-exported here), against :mod:`gpulab.parallel.measure.ring_cost`
  and :mod:`gpulab.parallel.ddp.rebuild`;
- the ``mp.spawn`` script, run as a program: :func:`run_scripts` against
  :func:`single_process_training` (:mod:`gpulab.grading.lab06_script`).
"""

from __future__ import annotations

import functools
import itertools
import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.grading.lab06_cost import (
    CANDIDATES_MB,
    alpha_beta_cases,
    best_size_cases,
    measured_alpha_beta,
    prediction_cases,
    rebuild_cases,
    rebuild_models,
    refusing_torch_bucket_rule,
    timed_model,
)
from gpulab.grading.lab06_ddp import (
    BUCKETED_CASES,
    OVERLAP_BUCKET_MB,
    OVERLAP_CFG,
    PER_PARAMETER_CASES,
    SPEED_CFG,
    bucketing_run,
    class_tolerance,
    overlap_case,
    overlap_plan,
    preload_torch_ddp,
    run_ddp_class,
    single_process_run,
    trace_overlap,
)
from gpulab.grading.lab06_script import SCRIPT, ScriptError, require_script, run_scripts, single_process_training
from gpulab.models import MLP
from gpulab.parallel.amp import amp_step, make_grad_scaler
from gpulab.parallel.ddp.allreduce import OverlappedDDP, unused_parameters
from gpulab.parallel.ddp.bucketed import BucketedDDP, _Bucket, bucket_assignment
from gpulab.parallel.ddp.rebuild import head_first_net, ready_order, rebuilt_buckets, torch_ddp_buckets
from gpulab.parallel.launcher.launch import launch
from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.measure.ring_cost import best_bucket_size, fit_alpha_beta, predict_sync_seconds
from gpulab.parallel.workloads.ddp_examples import BranchyNet, example_data, sgd_steps

__all__ = ["REFERENCES", "sampler_cases", "sampler_shards", "loader_cases", "loader_facts", "torch_rank_loader",
           "expected_loader_facts",
           "PER_PARAMETER_CASES", "BUCKETED_CASES", "run_ddp_class", "single_process_run", "class_tolerance",
           "OVERLAP_CFG", "OVERLAP_BUCKET_MB", "overlap_case", "trace_overlap", "overlap_plan", "SPEED_CFG",
           "bucketing_run", "run_amp_steps", "amp_reference", "Gated", "gated_models", "run_ddp_wrapping",
           "single_process_wrapping", "SyncCheck", "compare_with_single_process",
           "OverlappedDDP", "BucketedDDP", "bucket_assignment", "unused_parameters", "amp_step",
           "CANDIDATES_MB", "alpha_beta_cases", "prediction_cases", "best_size_cases", "measured_alpha_beta", "timed_model",
           "fit_alpha_beta", "predict_sync_seconds", "best_bucket_size", "rebuild_cases", "rebuild_models",
           "ready_order", "rebuilt_buckets", "torch_ddp_buckets", "head_first_net", "refusing_torch_bucket_rule",
           "SCRIPT", "ScriptError", "require_script", "run_scripts", "single_process_training"]

# gpulab's reference implementations of lab 06's exercises, masked in a graded kernel (gpulab.autograde.box.mask):
# the per-parameter and bucketed DDP classes (and the bucket helper a student could build on), the bucket
# plan, the mixed-precision step, and the unused-parameter probe. Left out, with reasons:
# - gpulab's DistributedSampler: torch's own DistributedSampler gives the same shards and cannot be
#   masked, so masking gpulab's copy would hide nothing, and it would break distributed_accuracy and
#   UnpaddedDistributedSampler, which the lab's padding demo runs in the graded kernel;
# - NaiveDDP, allreduce_gradients, DataParallelWrapper, at_end_of_backward: no exercise's answer (NaiveDDP
#   all-reduces after backward, which the overlap checks fail), and the timeline and step-time demos
#   train NaiveDDP in the graded kernel.
# The α–β fit and prediction, the rebuilt buckets and the ready-order probe, and the single-process run the
# spawn script is compared with (a script could save its result instead of training) are masked too.
REFERENCES: tuple = (OverlappedDDP, BucketedDDP, _Bucket, bucket_assignment, amp_step, unused_parameters,
                     fit_alpha_beta, predict_sync_seconds, best_bucket_size, ready_order, rebuilt_buckets,
                     single_process_training)


# --- exercise 1: the sampler -----------------------------------------------------------------------

def sampler_cases(rng: random.Random, random_sizes: int = 4) -> dict[str, dict[str, Any]]:
    """Sampler settings: the edge sizes (no samples, fewer samples than ranks, uneven tails) and
    ``random_sizes`` more, each with every shuffle/drop_last pair and a rank, seed and epoch drawn
    from ``rng``. Keyed by a readable name."""
    sizes = [(0, 2), (1, 4), (2, 5), (5, 8), (13, 4), (64, 6), (100, 7)]
    sizes += [(rng.randrange(3, 200), rng.randrange(2, 9)) for _ in range(random_sizes)]
    cases = {}
    for n, replicas in sizes:
        for shuffle, drop_last in itertools.product((False, True), repeat=2):
            case = dict(n=n, num_replicas=replicas, rank=rng.randrange(replicas), shuffle=shuffle,
                        seed=rng.randrange(10**6), drop_last=drop_last, epoch=rng.randrange(20))
            cases[", ".join(f"{k}={v}" for k, v in case.items())] = case
    return cases


def sampler_shards(sampler_cls: Callable[..., Any], cases: dict[str, dict[str, Any]]) -> dict[str, tuple[list[int], int]]:
    """Per case, ``(indices, len())`` of ``sampler_cls(range(n), num_replicas, rank, shuffle=...,
    seed=..., drop_last=...)`` after ``set_epoch(epoch)``; with torch's ``DistributedSampler``,
    the expected shards."""
    out = {}
    for name, c in cases.items():
        s = sampler_cls(range(c["n"]), c["num_replicas"], c["rank"], shuffle=c["shuffle"], seed=c["seed"],
                        drop_last=c["drop_last"])
        s.set_epoch(c["epoch"])
        out[name] = ([int(i) for i in s], int(len(s)))
    return out


# --- exercise 2: the per-rank loader ----------------------------------------------------------------

def loader_cases(rng: random.Random, n: int = 6) -> dict[str, dict[str, int]]:
    """``make_rank_loader`` arguments drawn from ``rng``: dataset size, world size, rank, a global
    batch divisible by the world size, total workers and seed."""
    cases = {}
    for _ in range(n):
        ws = rng.randint(1, 6)
        case = dict(num_samples=rng.randrange(5, 90), rank=0, world_size=ws, global_batch_size=ws * rng.randint(1, 6),
                    total_workers=rng.randint(0, 8), seed=rng.randrange(10**5))
        case["rank"] = rng.randrange(ws)
        cases[", ".join(f"{k}={v}" for k, v in case.items())] = case
    return cases


def _facts(loader: Any) -> dict[str, Any]:
    return {"batch_size": loader.batch_size, "num_workers": loader.num_workers,
            "indices": [int(i) for i in loader.sampler], "batches": len(loader)}


def loader_facts(make_rank_loader: Callable[..., Any], cases: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """Per case: the loader's batch size, workers, its sampler's indices and its number of batches."""
    return {name: _facts(make_rank_loader(torch.arange(c["num_samples"]), c["rank"], c["world_size"],
                                          c["global_batch_size"], c["total_workers"], c["seed"]))
            for name, c in cases.items()}


def torch_rank_loader(dataset: Any, rank: int, world_size: int, global_batch_size: int = 8, total_workers: int = 2,
                      seed: int = 0) -> torch.utils.data.DataLoader:
    """The loader exercise 2 describes, built on torch's DistributedSampler: the notebook's demo uses it
    until ``make_rank_loader`` is answered. Not masked: torch's sampler cannot be masked either, and an
    answer that returned it would fail the check that the loader's sampler is the student's."""
    if global_batch_size % world_size:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by world_size={world_size}")
    sampler = torch.utils.data.DistributedSampler(dataset, world_size, rank, shuffle=True, seed=seed)
    return torch.utils.data.DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler,
                                       num_workers=total_workers // world_size)


def expected_loader_facts(cases: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """:func:`loader_facts` of the loader the exercise describes (:func:`torch_rank_loader`)."""
    return {name: _facts(torch_rank_loader(torch.arange(c["num_samples"]), c["rank"], c["world_size"],
                                           c["global_batch_size"], c["total_workers"], c["seed"]))
            for name, c in cases.items()}


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

