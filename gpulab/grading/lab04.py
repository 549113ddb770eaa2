"""Lab 04's graders: the references the DataParallel exercises are judged against, and the random
inputs the hidden tests draw from the grading run's seed.

Everything here runs the student's functions on inputs built from a seed and returns plain values
for ``grading.check_*`` to send; nothing decides. The same test run on the source's solution in the
reference run gives the expected value.

Masked (``REFERENCES``): only gpulab's ``step_memory``, the reference of ``step_peaks``. The other
exercises' references (``comm.scatter`` / ``gather`` / ``broadcast``, ``scatter_gather``,
``replicate``, ``parallel_apply``, ``DataParallel``, ``data_parallel``) stay available: the demos of
an unanswered lab stand in with them, and the tests of ``replicate`` run the replicas through
gpulab's ``parallel_apply``, ``comm.scatter`` and ``comm.gather``, so that each exercise is graded on
its own. A ``data_parallel`` that only calls gpulab's is caught by :func:`calls_made`.

The graders of ``data_parallel``'s gradients and of ``step_peaks`` are in
:mod:`gpulab.grading.lab04_peaks`, re-exported here.
"""

from __future__ import annotations

import random
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import MemoryMeter, placement
from gpulab.grading.lab04_peaks import (
    PEAK_BATCHES,
    calls_made,
    dp_gradients,
    dp_peaks,
    head_batch,
    measured,
    peak_cases,
    reference_peaks,
    single_gradients,
)
from gpulab.models import MLP
from gpulab.parallel import comm
from gpulab.parallel.dp.parallel_apply import parallel_apply as gpulab_parallel_apply
from gpulab.parallel.dp.step_memory import step_memory

__all__ = [
    "REFERENCES",
    "where",
    "scatter_cases",
    "scatter_facts",
    "gather_cases",
    "gather_facts",
    "train_steps",
    "single_steps",
    "tied_facts",
    "eval_outputs",
    "apply_outputs",
    "dp_gradients",
    "single_gradients",
    "calls_made",
    "reference_peaks",
    "head_batch",
    "measured",
    "PEAK_BATCHES",
    "peak_cases",
    "dp_peaks",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask). Only step_memory: see the module doc for why the others stay.
REFERENCES: tuple = (step_memory,)


def where(x: Any) -> str | list[str]:
    """Where a tensor lives, or which device a LogicalDevice is, as ``"logical:1 on cpu"`` (a list
    for a list). Sent as text: a LogicalDevice equals another of the same index and physical
    device whatever its ``simulated`` flag, which a meter does not always carry over."""
    if isinstance(x, (list, tuple)):
        return [where(v) for v in x]  # type: ignore[misc]
    d = placement(x) if isinstance(x, torch.Tensor) else x
    return f"logical:{d.index} on {d.physical}"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) % 2**63)


def _home(devices: Sequence[Any]) -> torch.device:
    return devices[0].physical


# ---- scatter and gather ------------------------------------------------------------------------


def scatter_cases(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """``n`` random ``(rows, columns, devices)``: batches of 1 to 13 rows over 1 to 4 devices,
    among them batches smaller than the number of devices and uneven splits."""
    cases = [(1, 3, 4), (5, 2, 4), (rng.randint(2, 3), 2, 4)]
    while len(cases) < n:
        cases.append((rng.randint(1, 13), rng.randint(1, 5), rng.randint(1, 4)))
    return cases


def scatter_facts(
    scatter: Callable[..., Any], devices: Sequence[Any], cases: Sequence[tuple[int, int, int]], seed: int
) -> dict[str, Any]:
    """For each case, what ``scatter`` made of a random batch: each piece's values (their shapes
    included) and device, and the gradient that reaches the batch from a weighted sum of the
    pieces (piece ``i`` weighted ``i + 1``)."""
    g = _gen(seed)
    facts = {}
    for rows, cols, n in cases:
        x = torch.randn(rows, cols, generator=g).to(_home(devices)).requires_grad_()
        pieces = list(scatter(x, devices[:n]))
        # each piece's sum is moved to devices[0] before the adding: on GPUs, cuda:1 + cuda:0 raises
        sum((i + 1) * comm.to(p.sum(), devices[0]) for i, p in enumerate(pieces)).backward()
        facts[f"{rows} rows of {cols} over {n} device(s)"] = {
            "pieces": [p.detach() for p in pieces],
            "devices": where(pieces),
            "gradient": x.grad,
        }
    return facts


def gather_cases(rng: random.Random, n: int) -> list[tuple[list[int], int, int]]:
    """``n`` random ``(rows of each piece, columns, index of the output device)``: 1 to 4 pieces."""
    cases = []
    while len(cases) < n:
        cases.append(([rng.randint(1, 5) for _ in range(rng.randint(1, 4))], rng.randint(1, 5), rng.randrange(4)))
    return cases


def gather_facts(
    gather: Callable[..., Any], devices: Sequence[Any], cases: Sequence[tuple[list[int], int, int]], seed: int
) -> dict[str, Any]:
    """For each case, ``gather`` of random pieces (piece ``i`` on ``devices[i]``) inside a
    :class:`MemoryMeter`: the result's values and device, and each piece's gradient and its device
    after a backward of a random weighting of the result."""
    g = _gen(seed)
    facts = {}
    for sizes, cols, out in cases:
        parts = [
            comm.to(torch.randn(s, cols, generator=g).to(_home(devices)), d).requires_grad_()
            for s, d in zip(sizes, devices)
        ]
        weights = torch.randn(sum(sizes), cols, generator=g).to(_home(devices))
        with MemoryMeter():  # every new tensor is placed on the device of its inputs
            got = gather(parts, devices[out])
            device = where(got)
            (got * comm.to(weights, devices[out])).sum().backward()  # the weights go where `got` is
        facts[f"pieces of {sizes} rows of {cols} gathered on devices[{out}]"] = {
            "values": got.detach(),
            "device": device,
            "gradients": [p.grad for p in parts],
            "gradient devices": where([p.grad for p in parts]),
        }
    return facts


# ---- replicate ---------------------------------------------------------------------------------


def _scatter(x: torch.Tensor, devices: Sequence[Any]) -> list[torch.Tensor]:
    """Test infrastructure: ``torch.chunk`` pieces sent to their devices with ``comm.to``."""
    return [comm.to(p, d) for p, d in zip(x.chunk(len(devices)), devices)]


def _gather(outs: Sequence[torch.Tensor], device: Any) -> torch.Tensor:
    return torch.cat([comm.to(o, device) for o in outs])


def train_steps(
    replicate: Callable[..., Any], devices: Sequence[Any], widths: Sequence[int], rows: int, steps: int, seed: int
) -> dict[str, list[torch.Tensor]]:
    """Parameters and ``.grad`` of an MLP after ``steps`` SGD steps on random batches, each step
    data-parallel: the batch split over ``devices``, the model copied by ``replicate``, the
    replicas run by gpulab's ``parallel_apply``, the outputs concatenated on ``devices[0]``."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(list(widths)).to(_home(devices))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(steps):
        x = torch.randn(rows, widths[0], generator=g).to(_home(devices))
        y = torch.randint(0, widths[-1], (rows,), generator=g).to(_home(devices))
        opt.zero_grad()
        pieces = _scatter(x, devices)
        used = list(devices[: len(pieces)])
        outs = gpulab_parallel_apply(replicate(model, used), pieces, used)
        F.cross_entropy(_gather(outs, devices[0]), y).backward()
        opt.step()
    return {"parameters": [p.detach() for p in model.parameters()], "gradients": [p.grad for p in model.parameters()]}


def single_steps(
    devices: Sequence[Any], widths: Sequence[int], rows: int, steps: int, seed: int
) -> dict[str, list[torch.Tensor]]:
    """What :func:`train_steps` must give: the same steps on one device."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(list(widths)).to(_home(devices))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(steps):
        x = torch.randn(rows, widths[0], generator=g).to(_home(devices))
        y = torch.randint(0, widths[-1], (rows,), generator=g).to(_home(devices))
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return {"parameters": [p.detach() for p in model.parameters()], "gradients": [p.grad for p in model.parameters()]}


def tied_facts(
    replicate: Callable[..., Any], devices: Sequence[Any], n: int, width: int, rows: int, seed: int
) -> dict[str, Any]:
    """A model whose first and last layers share one weight, replicated on ``devices[:n]``: whether
    each replica keeps the tie, and the original's gradients after a data-parallel backward."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        a, b = nn.Linear(width, width), nn.Linear(width, width)
    b.weight = a.weight  # one parameter used twice
    tied = nn.Sequential(a, nn.Tanh(), b).to(_home(devices))
    used = list(devices[:n])
    reps = replicate(tied, used)
    x = torch.randn(rows, width, generator=g).to(_home(devices))
    pieces = _scatter(x, used)
    outs = gpulab_parallel_apply(list(reps)[: len(pieces)], pieces, used[: len(pieces)])
    _gather(outs, devices[0]).square().sum().backward()
    return {
        "each replica's first and last layers share one weight": [r[0].weight is r[2].weight for r in reps],
        "gradients": [p.grad for p in tied.parameters()],
    }


def eval_outputs(
    replicate: Callable[..., Any], devices: Sequence[Any], widths: Sequence[int], seed: int
) -> list[torch.Tensor]:
    """The eval-mode outputs of each replica of a model with BatchNorm (its running statistics set
    at random), each on a random input on its own device."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(widths[0], widths[1]),
            nn.BatchNorm1d(widths[1]),
            nn.ReLU(),
            nn.Linear(widths[1], widths[2], bias=False),
        )
    model[1].running_mean.copy_(torch.randn(widths[1], generator=g))
    model[1].running_var.copy_(torch.rand(widths[1], generator=g) + 0.5)
    model = model.to(_home(devices)).eval()
    outs = []
    for r, d in zip(replicate(model, list(devices)), devices):
        inp = comm.to(torch.randn(3, widths[0], generator=g).to(_home(devices)), d)
        with torch.no_grad():
            outs.append(r.eval()(inp))
    return outs


# ---- parallel_apply ----------------------------------------------------------------------------


def apply_outputs(
    parallel_apply: Callable[..., Any],
    replicate: Callable[..., Any],
    devices: Sequence[Any],
    widths: Sequence[int],
    rows: int,
    seed: int,
) -> list[torch.Tensor]:
    """``parallel_apply`` of an MLP's replicas (made by ``replicate``) on the pieces of a random
    batch: the outputs, in replica order."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP(list(widths)).to(_home(devices))
    pieces = _scatter(torch.randn(rows, widths[0], generator=g).to(_home(devices)), devices)
    used = list(devices[: len(pieces)])
    return [o.detach() for o in parallel_apply(replicate(model, used), pieces, used)]
