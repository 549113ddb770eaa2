"""Lab 09's graders: a student's ZeRO-1, run inside real ranks, and the masked references of the lab.

Code that runs inside ranks (started by :func:`gpulab.parallel.launch`, fork, so the code under
test may come from a notebook cell) cannot send evidence: each function here returns what the
ranks hold, for the test cell's checks to send. The source's solution, run the same way in the
reference run, gives the expected side; the functions next to them compute a visible test's
interactive expected value (``grading.interactive_expected``: never under the grader, where
gpulab's references are masked):

- :func:`random_partition_cases` for ``partition_params`` (gpulab's is :func:`balanced_owners`);
- :func:`run_zero1`: the student's ZeRO-1 class (``cls(params, optimizer_cls, **kwargs)`` with
  ``step()``, ``zero_grad()`` and a ``local_optimizer``) trained on every rank: each rank's
  parameters (:func:`single_process_params`), the parameters its ``local_optimizer`` holds and
  that optimizer's state bytes (:func:`reference_zero1`, gpulab's :class:`ShardedOptimizer` in
  the same ranks);
- :func:`measure_zero1_bytes`: the bytes per rank of :func:`~gpulab.parallel.sharding.runs.measure_sharding`
  for the student's class (gpulab's ``"zero1"`` strategy: :func:`reference_zero1_bytes`).

The gradient-accumulation, ZeRO-2 and FSDP2 exercises' graders are in
:mod:`gpulab.grading.lab09_accumulation`, :mod:`gpulab.grading.lab09_zero2` and
:mod:`gpulab.grading.lab09_fsdp`; their references are masked from here.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch import nn

from gpulab.models import MLP
from gpulab.parallel import allreduce_gradients, launch, rank_device
from gpulab.parallel.sharding.accumulation import accumulation_step
from gpulab.parallel.sharding.fsdp import apply_fsdp
from gpulab.parallel.sharding.runs import ShardingConfig, measure_sharding, preload_sharding, summarize_sharding
from gpulab.parallel.sharding.state_bytes import optimizer_state_bytes
from gpulab.parallel.sharding.zero1 import ShardedOptimizer, _assign, balanced_owners
from gpulab.parallel.sharding.zero2 import ZeRO2Optimizer

__all__ = [
    "REFERENCES",
    "TiedMLP",
    "random_partition_cases",
    "balanced_owners",
    "run_zero1",
    "reference_zero1",
    "single_process_params",
    "zero1_tolerance",
    "bytes_config",
    "bytes_case",
    "measure_zero1_bytes",
    "reference_zero1_bytes",
]

# gpulab's reference implementations of lab 09's exercises, masked in a graded kernel (gpulab.autograde.box.mask):
# the ZeRO-1 optimizer, its largest-first partition (and the helper both call), the ZeRO-2 optimizer
# (graded in lab09_zero2), the accumulation step, and the FSDP2 wrapping (graded in lab09_fsdp).
# The lab's demos run torch DDP, torch's ZeroRedundancyOptimizer, FSDP2 and lab 06's NaiveDDP/BucketedDDP
# (masked only while lab 06 is graded), none of which calls these.
REFERENCES: tuple = (ShardedOptimizer, balanced_owners, _assign, ZeRO2Optimizer, accumulation_step, apply_fsdp)

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


def _data(
    features: int = 8, classes: int = 8, seed: int = 1, num_samples: int = NUM_SAMPLES
) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_samples, features, generator=g), torch.randint(0, classes, (num_samples,), generator=g)


def zero1_tolerance(world_size: int) -> float:
    """How far training on ranks may drift from one process: float32 sums in another order. Mostly
    1e-7 to 3e-7 (12 seeds, gloo, 3 ranks, 3 AdamW steps), but CI once saw 4.7e-5 on 1 of 427
    elements: a gradient whose terms nearly cancel differs relatively much between the orders, and
    Adam divides it by its own tiny RMS. A wrong shard or step is off by about the learning rate
    (0.05), so 1e-4 on every backend still refuses it."""
    del world_size  # the same on gloo and NCCL
    return 1e-4


# --- exercise 1: the partition ---------------------------------------------------------------------


def random_partition_cases(rng: random.Random, n: int = 25) -> dict[str, tuple[list[torch.Tensor], int]]:
    """``n`` parameter lists (sizes with repeats, three dtypes) and world sizes drawn from ``rng``,
    keyed by a readable name: ``{name: (params, world_size)}``."""
    cases = {}
    for trial in range(n):
        params = [
            torch.zeros(
                rng.choice([1, 5, 16, 64, 64, 300]), dtype=rng.choice([torch.float32, torch.float64, torch.float16])
            )
            for _ in range(rng.randrange(1, 20))
        ]
        ws = rng.randrange(1, 7)
        sizes = [p.numel() * p.element_size() for p in params]
        cases[f"trial {trial + 1}: {len(params)} parameters of {sizes} bytes over {ws} ranks"] = (params, ws)
    return cases


# --- exercise 2: ZeRO-1 --------------------------------------------------------------------------------


@contextlib.contextmanager
def counting_built(classes: dict[str, type]) -> Iterator[Counter]:
    """Count, by name, the objects of ``classes`` built inside the block, whatever name they were
    imported under and subclasses too (each class's ``__init__`` is wrapped, in this rank's process
    only): torch's own version of what an exercise asks the student to write."""
    built: Counter[str] = Counter()
    saved = {}
    for name, cls in classes.items():
        saved[cls] = original = cls.__init__

        def counted(self: Any, *args: Any, _name: str = name, _original: Callable = original, **kwargs: Any) -> None:
            built[_name] += 1
            _original(self, *args, **kwargs)

        cls.__init__ = counted
    try:
        yield built
    finally:
        for cls, original in saved.items():
            cls.__init__ = original


def _zero1_rank(rank, world_size, zero_cls, model_name, optimizer, num_steps, seed):
    device = rank_device(rank)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data(seed=seed))  # this rank's shard
    model = _model(model_name).to(device)
    params = list(model.parameters())
    from torch.distributed.optim import ZeroRedundancyOptimizer

    # the exercise is ZeRO-1 by hand, and wrapping torch's would pass every other check
    with counting_built({"ZeroRedundancyOptimizer": ZeroRedundancyOptimizer}) as built:
        opt = zero_cls(params, opt_cls, **kwargs)
        for _ in range(num_steps):
            opt.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            allreduce_gradients(model, world_size)  # ZeRO-1 starts from DDP's averaged gradients
            opt.step()
    holder = getattr(opt, "local_optimizer", None)
    if not isinstance(holder, torch.optim.Optimizer):
        raise TypeError("your ZeRO-1 class must keep its torch optimizer in self.local_optimizer")
    index = {id(p): i for i, p in enumerate(params)}
    held = sorted(index[id(p)] for g in holder.param_groups for p in g["params"] if id(p) in index)
    return {
        "params": {n: p.detach().cpu() for n, p in model.named_parameters()},
        "local_params": held,
        "state_bytes": optimizer_state_bytes(holder),
        "torch ZeroRedundancyOptimizers built": built["ZeroRedundancyOptimizer"],
    }


def run_zero1(
    zero_cls: Callable[..., Any],
    world_size: int = 2,
    *,
    model: str = "mlp",
    optimizer: str = "adamw",
    num_steps: int = 3,
    seed: int = 1,
    timeout: float = 90,
) -> list[dict[str, Any]]:
    """Train ``model`` ("mlp", "tied" or "tiny") ``num_steps`` with ``zero_cls`` over ``optimizer``
    ("adamw" or "sgd" with momentum) on ``world_size`` ranks, each with its shard of a 24-sample
    batch drawn from ``seed``, the gradients averaged first.

    Returns:
        Per rank: ``params`` (after training), ``local_params`` (the indices, in
        ``model.parameters()`` order, of the parameters its ``local_optimizer`` holds),
        ``state_bytes`` (that optimizer's state, counted from its tensors) and
        ``"torch ZeroRedundancyOptimizers built"`` (0 for a ZeRO-1 written by hand).
    """
    return launch(
        _zero1_rank, world_size, args=(zero_cls, model, optimizer, num_steps, seed), timeout=timeout, echo=False
    )


@functools.lru_cache(maxsize=16)
def reference_zero1(
    world_size: int = 2, model: str = "mlp", optimizer: str = "adamw", num_steps: int = 3, seed: int = 1
) -> list[dict[str, Any]]:
    """:func:`run_zero1` of gpulab's :class:`ShardedOptimizer` (one launch per arguments, kept)."""
    return run_zero1(ShardedOptimizer, world_size, model=model, optimizer=optimizer, num_steps=num_steps, seed=seed)


def single_process_params(model_name: str, optimizer: str, num_steps: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """The parameters after ``num_steps`` on the whole batch in one process (what DDP must equal)."""
    model = _model(model_name)
    opt_cls, kwargs = OPTIMIZERS[optimizer]
    opt = opt_cls(model.parameters(), **kwargs)
    inputs, targets = _data(seed=seed)
    for _ in range(num_steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- bytes per rank, measured as the lab's demo measures them -------------------------------------------


def bytes_config(depth: int = 3, seed: int = 0) -> ShardingConfig:
    """The small :class:`ShardingConfig` the bytes are measured on: ``depth`` hidden layers of 64
    features (a multiple of every world size used), one AdamW step."""
    return ShardingConfig(width=64, depth=depth, batch_size=16, num_steps=1, warmup=0, seed=seed)


def bytes_case(rng: random.Random) -> tuple[int, int]:
    """``(depth, seed)`` for :func:`bytes_config`, drawn from ``rng``."""
    return rng.randint(2, 6), rng.randrange(10**6)


def measure_zero1_bytes(
    zero_cls: Callable[..., Any], world_size: int, depth: int = 3, seed: int = 0, timeout: float = 120
) -> list[dict[str, int]]:
    """Per rank, the bytes (``params``, ``grads``, ``optimizer_state``, ``num_params``) that
    :func:`measure_sharding` counts after training :func:`bytes_config` with torch DDP's
    gradients and ``zero_cls``."""
    preload_sharding()
    per_rank = launch(
        measure_sharding,
        world_size,
        args=([("yours", zero_cls)], bytes_config(depth, seed)),
        timeout=timeout,
        echo=False,
    )
    return _bytes(summarize_sharding(per_rank)["yours"])


@functools.lru_cache(maxsize=16)
def reference_zero1_bytes(world_size: int, depth: int = 3, seed: int = 0) -> list[dict[str, int]]:
    """:func:`measure_zero1_bytes` of gpulab's ZeRO-1 (its ``"zero1"`` strategy; one launch per arguments, kept)."""
    preload_sharding()
    per_rank = launch(
        measure_sharding, world_size, args=(["zero1"], bytes_config(depth, seed)), timeout=120, echo=False
    )
    return _bytes(summarize_sharding(per_rank)["zero1"])


def _bytes(summary: dict[str, Any]) -> list[dict[str, int]]:
    keep = ("params", "grads", "optimizer_state", "num_params")
    return [{k: int(b[k]) for k in keep} for b in summary["bytes"]]
