"""Lab 06's graders for the student's DDP classes: the per-parameter one, then the bucketed one.

The student writes ``MyOverlappedDDP(module)`` (one asynchronous all-reduce per gradient, launched
from a hook) and ``MyBucketedDDP(module, bucket_size_mb)`` (the hooks fill flat buckets; a full
bucket's all-reduce starts at once). Both have ``finish()``, called after backward and before the
optimizer step. The code under test runs inside gloo (or nccl) ranks, which cannot send evidence,
so every function here returns plain values to the kernel, for the test cell to send; the grader
compares them with the reference run's (the solution's), or applies a rule:

- :func:`run_ddp_class` (the student's values): after k steps of momentum SGD with weight decay
  on 2 (or 3) ranks, every rank's parameters and which ``.grad`` stayed None; cases: an MLP at
  several bucket sizes, a weight shared by two modules, an unused parameter (its ``.grad`` must
  stay None, as in one process and in torch DDP with ``find_unused_parameters=True``).
  :func:`single_process_run` is one process on the whole batch (a visible test's interactive
  expected value).
- :func:`trace_overlap` (the student's values): per rank, the all-reduce calls of one step and how
  many calls and elements started before backward's last gradient was ready, seen by the grader's
  own gradient hooks (registered before the student's class is built) and by a dispatch mode that
  sees every collective (:mod:`gpulab.parallel.measure.trace`). The bounds are the contract's, of
  plain inputs: the classifier's weight (``10 * width`` elements) must be on its way before the last
  gradient, and the calls per step are judged by the rule ``lab06.calls_per_step`` from the traced
  model's :func:`gradient_bytes` (:func:`overlap_plan`, gpulab's plan, is for the unit tests).
- :func:`bucketing_run`: one launch of 2 gloo ranks training a few steps of the timed model, for the
  notebook's timing demo (real computing on the CPU: shown, never graded), returning losses that
  depend on every step's synchronisation.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.models import MLP
from gpulab.parallel.ddp.bucketed import bucket_assignment
from gpulab.parallel.launcher.launch import launch
from gpulab.parallel.launcher.startup import rank_device
from gpulab.parallel.measure.timing import StepTimingConfig, deep_mlp
from gpulab.parallel.measure.trace import launched_before_last_gradient, trace_step
from gpulab.parallel.workloads.ddp_examples import BranchyNet, TiedEmbeddingNet, example_data, token_data

__all__ = ["PER_PARAMETER_CASES", "BUCKETED_CASES", "run_ddp_class", "single_process_run", "class_tolerance",
           "OVERLAP_CFG", "OVERLAP_BUCKET_MB", "overlap_case", "trace_overlap", "overlap_plan", "gradient_bytes",
           "SPEED_CFG", "bucketing_run", "preload_torch_ddp"]

# (label, model, bucket_size_mb): None builds the class without a bucket size (the per-parameter one)
PER_PARAMETER_CASES = (("MLP", "mlp", None), ("tied weight", "tied", None), ("unused parameter", "unused", None))
BUCKETED_CASES = (
    ("MLP, one bucket per parameter", "mlp", 1e-6),  # every tensor is bigger than a bucket
    ("MLP, 3 buckets", "mlp", 0.005),
    ("MLP, one bucket", "mlp", 100.0),
    ("tied weight, 2 buckets", "tied", 0.001),
    ("unused parameter, 3 buckets", "unused", 0.001),
)
LR, MOMENTUM, WEIGHT_DECAY = 0.2, 0.9, 0.01  # weight decay moves a parameter whose .grad is zeros, not None
DATA_SEED = 1  # the visible tests' data; hidden tests draw theirs from the grading run's seed


def preload_torch_ddp() -> None:
    """Import what forked ranks would each import on first use (torch DDP and the optimizers import
    ``torch._dynamo``: about 3 s per rank on 2 cores), once, here."""
    import torch._dynamo  # noqa: F401


def class_tolerance(world_size: int) -> float:
    """How far DDP training may drift from one process: float32 sums in another order on the CPU
    (gloo), GPU kernels with nccl."""
    from gpulab.parallel.launcher.startup import resolve_backend

    return 1e-5 if resolve_backend("auto", world_size) == "gloo" else 1e-4


def _model(name: str) -> nn.Module:
    if name == "mlp":
        torch.manual_seed(0)
        return MLP([8, 32, 32, 32, 4])
    if name == "tied":
        return TiedEmbeddingNet()
    if name == "unused":
        return BranchyNet(use_aux=False)
    raise ValueError(f"unknown model {name!r}; use 'mlp', 'tied' or 'unused'")


def _data(name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    return token_data(16, seed) if name == "tied" else example_data((8, 4), seed)


def _build(make: Callable, module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    wrapped = make(module) if bucket_size_mb is None else make(module, bucket_size_mb)
    if isinstance(wrapped, nn.parallel.DistributedDataParallel):
        raise TypeError("the exercise is to write the class yourself, not to return torch's DistributedDataParallel")
    if not callable(getattr(wrapped, "finish", None)):
        raise TypeError(f"{type(wrapped).__name__} has no finish() method: it is called after backward, before the "
                        "optimizer step, and returns once every gradient is averaged")
    return wrapped


def single_process_run(model_name: str, world_size: int, num_steps: int = 3, seed: int = DATA_SEED) -> dict[str, Any]:
    """What every rank must hold after DDP training: one process's run on the whole batch.

    Returns:
        ``{"params": [{name: tensor}] * world_size, "grad_none": [[names]] * world_size}``, the
        shape :func:`run_ddp_class` gives per case.
    """
    model = _model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    inputs, targets = _data(model_name, seed)
    for _ in range(num_steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    none = [n for n, p in model.named_parameters() if p.grad is None]
    return {"params": [params] * world_size, "grad_none": [none] * world_size}


def _class_rank(rank, world_size, make, cases, num_steps, perturb, seed):
    device = rank_device(rank)
    out = {}
    for label, model_name, mb in cases:
        module = _model(model_name).to(device)
        if perturb and rank:  # replicas that start different: the class must copy rank 0's parameters
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(0.5 * rank)
        inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data(model_name, seed))  # this rank's shard
        model = _build(make, module, mb)
        opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        for _ in range(num_steps):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(inputs), targets).backward()
            model.finish()
            opt.step()
        out[label] = {"params": {n: p.detach().cpu() for n, p in module.named_parameters()},
                      "grad_none": [n for n, p in module.named_parameters() if p.grad is None]}
    return out


def run_ddp_class(make: Callable, cases: Sequence[tuple[str, str, float | None]], world_size: int = 2, *,
                  num_steps: int = 3, perturb: bool = False, seed: int = DATA_SEED,
                  timeout: float = 90) -> dict[str, dict[str, list]]:
    """Train every case on ``world_size`` ranks with ``make(module[, bucket_size_mb])`` (one launch).

    Args:
        make: the student's class.
        cases: ``(label, model, bucket_size_mb)`` triples (:data:`PER_PARAMETER_CASES`, :data:`BUCKETED_CASES`).
        world_size: ranks; each gets ``1/world_size`` of a 24-sample batch.
        num_steps: optimizer steps.
        perturb: start every rank but 0 from different parameters (the class must broadcast rank 0's).
        seed: the data's seed.
        timeout: seconds for the launch.

    Returns:
        Per case label: ``{"params": [each rank's {name: tensor}], "grad_none": [each rank's names
        of the parameters whose .grad is None after the last step]}``; compare with
        :func:`single_process_run`.
    """
    per_rank = launch(_class_rank, world_size, args=(make, tuple(cases), num_steps, perturb, seed),
                      timeout=timeout, echo=False)
    return {label: {"params": [r[label]["params"] for r in per_rank], "grad_none": [r[label]["grad_none"] for r in per_rank]}
            for label, _, _ in cases}


# --- overlap: what happened in which order, seen from the grader's own hooks -------------------

OVERLAP_CFG = StepTimingConfig(width=64, depth=6, batch_size=16)  # 14 tensors of up to 16 KiB
OVERLAP_BUCKET_MB = 0.04  # about two layers a bucket: the first bucket fills long before backward ends


def overlap_case(rng: random.Random, layers_per_bucket: float = 2.2) -> tuple[StepTimingConfig, float]:
    """A traced model drawn from ``rng`` (width, depth, data seed) and a bucket size holding about
    ``layers_per_bucket`` of its hidden layers."""
    width, depth = rng.choice([48, 64, 80, 96]), rng.randint(5, 8)
    layer_mb = (width * width + width) * 4 / 2**20
    return replace(OVERLAP_CFG, width=width, depth=depth, seed=rng.randrange(10**6)), layers_per_bucket * layer_mb


def _overlap_rank(rank, world_size, make, bucket_size_mb, cfg):
    device = rank_device(rank)
    g = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    inputs = torch.randn(cfg.batch_size // world_size, cfg.width, generator=g).to(device)
    targets = torch.randint(0, 10, (cfg.batch_size // world_size,), generator=g).to(device)
    module = deep_mlp(cfg.width, cfg.depth, seed=cfg.seed).to(device)
    events = trace_step(module, lambda m: _build(make, m, bucket_size_mb), inputs, targets)
    early_calls, early_elements = launched_before_last_gradient(events)
    return {"calls": sum(e.kind == "all_reduce" for e in events), "early_calls": early_calls,
            "early_elements": early_elements}


def trace_overlap(make: Callable, bucket_size_mb: float | None = OVERLAP_BUCKET_MB, world_size: int = 2, *,
                  cfg: StepTimingConfig = OVERLAP_CFG, timeout: float = 60) -> list[dict[str, int]]:
    """Trace one step of ``make(module[, bucket_size_mb])`` on a deep MLP, on every rank (one launch).

    The ranks are gloo CPU processes on every machine: the order of the events is a property of the
    student's code, and this is the set-up where the recorder is verified to see every collective.

    Returns:
        Per rank: ``calls`` (all-reduces in the traced step), ``early_calls`` and
        ``early_elements`` (the all-reduces, and the elements they carry, that started before the
        last gradient was ready).
    """
    return launch(_overlap_rank, world_size, args=(make, bucket_size_mb, cfg), backend="gloo", timeout=timeout,
                  echo=False)


def gradient_bytes(cfg: StepTimingConfig = OVERLAP_CFG) -> list[int]:
    """The bytes of each gradient of :func:`trace_overlap`'s model for ``cfg``, in registration order:
    the plain inputs the rule ``lab06.calls_per_step`` plans the contract's buckets from."""
    return [p.numel() * p.element_size() for p in deep_mlp(cfg.width, cfg.depth).parameters()]


def overlap_plan(bucket_size_mb: float | None = OVERLAP_BUCKET_MB, cfg: StepTimingConfig = OVERLAP_CFG) -> dict[str, Any]:
    """gpulab's plan for a traced step of :func:`trace_overlap`, for the unit tests of the bounds
    the test cells state (no test cell calls it): ``num_params`` (gradient tensors), ``buckets``
    (gpulab's plan for ``bucket_size_mb``; None for per parameter) and ``min_elements`` (the
    classifier's weight: a real bucket started early carries at least that much)."""
    params = list(deep_mlp(cfg.width, cfg.depth).parameters())
    plan = None if bucket_size_mb is None else len(bucket_assignment(params, bucket_size_mb))
    return {"num_params": len(params), "buckets": plan, "min_elements": params[-2].numel()}


# --- speed: one run of the timed model, for the notebook's timing demo ----------------------------------------------------------

# 33 Linear layers of 128 features (66 gradient tensors, 2.1 MB; 3 buckets of 1 MB): small layers, so that
# the per-call cost bucketing removes is most of the difference. One run, launch included, on 2 loaded
# cores: about 0.8 s per parameter and 0.3 s bucketed (your-style classes), shown in the notebook, not graded.
SPEED_CFG = StepTimingConfig(width=128, depth=32, batch_size=64, num_steps=12, warmup=2, bucket_size_mb=1.0)


def _speed_rank(rank, world_size, make, bucket_size_mb, seed, cfg):
    device = rank_device(rank)
    g = torch.Generator().manual_seed(seed)
    inputs = torch.randn(cfg.batch_size, cfg.width, generator=g)
    targets = torch.randint(0, 10, (cfg.batch_size,), generator=g)
    mine = [t.chunk(world_size)[rank].to(device) for t in (inputs, targets)]  # this rank's shard
    module = deep_mlp(cfg.width, cfg.depth, seed=seed).to(device)
    model = _build(make, module, bucket_size_mb)
    opt = torch.optim.SGD(module.parameters(), lr=0.05)
    losses = []
    for _ in range(cfg.warmup + cfg.num_steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(mine[0]), mine[1])
        loss.backward()
        model.finish()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():  # the whole batch: equal on every rank only if every step was averaged
        probe = nn.functional.cross_entropy(module(inputs.to(device)), targets.to(device)).item()
    return losses, probe


def bucketing_run(make: Callable, seed: int, bucket_size_mb: float | None = None, world_size: int = 2, *,
                  cfg: StepTimingConfig = SPEED_CFG, timeout: float = 120) -> list[float]:
    """One timed run: launch ``world_size`` gloo CPU ranks (the same on every machine) that
    train ``cfg.warmup + cfg.num_steps`` steps of a deep MLP, seeded by ``seed``, wrapped by
    ``make(module[, bucket_size_mb])``.

    Returns:
        Rank 0's loss at every step, then every rank's loss on the whole batch after the last step
        (equal on all ranks only if each step's gradients were averaged).
    """
    preload_torch_ddp()
    per_rank = launch(_speed_rank, world_size, args=(make, bucket_size_mb, seed, cfg), backend="gloo",
                      timeout=timeout, echo=False)
    return [*per_rank[0][0], *(probe for _, probe in per_rank)]
