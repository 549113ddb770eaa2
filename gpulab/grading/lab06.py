"""Lab 06's graders: run the student's code (in the kernel, or inside real ranks) and return plain
values for the test cells to send; the grader compares them with the reference run's values of the
same checks (the solution's), or applies a rule (:mod:`gpulab.verdict.lab06`).

Code that runs inside ranks (started by :func:`gpulab.parallel.launcher.launch`, fork, so the function
under test may come from a notebook cell) cannot send evidence: each function here returns what
the ranks hold. A visible test may name gpulab's function next to it as its interactive expected
value (``grading.interactive_expected``); under the grader nothing here computes an expected value.

- the sampler and the per-rank loader: :func:`sampler_cases` / :func:`sampler_shards` (torch's
  ``DistributedSampler`` gives the same shards), :func:`loader_cases` / :func:`loader_facts`
  (:func:`expected_loader_facts`: the loader the exercise describes, for the unit tests);
- the student's DDP classes (:mod:`gpulab.grading.lab06_ddp`, re-exported here): :func:`run_ddp_class`
  (:func:`single_process_run` is one process's run), :func:`trace_overlap` (what the grader's own
  hooks saw) with :func:`gradient_bytes` (the traced model's sizes, for the rule ``lab06.calls_per_step``),
  and :func:`bucketing_run` for the timing demo;
- torch DDP with torch.amp, and unused parameters (:mod:`gpulab.grading.lab06_torch`, re-exported);
- the α–β cost model and the rebuilt buckets: cases and measured inputs from
  :mod:`gpulab.grading.lab06_cost` (re-exported here);
- the ``mp.spawn`` script, run as a program: :func:`run_scripts` (:mod:`gpulab.grading.lab06_script`).
"""

from __future__ import annotations

import itertools
import random
from typing import Any, Callable

import torch

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
    timed_params,
)
from gpulab.grading.lab06_ddp import (
    BUCKETED_CASES,
    OVERLAP_BUCKET_MB,
    OVERLAP_CFG,
    PER_PARAMETER_CASES,
    SPEED_CFG,
    bucketing_run,
    class_tolerance,
    gradient_bytes,
    overlap_case,
    overlap_plan,
    preload_torch_ddp,
    run_ddp_class,
    single_process_run,
    trace_overlap,
)
from gpulab.grading.lab06_script import SCRIPT, ScriptError, require_script, run_scripts, single_process_training
from gpulab.grading.lab06_torch import (
    Gated,
    SyncCheck,
    amp_reference,
    compare_with_single_process,
    gated_models,
    run_amp_steps,
    run_ddp_wrapping,
    single_process_wrapping,
)
from gpulab.parallel.amp import amp_step
from gpulab.parallel.ddp.allreduce import OverlappedDDP, unused_parameters
from gpulab.parallel.ddp.bucketed import BucketedDDP, _Bucket, bucket_assignment
from gpulab.parallel.ddp.rebuild import head_first_net, ready_order, rebuilt_buckets, torch_ddp_buckets
from gpulab.parallel.measure.ring_cost import best_bucket_size, fit_alpha_beta, predict_sync_seconds

__all__ = ["REFERENCES", "sampler_cases", "sampler_shards", "loader_cases", "loader_facts", "torch_rank_loader",
           "expected_loader_facts",
           "PER_PARAMETER_CASES", "BUCKETED_CASES", "run_ddp_class", "single_process_run", "class_tolerance",
           "OVERLAP_CFG", "OVERLAP_BUCKET_MB", "overlap_case", "trace_overlap", "overlap_plan", "gradient_bytes",
           "SPEED_CFG", "bucketing_run", "preload_torch_ddp", "run_amp_steps", "amp_reference", "Gated", "gated_models",
           "run_ddp_wrapping", "single_process_wrapping", "SyncCheck", "compare_with_single_process",
           "OverlappedDDP", "BucketedDDP", "bucket_assignment", "unused_parameters", "amp_step",
           "CANDIDATES_MB", "alpha_beta_cases", "prediction_cases", "best_size_cases", "measured_alpha_beta", "timed_model",
           "timed_params", "fit_alpha_beta", "predict_sync_seconds", "best_bucket_size", "rebuild_cases", "rebuild_models",
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
