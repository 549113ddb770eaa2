"""Lab 07's two-stage pipeline on PyTorch's own tool, ``torch.distributed.pipelining``: one
``PipelineStage`` per rank (``layers[:boundary]`` on rank 0, the rest on rank 1), driven by
``ScheduleGPipe`` or ``Schedule1F1B``, in a process group of two ranks (gloo on the CPU).

    from gpulab.parallel import launch
    runs = launch(torch_pipeline_step, 2, args=(model.layers(), 5, x, y, 4, F.cross_entropy), backend="gloo")
    runs[1]["loss"], runs[0]["gradients"] + runs[1]["gradients"]   # the whole model's, in parameters() order

The schedule divides each gradient by the number of micro-batches (``scale_grads``): with equal
micro-batches and a loss that is a mean over its rows, loss and gradients are the whole batch's.

Run: python -m gpulab.parallel.pipeline.torch_stages   (the differences to one process, both schedules)
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
from torch import nn

__all__ = ["torch_pipeline_step", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b")


def torch_pipeline_step(rank: int, world_size: int, layers: Sequence[nn.Module], boundary: int, inputs: torch.Tensor,
                        targets: torch.Tensor, split_size: int, loss_fn: Callable[..., torch.Tensor],
                        schedule: str = "gpipe") -> dict[str, Any]:
    """One training step (no optimizer) of this rank's stage, inside a launched 2-rank process group.

    Returns:
        ``{"loss": the batch's loss (mean of the micro-batches' losses) on the last rank, None on
        rank 0, "gradients": [.grad of this stage's parameters, in order]}``.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from gpulab.parallel.launcher import rank_device

    if world_size != 2:
        raise ValueError(f"a two-stage pipeline needs 2 ranks, got world_size={world_size}")
    if not 0 < boundary < len(layers):
        raise ValueError(f"boundary must be between 1 and {len(layers) - 1}, got {boundary}")
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1 \
            or inputs.size(0) % split_size:
        raise ValueError(f"split_size must be a positive int dividing the batch ({inputs.size(0)} rows), "
                         f"got {split_size!r}: the schedule averages equal micro-batches")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    device = rank_device(rank)
    module = nn.Sequential(*(layers[:boundary] if rank == 0 else layers[boundary:])).to(device)
    stage = PipelineStage(module, rank, world_size, device)
    cls = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    runner = cls(stage, n_microbatches=inputs.size(0) // split_size, loss_fn=loss_fn)
    loss = None
    if rank == 0:
        runner.step(inputs.to(device))
    else:
        losses: list[torch.Tensor] = []
        runner.step(target=targets.to(device), losses=losses)
        loss = torch.stack([v.detach() for v in losses]).mean().item()
    return {"loss": loss, "gradients": [None if p.grad is None else p.grad.detach().cpu() for p in module.parameters()]}


def _main() -> None:  # pragma: no cover - a demo, run by hand
    from gpulab.models import resnet
    from gpulab.parallel import launch
    from gpulab.parallel.pipeline.norms import batchnorm_to_groupnorm

    torch.manual_seed(0)
    model = batchnorm_to_groupnorm(resnet(18, num_classes=10, width=4))
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    whole = copy.deepcopy(model)  # one process, the whole batch (the ranks get the untouched layers)
    loss = nn.functional.cross_entropy(whole(x), y)
    loss.backward()
    for schedule in SCHEDULES:
        runs = launch(torch_pipeline_step, 2, args=(model.layers(), 5, x, y, 2, nn.functional.cross_entropy, schedule),
                      backend="gloo", echo=False)
        grads = runs[0]["gradients"] + runs[1]["gradients"]
        worst = max((g - p.grad).abs().max().item() for g, p in zip(grads, whole.parameters()))
        print(f"{schedule}: loss {runs[1]['loss']:.6f} (one process {loss.item():.6f}), "
              f"largest gradient difference {worst:.2e}")


if __name__ == "__main__":
    _main()
