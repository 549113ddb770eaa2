"""Lab 08's graders: the references masked while the out-of-memory lab is graded, and the seeded
cases its tests run the student's functions on.

Each case runs the function it is given (the student's in the graded kernel, the source's solution
in the reference run, which gives the expected side) on a model and batches drawn from a seed, and
returns plain values for the test cell's checks to send: results, parameters, dtypes, what the loop
did at each loss call, bytes live. Nothing here decides pass or fail. The memory figures
(:func:`step_peak`, ``LeakFinder``) are measured in the kernel by gpulab's instruments; the tests
pair each with checks of these values, and send a peak with its float32 baseline for the grader to
divide (``bounds.ratio``, ``lab08.peak_share`` in :mod:`gpulab.verdict.lab08`).

Two parts live in modules of their own and are re-exported here, for the test cells:
:mod:`~gpulab.grading.lab08_reads` (the count of host reads, the syncs of lab 01, a training loop
makes) and :mod:`~gpulab.grading.lab08_savings` (exercise 4's workloads and cases), and
:mod:`~gpulab.grading.lab08_split` (exercise 3's net, budgets and cases).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import default_device
from gpulab.grading.lab08_reads import count_host_reads
from gpulab.grading.lab08_savings import (
    checkpoint_case,
    fp32_direction,
    plain_case,
    recomputed,
    savings_step,
    step_peak,
    workload,
)
from gpulab.grading.lab08_split import (
    SplitPastOneSample,
    reference_split,
    split_batch,
    split_budget,
    split_case,
    split_net,
    types_of,
)
from gpulab.grading.numerics import exact_float32
from gpulab.memory.fixes import retry
from gpulab.memory.fixes.loops import evaluate, train_epoch
from gpulab.memory.fixes.retry import step_or_split
from gpulab.memory.fixes.savings import (
    bf16_step,
    checkpointed_forward,
    checkpointed_step,
    fp32_step,
    peak_memory,
    segment_sizes,
)
from gpulab.models import SmallCNN

__all__ = [
    "REFERENCES",
    "count_host_reads",
    "cnn",
    "cnn_batches",
    "Recorder",
    "epoch_case",
    "counted_epoch",
    "eval_case",
    "no_grad_peak",
    "split_net",
    "split_batch",
    "split_budget",
    "split_case",
    "SplitPastOneSample",
    "reference_split",
    "workload",
    "step_peak",
    "savings_step",
    "fp32_direction",
    "checkpoint_case",
    "plain_case",
    "recomputed",
    "flatten_features",
    "train_epoch",
    "evaluate",
    "step_or_split",
    "bf16_step",
    "checkpointed_forward",
    "fp32_step",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the loops (exercises 1-2); the step that splits the batch on out-of-memory,
# with its attempt and its gradient accumulation (exercise 3: the demo after it says so while
# grading); and the bf16 and checkpointed steps with the split (exercise 4). fp32_step stays: it
# is the float32 baseline the demos and the tests measure, not an answer. find_max_batch_size
# stays too: section 8 only demonstrates it (lab 05 grades the search).
REFERENCES: tuple = (
    train_epoch,
    evaluate,
    step_or_split,
    retry._attempt,
    retry._accumulate,
    bf16_step,
    checkpointed_forward,
    checkpointed_step,
    segment_sizes,
)


# ---- exercises 1-2: the loops ---------------------------------------------------------------------


def cnn(seed: int) -> SmallCNN:
    """The lab's SmallCNN (16, 32 channels), its weights drawn from ``seed``, on the default device."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = SmallCNN(channels=(16, 32))
    return model.to(default_device())


def cnn_batches(seed: int, steps: int, batch: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of ``batch`` RGB 32x32 images and labels (10 classes), drawn from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    device = default_device()
    return [
        (torch.randn(batch, 3, 32, 32, generator=g).to(device), torch.randint(0, 10, (batch,), generator=g).to(device))
        for _ in range(steps)
    ]


class Recorder:
    """A loss function that notes, at every call, whether autograd records (``torch.is_grad_enabled()``)
    and whether the model is in training mode: what a loop did, step by step."""

    def __init__(self, model: nn.Module, loss_fn: Callable[..., torch.Tensor] = F.cross_entropy) -> None:
        self.model, self.loss_fn = model, loss_fn
        self.calls: list[tuple[bool, bool]] = []

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls.append((torch.is_grad_enabled(), self.model.training))
        return self.loss_fn(outputs, targets)


def epoch_case(train_epoch: Callable[..., Any], seed: int, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """One epoch of ``train_epoch`` on a seeded SmallCNN and ``steps`` seeded batches (SGD, momentum 0.9).

    Returns:
        ``(numbers, facts)``: ``{"result": what it returned, "parameters": the weights after}`` to
        compare within tolerance, and ``{"types": the result's types, "loss calls": (grad enabled,
        training) at each loss call}`` to compare exactly.
    """
    model = cnn(seed)
    loss_fn = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with exact_float32():  # on a GPU: no TF32, deterministic cuDNN, so two runs agree to float32's precision
        result = train_epoch(model, opt, loss_fn, cnn_batches(seed + 1, steps))
    numbers = {"result": result, "parameters": [p.detach().clone() for p in model.parameters()]}
    return numbers, {"types": types_of(result), "loss calls": loss_fn.calls}


def counted_epoch(train_epoch: Callable[..., Any], seed: int, steps: int) -> tuple[Any, int]:
    """``(the result of one epoch as in epoch_case, the host reads it made)`` (see :func:`count_host_reads`)."""
    model = cnn(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # SGD itself reads nothing back
    return count_host_reads(train_epoch, model, opt, nn.CrossEntropyLoss(), cnn_batches(seed + 1, steps))


def eval_case(evaluate: Callable[..., Any], seed: int, steps: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``evaluate`` on a seeded SmallCNN in training mode (``steps`` seeded batches), then in eval mode.

    Returns:
        ``(numbers, facts)``: ``{"result": ...}``, and the result's types, the training flag after
        each call, and (grad enabled, training) at each loss call.
    """
    model = cnn(seed)
    data = cnn_batches(seed + 1, steps)
    loss_fn = Recorder(model)
    model.train()
    with exact_float32():
        result = evaluate(model, loss_fn, data)
        after_train = model.training
        model.eval()
        evaluate(model, loss_fn, data[:1])
    facts = {
        "types": types_of(result),
        "training after evaluate (was training)": after_train,
        "training after evaluate (was in eval mode)": model.training,
        "loss calls": loss_fn.calls,
    }
    return {"result": result}, facts


def no_grad_peak(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> int:
    """Peak bytes of one evaluation batch under ``torch.no_grad()`` (section 6's ``without``)."""

    def one() -> float:
        was = model.training
        model.eval()
        with torch.no_grad():
            loss = F.cross_entropy(model(batch[0]), batch[1]).item()
        model.train(was)
        return loss

    return peak_memory(one, track=model)


# ---- exercise 5: shapes -------------------------------------------------------------------------


def flatten_features(image_size: int) -> int:
    """What section 10's ``small_convnet`` hands its Linear layer for ``image_size`` images: the
    width of its Flatten output (its convolution part, run on zeros)."""
    convs = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
    )
    with torch.no_grad():
        return int(convs(torch.zeros(1, 3, image_size, image_size)).shape[1])
