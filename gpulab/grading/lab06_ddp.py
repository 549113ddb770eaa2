"""Lab 06's graders for the student's DDP classes: the per-parameter one, then the bucketed one.

The student writes ``MyOverlappedDDP(module)`` (one asynchronous all-reduce per gradient, launched
from a hook) and ``MyBucketedDDP(module, bucket_size_mb)`` (the hooks fill flat buckets; a full
bucket's all-reduce starts at once). Both have ``finish()``, called after backward and before the
optimizer step. Three things are graded, each from evidence the grader collects itself:

- :func:`check_ddp_class`: after k steps of momentum SGD with weight decay on 2 (or 3) ranks,
  every parameter equals single-process training on the whole batch: an MLP at several bucket
  sizes (one bucket per parameter, a few, one), a weight shared by two modules (one hook call,
  after both contributions), and an unused parameter (its ``.grad`` must stay None, as in one process and
  in torch DDP with ``find_unused_parameters=True``; weight decay would move it otherwise);
- :func:`trace_overlap`: the order of "all-reduce launched" and "gradient ready" in one step, seen
  by the grader's own gradient hooks (registered before the student's class is built) and by a
  dispatch mode that sees every collective reaching torch's dispatcher
  (:mod:`gpulab.parallel.ddp.trace`); nothing the student's object says about itself is used
  (gloo CPU ranks on every machine);
- :func:`check_bucketing_speedup`: the bucketed class against the student's own per-parameter
  class, timed side by side in one launch of gloo CPU ranks (the same on every machine), with
  the same-run fallback of :mod:`gpulab.grading.speedup`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab import grading
from gpulab.grading.speedup import SpeedupMeasurement, SpeedupResult, check_speedup
from gpulab.models import MLP
from gpulab.parallel.ddp.allreduce import OverlappedDDP
from gpulab.parallel.ddp.bucketed import BucketedDDP, bucket_assignment
from gpulab.parallel.ddp.examples import BranchyNet, TiedEmbeddingNet, example_data, token_data
from gpulab.parallel.ddp.launch import launch
from gpulab.parallel.ddp.startup import rank_device
from gpulab.parallel.ddp.timing import StepTimingConfig, deep_mlp, summarize_step_times, time_sync_strategies
from gpulab.parallel.ddp.trace import SyncEvent, launched_before_last_gradient, trace_step

__all__ = ["PER_PARAMETER_CASES", "BUCKETED_CASES", "ClassCheck", "check_ddp_class", "OverlapTrace", "trace_overlap",
           "SPEED_CFG", "measure_bucketing_speedup", "check_bucketing_speedup"]

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


def _model(name: str) -> nn.Module:
    if name == "mlp":
        torch.manual_seed(0)
        return MLP([8, 32, 32, 32, 4])
    if name == "tied":
        return TiedEmbeddingNet()
    if name == "unused":
        return BranchyNet(use_aux=False)
    raise ValueError(f"unknown model {name!r}; use 'mlp', 'tied' or 'unused'")


def _data(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return token_data(16) if name == "tied" else example_data((8, 4))


def _call(fn: Callable, *args: Any, forbidden: Sequence[Any] = ()) -> Any:
    return grading.check_not_calling(fn, *args, forbidden=forbidden) if forbidden else fn(*args)


def _build(make: Callable, module: nn.Module, bucket_size_mb: float | None) -> nn.Module:
    wrapped = make(module) if bucket_size_mb is None else make(module, bucket_size_mb)
    if isinstance(wrapped, nn.parallel.DistributedDataParallel):
        raise TypeError("the exercise is to write the class yourself, not to return torch's DistributedDataParallel")
    if not callable(getattr(wrapped, "finish", None)):
        raise TypeError(f"{type(wrapped).__name__} has no finish() method: it is called after backward, before the "
                        "optimizer step, and returns once every gradient is averaged")
    return wrapped


def _train_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> None:
    nn.functional.cross_entropy(model(inputs), targets).backward()
    model.finish()


def _single_process(model_name: str, num_steps: int) -> nn.Module:
    model = _model(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    inputs, targets = _data(model_name)
    for _ in range(num_steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        opt.step()
    return model


def _class_rank(rank, world_size, make, cases, num_steps, perturb, forbidden):
    device = rank_device(rank)
    out = {}
    for label, model_name, mb in cases:
        module = _model(model_name).to(device)
        if perturb and rank:  # replicas that start different: the class must copy rank 0's parameters
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(0.5 * rank)
        inputs, targets = (t.chunk(world_size)[rank].to(device) for t in _data(model_name))  # this rank's shard
        model = _call(_build, make, module, mb, forbidden=forbidden)
        opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        for _ in range(num_steps):
            opt.zero_grad(set_to_none=True)
            _call(_train_step, model, inputs, targets, forbidden=forbidden)
            opt.step()
        out[label] = {"params": {n: p.detach().cpu() for n, p in module.named_parameters()},
                      "grad_none": [n for n, p in module.named_parameters() if p.grad is None]}
    return out


@dataclass
class ClassCheck:
    """Per case: the largest |parameter - single-process parameter| over all ranks, and the
    parameters whose ``.grad`` was None after the last step (yours on each rank, and one process's)."""

    max_abs_diff: dict[str, float]
    grad_none: dict[str, list[list[str]]]
    expected_none: dict[str, list[str]]
    world_size: int

    def worst_case(self) -> tuple[str, float]:
        """The case with the largest difference."""
        label = max(self.max_abs_diff, key=self.max_abs_diff.__getitem__)
        return label, self.max_abs_diff[label]

    def __str__(self) -> str:
        return "; ".join(f"{label}: {diff:.2g}" for label, diff in self.max_abs_diff.items())


def check_ddp_class(make: Callable, cases: Sequence[tuple[str, str, float | None]], world_size: int = 2, *,
                    num_steps: int = 3, perturb: bool = False, forbidden: Sequence[Any] = (),
                    timeout: float = 90) -> ClassCheck:
    """Train every case on ``world_size`` ranks with ``make(module[, bucket_size_mb])`` (one launch).

    Args:
        make: the student's class.
        cases: ``(label, model, bucket_size_mb)`` triples (:data:`PER_PARAMETER_CASES`, :data:`BUCKETED_CASES`).
        world_size: ranks; each gets ``1/world_size`` of a 24-sample batch.
        num_steps: optimizer steps.
        perturb: start every rank but 0 from different parameters (the class must broadcast rank 0's).
        forbidden: gpulab's references, checked inside the ranks (:func:`grading.check_not_calling`).
        timeout: seconds for the launch.
    """
    per_rank = launch(_class_rank, world_size, args=(make, tuple(cases), num_steps, perturb, tuple(forbidden)),
                      timeout=timeout, echo=False)
    diffs, none, expected = {}, {}, {}
    for label, model_name, _ in cases:
        ref = _single_process(model_name, num_steps)
        diffs[label] = max((r[label]["params"][n] - p.detach()).abs().max().item()
                           for r in per_rank for n, p in ref.named_parameters())
        none[label] = [r[label]["grad_none"] for r in per_rank]
        expected[label] = [n for n, p in ref.named_parameters() if p.grad is None]
    return ClassCheck(diffs, none, expected, world_size)


# --- overlap: what happened in which order, seen from the grader's own hooks -------------------

OVERLAP_CFG = StepTimingConfig(width=64, depth=6, batch_size=16)  # 14 tensors of up to 16 KiB
OVERLAP_BUCKET_MB = 0.04  # about two layers a bucket: the first bucket fills long before backward ends


def _overlap_rank(rank, world_size, make, bucket_size_mb, cfg):
    device = rank_device(rank)
    g = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    inputs = torch.randn(cfg.batch_size // world_size, cfg.width, generator=g).to(device)
    targets = torch.randint(0, 10, (cfg.batch_size // world_size,), generator=g).to(device)
    module = deep_mlp(cfg.width, cfg.depth, seed=cfg.seed).to(device)
    return trace_step(module, lambda m: _build(make, m, bucket_size_mb), inputs, targets)


@dataclass
class OverlapTrace:
    """The events of one traced step on each rank, and what they show."""

    events: list[list[SyncEvent]]
    num_params: int
    min_elements: int  # the classifier's weight: a real first bucket carries at least this much
    plan_buckets: int | None  # buckets in gpulab's plan for this bucket size (None: per parameter)
    early: list[tuple[int, int]] = field(default_factory=list)  # per rank: (calls, elements) before the last gradient

    def __post_init__(self) -> None:
        self.early = [launched_before_last_gradient(ev) for ev in self.events]

    @property
    def overlapped(self) -> bool:
        """Every rank started all-reducing at least one real bucket before its last gradient was ready."""
        return all(elements >= self.min_elements for _, elements in self.early)

    def all_reduces(self, rank: int = 0) -> list[SyncEvent]:
        """The all-reduces of the traced step on ``rank``."""
        return [e for e in self.events[rank] if e.kind == "all_reduce"]

    def __str__(self) -> str:
        calls = [len(self.all_reduces(r)) for r in range(len(self.events))]
        return (f"all-reduces per step {calls} (per rank); started before the last gradient was ready: "
                + ", ".join(f"rank {r}: {c} call(s), {e} elements" for r, (c, e) in enumerate(self.early)))


def trace_overlap(make: Callable, bucket_size_mb: float | None = OVERLAP_BUCKET_MB, world_size: int = 2, *,
                  timeout: float = 60) -> OverlapTrace:
    """Trace one step of ``make(module[, bucket_size_mb])`` on a 7-layer MLP, on every rank (one launch).

    The ranks are gloo CPU processes on every machine: the order of the events is a property of the
    student's code, and this is the set-up where the recorder is verified to see every collective.
    """
    per_rank = launch(_overlap_rank, world_size, args=(make, bucket_size_mb, OVERLAP_CFG), backend="gloo",
                      timeout=timeout, echo=False)
    params = list(deep_mlp(OVERLAP_CFG.width, OVERLAP_CFG.depth).parameters())
    plan = None if bucket_size_mb is None else len(bucket_assignment(params, bucket_size_mb))
    return OverlapTrace(per_rank, len(params), params[-2].numel(), plan)


# --- speed: bucketed vs per parameter, side by side ----------------------------------------------

# 33 Linear layers of 128 features (66 gradient tensors, 2.1 MB; 3 buckets of 1 MB): small layers, so that
# the per-call cost bucketing removes is most of the difference. Measured on 2 loaded cores (6 runs each):
# your-style classes 2.05-4.5x here, 1.45-2.2x on lab 06's 256-wide plot model; the check asks for 1.3x.
SPEED_CFG = StepTimingConfig(width=128, depth=32, batch_size=64, num_steps=12, warmup=2, bucket_size_mb=1.0)


def measure_bucketing_speedup(per_parameter: Callable, bucketed: Callable, world_size: int = 2, *,
                              cfg: StepTimingConfig = SPEED_CFG, timeout: float = 120) -> SpeedupMeasurement:
    """Step times of your two classes and of gpulab's two, interleaved in one launch of gloo CPU ranks.

    Returns:
        ``yours``: your per-parameter step time / your bucketed step time; ``reference``: the same
        for gpulab's OverlappedDDP / BucketedDDP; ``cores``: the cores the ranks had together while
        computing alone (``local``, no synchronisation).
    """
    mb = cfg.bucket_size_mb
    strategies = [("per-parameter (yours)", "wrap", lambda m: _build(per_parameter, m, None)),
                  ("bucketed (yours)", "wrap", lambda m: _build(bucketed, m, mb)),
                  ("per-parameter (gpulab)", "wrap", _gpulab("overlapped", mb)),
                  ("bucketed (gpulab)", "wrap", _gpulab("bucketed", mb)), "local"]
    per_rank = launch(_timing_rank, world_size, args=(strategies, cfg), backend="gloo", timeout=timeout, echo=False)
    s = summarize_step_times(per_rank)
    cores = sum(sum(r["cpu:local"]) / sum(r["local"]) for r in per_rank)
    detail = "gloo CPU ranks: " + ", ".join(f"{n} {1e3 * t:.1f} ms" for n, t in s.items())
    return SpeedupMeasurement(s["per-parameter (yours)"] / s["bucketed (yours)"],
                              s["per-parameter (gpulab)"] / s["bucketed (gpulab)"], cores, detail, s)


def _gpulab(kind: str, mb: float) -> Callable[[nn.Module], nn.Module]:
    return (lambda m: OverlappedDDP(m)) if kind == "overlapped" else (lambda m: BucketedDDP(m, bucket_size_mb=mb))


def _timing_rank(rank, world_size, strategies, cfg):
    return time_sync_strategies(rank, world_size, strategies, cfg, cpu=True)


def check_bucketing_speedup(per_parameter: Callable, bucketed: Callable, world_size: int = 2, *,
                            at_least: float = 1.3, relative: float = 0.7, attempts: int = 3) -> SpeedupResult:
    """:func:`measure_bucketing_speedup` under the rule of :func:`gpulab.grading.speedup.check_speedup`.

    Raises:
        GradingError: when no measurement passed (the message gives every figure).
    """
    return check_speedup(lambda: measure_bucketing_speedup(per_parameter, bucketed, world_size),
                         at_least=at_least, relative=relative, attempts=attempts,
                         what="your per-parameter step time / your bucketed step time",
                         hint="a bucket's all-reduce should carry many gradients: check that MyBucketedDDP launches "
                              "one all-reduce per bucket (not per parameter), and keep the Python work in the hook small")
