"""Run a piece of DDP code inside real ranks and compare it with a reference (lab 06's graders).

Each check launches ranks with :func:`gpulab.parallel.ddp.launch` (fork, so the function under test
may come from a notebook cell), trains a few steps, and returns what a grader compares:

- :func:`compare_with_single_process`: a gradient-averaging function ``sync_fn(model, world_size)``
  against single-process SGD on the full batch (DDP's definition of correct);
- :func:`compare_amp_steps`: a mixed-precision step under torch DDP against :func:`amp_step`;
- :func:`check_ddp_wrapping`: a ``wrap_fn(model, device, example_inputs)`` on a model with an unused
  branch and on one without, against single-process training;
- the student's DDP classes (per parameter, bucketed): equality, overlap and speed, in
  :mod:`gpulab.grading.lab06_ddp` (re-exported here).

``forbidden`` (gpulab's reference functions) is checked *inside* the ranks with
:func:`gpulab.grading.check_not_calling`: the work happens there, not in the caller.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab import grading
from gpulab.grading.lab06_ddp import (
    BUCKETED_CASES,
    PER_PARAMETER_CASES,
    check_bucketing_speedup,
    check_ddp_class,
    measure_bucketing_speedup,
    trace_overlap,
)
from gpulab.models import MLP
from gpulab.parallel.ddp.allreduce import (
    NaiveDDP,
    OverlappedDDP,
    allreduce_gradients,
    unused_parameters,
)
from gpulab.parallel.ddp.amp import amp_step, make_grad_scaler
from gpulab.parallel.ddp.bucketed import BucketedDDP, _Bucket, bucket_assignment
from gpulab.parallel.ddp.examples import (
    BranchyNet,
    example_data,
    sgd_steps,
)
from gpulab.parallel.ddp.launch import launch
from gpulab.parallel.ddp.sampler import DistributedSampler
from gpulab.parallel.ddp.startup import rank_device
from gpulab.parallel.ddp.wrapper import DataParallelWrapper, at_end_of_backward

__all__ = ["SyncCheck", "compare_with_single_process", "compare_amp_steps", "check_ddp_wrapping", "REFERENCES",
           "PER_PARAMETER_CASES", "BUCKETED_CASES", "check_ddp_class", "trace_overlap", "measure_bucketing_speedup",
           "check_bucketing_speedup"]

def _functions(*refs: Any) -> tuple:
    """The plain functions behind ``refs``: a function itself; a class's own methods (and its gpulab
    bases'), each unwrapped. Listing a class would also list what its MRO brings (``typing.Generic``'s
    methods) and what decorators put there (``contextmanager``'s ``helper``, shared by every context
    manager in torch), which torch itself calls: a correct student would then be caught."""
    out = []
    for ref in refs:
        if not isinstance(ref, type):
            out.append(inspect.unwrap(ref))
            continue
        for klass in ref.__mro__:
            if not klass.__module__.startswith("gpulab"):
                continue
            for member in vars(klass).values():
                member = getattr(member, "__func__", getattr(member, "fget", member))  # static/class methods, properties
                member = inspect.unwrap(member) if callable(member) else member
                if hasattr(member, "__code__") and member not in out:
                    out.append(member)
    return tuple(out)


# gpulab's reference implementations of lab 06's exercises (the ``forbidden`` of check_not_calling), as
# functions: the DDP wrappers' methods, their base class's and helpers too, so that subclassing or calling
# into them is caught
REFERENCES: tuple = _functions(DistributedSampler, allreduce_gradients, NaiveDDP, OverlappedDDP, BucketedDDP, _Bucket,
                               DataParallelWrapper, at_end_of_backward, bucket_assignment, unused_parameters, amp_step)

def _model(sizes: Sequence[int]) -> nn.Module:
    torch.manual_seed(0)
    return MLP(sizes)


def _call(fn: Callable, *args: Any, forbidden: Sequence[Any] = ()) -> Any:
    return grading.check_not_calling(fn, *args, forbidden=forbidden) if forbidden else fn(*args)


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


def _sync_rank(rank, world_size, sync_fn, sizes, num_steps, lr, forbidden):
    device = rank_device(rank)
    model = _model(sizes).to(device)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data(sizes))  # this rank's shard
    sgd_steps(model, inputs, targets, num_steps, lr, lambda: _call(sync_fn, model, world_size, forbidden=forbidden))
    return {n: p.detach().cpu() for n, p in model.named_parameters()}


def compare_with_single_process(sync_fn: Callable[[nn.Module, int], Any], world_size: int = 2, *,
                                sizes: Sequence[int] = (8, 32, 32, 4), num_steps: int = 3, lr: float = 0.2,
                                forbidden: Sequence[Any] = (), timeout: float = 60) -> SyncCheck:
    """Train ``num_steps`` of momentum SGD on ``world_size`` ranks, ``sync_fn`` after each backward.

    Each rank gets ``1/world_size`` of a 24-sample batch; the single-process run gets all of it.
    With a correct gradient average, every rank ends with the single-process parameters.
    """
    per_rank = launch(_sync_rank, world_size, args=(sync_fn, tuple(sizes), num_steps, lr, tuple(forbidden)),
                      timeout=timeout, echo=False)
    ref = _model(sizes)
    sgd_steps(ref, *example_data(sizes), num_steps, lr)
    diffs = [max((params[n] - p.detach()).abs().max().item() for n, p in ref.named_parameters()) for params in per_rank]
    return SyncCheck(diffs, world_size, num_steps)


def _amp_rank(rank, world_size, step_fn, num_steps, forbidden):
    device = rank_device(rank)
    sizes = (16, 64, 64, 4)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data(sizes))
    out = {}
    for name, fn in (("yours", step_fn), ("reference", amp_step)):
        model = _model(sizes).to(device)
        seen: list[torch.dtype] = []
        model.net[-1].register_forward_hook(lambda mod, inp, o: seen.append(o.dtype))  # the classifier's output
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        scaler = make_grad_scaler(device)
        losses = [float(_call(fn, ddp, inputs, targets, nn.functional.cross_entropy, opt, scaler, device,
                              forbidden=forbidden if name == "yours" else ()))
                  for _ in range(num_steps)]
        out[name] = {"losses": losses, "forward_dtypes": [str(d) for d in seen],
                     "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                     "params": {n: p.detach().cpu() for n, p in model.named_parameters()}}
    return out


def _preload_torch_ddp() -> None:
    import torch._dynamo  # noqa: F401 - torch DDP imports it lazily; once here instead of in every forked rank


def compare_amp_steps(step_fn: Callable, world_size: int = 2, *, num_steps: int = 4, forbidden: Sequence[Any] = (),
                      timeout: float = 60) -> list[dict[str, Any]]:
    """Per rank: ``{"yours": ..., "reference": ...}`` with losses, forward dtypes, parameter dtypes and
    parameters after ``num_steps`` of ``step_fn`` (same signature as :func:`amp_step`) under torch DDP."""
    _preload_torch_ddp()
    return launch(_amp_rank, world_size, args=(step_fn, num_steps, tuple(forbidden)), timeout=timeout, echo=False)


def _wrap_rank(rank, world_size, wrap_fn, use_aux, num_steps, forbidden):
    device = rank_device(rank)
    model = BranchyNet(use_aux).to(device)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data((8, 4)))
    ddp = _call(wrap_fn, model, device, inputs, forbidden=forbidden)
    sgd_steps(ddp, inputs, targets, num_steps, lr=0.2)
    return {"is_ddp": isinstance(ddp, nn.parallel.DistributedDataParallel),
            "find_unused": bool(getattr(ddp, "find_unused_parameters", False)),
            "params": {n: p.detach().cpu() for n, p in model.named_parameters()}}


def check_ddp_wrapping(wrap_fn: Callable, world_size: int = 2, *, num_steps: int = 3, forbidden: Sequence[Any] = (),
                       timeout: float = 60) -> dict[str, dict[str, Any]]:
    """Train BranchyNet with and without its aux head, each wrapped by ``wrap_fn`` on every rank.

    Returns ``{"unused_branch": r, "all_used": r}`` with, from rank 0: ``is_ddp``, ``find_unused``
    (the flag the wrapper chose) and ``max_abs_diff`` against single-process training.
    """
    _preload_torch_ddp()
    out = {}
    for key, use_aux in (("unused_branch", False), ("all_used", True)):
        per_rank = launch(_wrap_rank, world_size, args=(wrap_fn, use_aux, num_steps, tuple(forbidden)),
                          timeout=timeout, echo=False)
        ref = BranchyNet(use_aux)
        sgd_steps(ref, *example_data((8, 4)), num_steps, lr=0.2)
        diff = max((r["params"][n] - p.detach()).abs().max().item() for r in per_rank for n, p in ref.named_parameters())
        out[key] = {"is_ddp": per_rank[0]["is_ddp"], "find_unused": per_rank[0]["find_unused"], "max_abs_diff": diff}
    return out
