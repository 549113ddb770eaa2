"""Lab 07's graders for the ``torch.distributed.pipelining`` exercise: the student's
``torch_pipeline_step(rank, world_size, layers, boundary, inputs, targets, split_size, loss_fn,
schedule="gpipe")``, run in two gloo ranks by :func:`run_torch_pipeline`.

Code inside ranks cannot send evidence: :func:`run_torch_pipeline` returns what the ranks computed,
the whole model's loss and gradients by name, and the test cell checks it against
:func:`one_process_step` (the same micro-batches in one process, called only inside
``grading.by_reference``). :func:`own_gpipe_step` runs the student's ``pipelined_train_step`` of the
same lab on the same batch, and :func:`difference` is what the two pipelines disagree by, sent
against zeros: the torch pipeline must give what the student's own GPipe gives.
"""

from __future__ import annotations

import copy
import importlib
from typing import Any, Callable, Sequence

import torch
from torch import nn

from gpulab.grading.lab07 import named_gradients, run_with_timeout
from gpulab.parallel import launch
from gpulab.parallel.pipeline.split import split_model

__all__ = ["run_torch_pipeline", "schedule_order", "one_process_step", "own_gpipe_step", "loss_and_gradients", "difference", "zeros_like"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _named(model: nn.Module, grads: Sequence[Any]) -> dict[str, Any]:
    names = [name for name, _ in model.named_parameters()]
    return {names[i] if i < len(names) else f"extra parameter {i}": g for i, g in enumerate(grads)}


class _RowCounting:
    """``loss_fn``, noting how many rows each call gets (a rank's schedule calls it per micro-batch),
    and the order of the last stage's passes: ``F`` when a micro-batch's loss is computed (its
    forward is done), ``B`` when the backward reaches that loss."""

    def __init__(self, loss_fn: LossFn) -> None:
        self.loss_fn, self.rows, self.order = loss_fn, set(), []

    def __call__(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.rows.add(int(target.size(0)))
        self.order.append("F")
        loss = self.loss_fn(out, target)
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.register_hook(lambda grad: self.order.append("B"))
        return loss


def _rank(rank: int, world_size: int, step_fn: Callable[..., Any], *args: Any) -> tuple[Any, list[int], str]:
    *args, loss_fn, schedule = args
    counting = _RowCounting(loss_fn)
    return step_fn(rank, world_size, *args, counting, schedule), sorted(counting.rows), "".join(counting.order)


def schedule_order(schedule: str, micro_batches: int) -> str:
    """The last stage's passes under torch's schedule: GPipe runs every forward, then every backward;
    1F1B runs each micro-batch's backward as soon as its forward is done (the last stage has no warm-up)."""
    return "F" * micro_batches + "B" * micro_batches if schedule == "gpipe" else "FB" * micro_batches


def run_torch_pipeline(step_fn: Callable[..., Any], model: nn.Module, boundary: int, inputs: torch.Tensor,
                       targets: torch.Tensor, split_size: int, loss_fn: LossFn, schedule: str = "gpipe",
                       timeout: float = 60) -> dict[str, Any]:
    """``step_fn`` on 2 gloo ranks, each given a fresh copy of ``model.layers()`` (no gradients).

    Returns:
        ``{"loss": the last rank's loss, "loss on rank 0": rank 0's (None), "parameters": every
        gradient under the whole model's parameter names, "micro-batch rows": the row counts the
        loss function saw (one value, ``split_size``, for a pipeline over equal micro-batches), "last
        stage's order": its forward and backward passes, one letter per micro-batch, as
        :func:`schedule_order` says the schedule runs them}``.
    """
    # imported here, once: a forked rank inherits it instead of paying ~2 s for it in every rank of every launch
    importlib.import_module("torch.distributed.pipelining")
    runs = launch(_rank, 2, args=(step_fn, copy.deepcopy(model).layers(), boundary, inputs, targets, split_size,
                                  loss_fn, schedule), backend="gloo", timeout=timeout, echo=False)
    for rank, (run, _, _) in enumerate(runs):
        if not isinstance(run, dict) or not {"loss", "gradients"} <= set(run) \
                or not isinstance(run["gradients"], (list, tuple)):
            raise TypeError(f"torch_pipeline_step must return a dict {{'loss': ..., 'gradients': [...]}} on every "
                            f"rank; rank {rank} returned {type(run).__name__}")
    (first, _, _), (last, rows, order) = runs
    # the step's own passes: torch's first step may run one extra forward and backward of its own first
    # (seen with torch 2.13: "FB" before a 4-micro-batch GPipe's "FFFFBBBB")
    steps = 2 * (inputs.size(0) // split_size) if isinstance(split_size, int) and split_size > 0 else len(order)
    order = order[-steps:] if steps else order
    loss = last["loss"]
    return {"loss": float(loss) if isinstance(loss, (int, float, torch.Tensor)) else loss,
            "loss on rank 0": first["loss"],
            "parameters": _named(model, [*first["gradients"], *last["gradients"]]), "micro-batch rows": rows,
            "last stage's order": order}


def one_process_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, split_size: int,
                     loss_fn: LossFn) -> dict[str, Any]:
    """The same micro-batches in one process, on a copy of ``model``: the mean of their losses, and
    the gradients of that mean (what a pipeline over equal micro-batches must give)."""
    model = copy.deepcopy(model)
    losses = [loss_fn(model(x), y) for x, y in zip(inputs.split(split_size), targets.split(split_size))]
    loss = torch.stack(losses).mean()
    loss.backward()
    return {"loss": loss.item(), "loss on rank 0": None,
            "parameters": {name: p.grad for name, p in model.named_parameters()}, "micro-batch rows": [split_size]}


def loss_and_gradients(result: dict[str, Any]) -> dict[str, Any]:
    """A result's loss on each rank and its gradients (without the rows, which are checked apart)."""
    return {k: result[k] for k in ("loss", "loss on rank 0", "parameters")}


def own_gpipe_step(pipelined_train_step: Callable[..., Any], model: nn.Module, boundary: int, devices: Sequence[Any],
                   inputs: torch.Tensor, targets: torch.Tensor, split_size: int, loss_fn: LossFn) -> dict[str, Any]:
    """The student's thread pipeline (``pipelined_train_step``) on a copy of ``model`` cut at
    ``boundary`` over ``devices``: its loss and the gradients it leaves, by name."""
    split = split_model(copy.deepcopy(model), devices, boundaries=[boundary])
    loss = run_with_timeout(pipelined_train_step, list(split.stages), split.devices, inputs, targets, split_size,
                            loss_fn, what="pipelined_train_step", grad=True)
    return {"loss": loss, "loss on rank 0": None,
            "parameters": {k: None if g is None else g.cpu() for k, g in named_gradients(model, split).items()}}


def difference(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """``a - b``, loss and gradient by gradient; a missing or misshapen gradient stays in as a
    description, so that it fails against :func:`zeros_like`."""
    def minus(x: Any, y: Any) -> Any:
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape:
            return x.detach().cpu() - y.detach().cpu()
        return f"{_what(x)} against {_what(y)}"

    loss = a["loss"] - b["loss"] if all(isinstance(v["loss"], float) for v in (a, b)) else f"{a['loss']!r} against {b['loss']!r}"
    keys = list(dict.fromkeys([*a["parameters"], *b["parameters"]]))
    return {"loss": loss, "parameters": {k: minus(a["parameters"].get(k), b["parameters"].get(k)) for k in keys}}


def _what(x: Any) -> str:
    return f"a tensor of shape {tuple(x.shape)}" if isinstance(x, torch.Tensor) else repr(x)


def zeros_like(result: dict[str, Any]) -> dict[str, Any]:
    """The :func:`difference` of a result with itself: what two pipelines that agree differ by."""
    return {"loss": 0.0, "parameters": {k: torch.zeros_like(g) for k, g in result["parameters"].items()}}
