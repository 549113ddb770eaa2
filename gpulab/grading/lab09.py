"""Lab 09's graders: a student's ZeRO-1 and gradient accumulation, run inside real ranks.

Each check launches ranks with :func:`gpulab.parallel.launch` (fork, so the code under test may
come from a notebook cell) and returns what a test cell compares:

- :func:`check_zero1`: the student's ZeRO-1 class (``cls(params, optimizer_cls, **kwargs)`` with
  ``step()``, ``zero_grad()`` and a ``local_optimizer``) and gpulab's :class:`ShardedOptimizer`,
  side by side in the same ranks, against single-process training on the full batch: parameters,
  and the optimizer-state bytes each rank holds;
- :func:`run_accumulation`: named accumulation steps ``fn(model, optimizer, micro_batches, loss_fn)``
  on :class:`NaiveDDP` or :class:`BucketedDDP`: all-reduce calls per step (counted), step times,
  and the parameters, against one process taking the same steps on the whole batch.

``forbidden`` (usually :data:`REFERENCES`) is checked *inside* the ranks with
:func:`gpulab.grading.check_not_calling`: the student's code runs there, not in the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab import grading
from gpulab.models import MLP
from gpulab.parallel import BucketedDDP, NaiveDDP, allreduce_gradients, launch, rank_device
from gpulab.parallel.ddp.accumulation import accumulation_step, count_collectives
from gpulab.parallel.ddp.sharded import ShardedOptimizer, balanced_owners
from gpulab.parallel.ddp.state_bytes import optimizer_state_bytes

__all__ = ["REFERENCES", "TiedMLP", "Zero1Check", "check_zero1", "run_accumulation", "single_process_params"]

REFERENCES = (ShardedOptimizer, balanced_owners, accumulation_step)

NUM_SAMPLES = 24  # divisible by 1, 2, 3, 4, 6, 8 ranks and by 2, 3, 4 micro-batches per rank of 2 ranks
OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], dict[str, Any]]] = {
    "adamw": (torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}),
    "sgd": (torch.optim.SGD, {"lr": 0.2, "momentum": 0.9}),
}


class TiedMLP(nn.Module):
    """An MLP whose output layer reuses the input layer's weight (transposed), as language models
    tie their embedding and output: one parameter, two uses, one gradient."""

    def __init__(self, features: int = 8, hidden: int = 24) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(features, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out_bias = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mid(torch.tanh(self.inp(x))))
        return h @ self.inp.weight + self.out_bias  # (B, features): the tied weight again


def _model(name: str) -> nn.Module:
    if name == "tied":
        return TiedMLP()
    if name == "tiny":  # 2 parameter tensors: more ranks than tensors leaves a rank with nothing
        torch.manual_seed(0)
        return MLP([8, 8])
    torch.manual_seed(0)
    return MLP([8, 32, 24, 8])  # uneven tensor sizes: 256, 32, 768, 24, 192, 8 elements


def _data(features: int = 8, classes: int = 8, seed: int = 1, num_samples: int = NUM_SAMPLES) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_samples, features, generator=g), torch.randint(0, classes, (num_samples,), generator=g)


def _call(fn: Callable, *args: Any, forbidden: Sequence[Any] = (), **kwargs: Any) -> Any:
    return grading.check_not_calling(fn, *args, forbidden=forbidden, **kwargs) if forbidden else fn(*args, **kwargs)


def single_process_params(model_name: str, optimizer: str, num_steps: int) -> dict[str, torch.Tensor]:
    """The parameters after ``num_steps`` on the whole batch in one process (what DDP must equal)."""
    model = _model(model_name)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    opt = opt_cls(model.parameters(), **kwargs)
    inputs, targets = _data()
    for _ in range(num_steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@dataclass
class Zero1Check:
    """Per rank: the student's and the reference's results after training."""

    max_abs_diff: list[float]  # |yours - single process|, largest over parameters
    state_bytes: list[int]  # your local_optimizer's state bytes on each rank
    reference_state_bytes: list[int]  # ShardedOptimizer's on each rank
    full_state_bytes: int  # the state of the one-process optimizer (every rank's under DDP)

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff)


def _zero1_rank(rank, world_size, zero_cls, model_name, optimizer, num_steps, forbidden):
    device = rank_device(rank)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data())  # this rank's shard
    out = {}
    for who, make in (("yours", zero_cls), ("reference", ShardedOptimizer)):
        model = _model(model_name).to(device)
        banned = forbidden if who == "yours" else ()
        opt = _call(make, list(model.parameters()), opt_cls, forbidden=banned, **kwargs)
        for _ in range(num_steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            allreduce_gradients(model, world_size)  # ZeRO-1 starts from DDP's averaged gradients
            _call(opt.step, forbidden=banned)
        holder = getattr(opt, "local_optimizer", None) if who == "yours" else opt
        if not isinstance(holder, torch.optim.Optimizer):
            raise TypeError("your ZeRO-1 class must keep its torch optimizer in self.local_optimizer")
        out[who] = {"params": {n: p.detach().cpu() for n, p in model.named_parameters()},
                    "state_bytes": optimizer_state_bytes(holder)}
    return out


def check_zero1(zero_cls: Callable[..., Any], world_size: int = 2, *, model: str = "mlp", optimizer: str = "adamw",
                num_steps: int = 3, forbidden: Sequence[Any] = (), timeout: float = 90) -> Zero1Check:
    """Train ``model`` ("mlp", "tied" or "tiny") ``num_steps`` with ``zero_cls`` over ``optimizer``
    ("adamw" or "sgd" with momentum) on ``world_size`` ranks, each with its shard of a 24-sample
    batch; compare with one process on all 24 samples and with :class:`ShardedOptimizer`."""
    per_rank = launch(_zero1_rank, world_size, args=(zero_cls, model, optimizer, num_steps, tuple(forbidden)),
                      timeout=timeout, echo=False)
    ref = single_process_params(model, optimizer, num_steps)
    diffs = [max((r["yours"]["params"][n] - p).abs().max().item() for n, p in ref.items()) for r in per_rank]
    full = _model(model)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    one = opt_cls(full.parameters(), **kwargs)
    nn.functional.cross_entropy(full(_data()[0]), _data()[1]).backward()
    one.step()
    return Zero1Check(diffs, [r["yours"]["state_bytes"] for r in per_rank],
                      [r["reference"]["state_bytes"] for r in per_rank], optimizer_state_bytes(one))


def _accumulation_rank(rank, world_size, step_fns, wrapper, micro_batches, num_steps, warmup, sizes, num_samples,
                       forbidden):
    device = rank_device(rank)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data(sizes[0], sizes[-1], num_samples=num_samples))
    micro = list(zip(inputs.chunk(micro_batches), targets.chunk(micro_batches)))  # k micro-batches
    runs = []
    for name, fn in step_fns:
        torch.manual_seed(0)
        module = MLP(sizes).to(device)
        model = NaiveDDP(module) if wrapper == "naive" else BucketedDDP(module, bucket_size_mb=sum(
            p.numel() * p.element_size() for p in module.parameters()) / 3 / 2**20)  # about 3 buckets
        per_sync = len(model.buckets) if wrapper == "bucketed" else len(list(module.parameters()))
        opt = torch.optim.SGD(module.parameters(), lr=0.2, momentum=0.9)
        runs.append({"name": name, "fn": fn, "model": model, "opt": opt, "per_sync": per_sync, "calls": 0, "times": [],
                     "banned": forbidden if name != "reference" else ()})
    for step in range(warmup + num_steps):
        for run in runs:  # interleaved, so machine load hits every variant alike
            torch.distributed.barrier()
            t0 = time.perf_counter()
            with count_collectives() as calls:
                _call(run["fn"], run["model"], run["opt"], micro, nn.functional.cross_entropy, forbidden=run["banned"])
            if step >= warmup:  # the first steps set up gloo's buffers: neither timed nor counted
                run["times"].append(time.perf_counter() - t0)
                run["calls"] += calls["all_reduce"]
    return {run["name"]: {"all_reduce_per_step": run["calls"] / num_steps, "per_sync": run["per_sync"],
                          "step_s": run["times"],
                          "params": {n: p.detach().cpu() for n, p in run["model"].module.named_parameters()}}
            for run in runs}


def run_accumulation(step_fns: Sequence[tuple[str, Callable]], world_size: int = 2, *, wrapper: str = "naive",
                     micro_batches: int = 3, num_steps: int = 2, warmup: int = 0, sizes: Sequence[int] = (8, 32, 32, 8),
                     num_samples: int = NUM_SAMPLES, forbidden: Sequence[Any] = (),
                     timeout: float = 90) -> dict[str, dict[str, Any]]:
    """Run each named accumulation step ``num_steps`` times on ``world_size`` ranks (one launch).

    Each rank splits its half (third...) of a ``num_samples`` batch into ``micro_batches``; the
    variants take their steps interleaved. The name
    ``"reference"`` runs without the ``forbidden`` check. ``warmup`` steps come first, neither timed
    nor counted (one process takes them too).

    Returns:
        Per name: ``all_reduce_per_step`` (calls, counted), ``per_sync`` (calls one full
        synchronisation makes), ``step_s`` (the slower rank's seconds per step), ``max_abs_diff``
        (worst rank vs one process stepping on the whole batch) and ``rank_spread`` (the largest
        difference between two ranks' parameters).
    """
    if wrapper not in ("naive", "bucketed"):
        raise ValueError(f"wrapper must be 'naive' or 'bucketed', got {wrapper!r}")
    if num_samples % (world_size * micro_batches):
        raise ValueError(f"num_samples={num_samples} must be divisible by world_size x micro_batches = "
                         f"{world_size * micro_batches}, so every micro-batch has the same size")
    per_rank = launch(_accumulation_rank, world_size, args=(list(step_fns), wrapper, micro_batches, num_steps, warmup,
                                                           tuple(sizes), num_samples, tuple(forbidden)),
                      timeout=timeout, echo=False)
    torch.manual_seed(0)
    ref = MLP(sizes)
    opt = torch.optim.SGD(ref.parameters(), lr=0.2, momentum=0.9)
    inputs, targets = _data(sizes[0], sizes[-1], num_samples=num_samples)
    for _ in range(warmup + num_steps):
        nn.functional.cross_entropy(ref(inputs), targets).backward()
        opt.step()
        opt.zero_grad()
    out = {}
    for name, _ in step_fns:
        runs = [r[name] for r in per_rank]
        out[name] = {
            "all_reduce_per_step": runs[0]["all_reduce_per_step"], "per_sync": runs[0]["per_sync"],
            "step_s": [max(ts) for ts in zip(*(r["step_s"] for r in runs))],
            "max_abs_diff": max((r["params"][n] - p.detach()).abs().max().item() for r in runs for n, p in ref.named_parameters()),
            "rank_spread": max((r["params"][n] - runs[0]["params"][n]).abs().max().item() for r in runs for n in runs[0]["params"]),
        }
    return out
