"""Lab 04's graders for ``data_parallel``'s gradients (:func:`dp_gradients`, against one device:
:func:`single_gradients`; the notebook's functions it calls: :func:`calls_made`) and for
``step_peaks``: the lab's language-model head and batches, the peaks a
``step_peaks`` returns for one step through the student's own DataParallel, and gpulab's measurement
(:func:`reference_peaks`, with ``step_memory``, masked while the lab is graded).

What ``step_peaks`` measures is the student's own DataParallel: their ``data_parallel`` made a model
by :class:`~gpulab.parallel.dp.data_parallel.FunctionalDataParallel`, in the lab's demos and in its
test (:func:`dp_peaks`); the reference run measures the source's ``data_parallel`` with its
``step_peaks``. The test cells reach these through :mod:`gpulab.grading.lab04`, which re-exports them.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gpulab.models import MLP
from gpulab.parallel import comm
from gpulab.parallel.dp.data_parallel import FunctionalDataParallel
from gpulab.parallel.dp.step_memory import HeadWorkload, step_memory

__all__ = [
    "calls_made",
    "dp_gradients",
    "single_gradients",
    "head_batch",
    "reference_peaks",
    "measured",
    "PEAK_BATCHES",
    "peak_cases",
    "dp_peaks",
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) % 2**63)


def _home(devices: Sequence[Any]) -> torch.device:
    return devices[0].physical


def dp_gradients(
    data_parallel: Callable[..., Any], devices: Sequence[Any], rows: int, output_device: Any, seed: int
) -> list[torch.Tensor | None]:
    """The gradients of an MLP after one cross-entropy step through ``data_parallel`` on a random
    batch of ``rows`` rows, the loss computed on ``output_device`` (None: ``devices[0]``)."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP([6, 32, 4]).to(_home(devices))
    x = torch.randn(rows, 6, generator=g).to(_home(devices))
    y = torch.randint(0, 4, (rows,), generator=g).to(_home(devices))
    out = data_parallel(model, x, devices, output_device)
    F.cross_entropy(out, comm.to(y, output_device or devices[0])).backward()
    return [p.grad for p in model.parameters()]


def single_gradients(devices: Sequence[Any], rows: int, seed: int) -> list[torch.Tensor]:
    """What :func:`dp_gradients` must give: the same step on one device."""
    g = _gen(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MLP([6, 32, 4]).to(_home(devices))
    x = torch.randn(rows, 6, generator=g).to(_home(devices))
    y = torch.randint(0, 4, (rows,), generator=g).to(_home(devices))
    F.cross_entropy(model(x), y).backward()
    return [p.grad for p in model.parameters()]


@contextlib.contextmanager
def _counting(namespace: dict[str, Any], names: Sequence[str], counts: dict[str, int]) -> Iterator[None]:
    saved = {name: namespace[name] for name in names}

    def counted(name: str) -> Callable[..., Any]:
        fn = saved[name]

        def call(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return fn(*args, **kwargs)

        return call

    namespace.update({name: counted(name) for name in names})
    try:
        yield
    finally:
        namespace.update(saved)


def calls_made(namespace: Mapping[str, Any], names: Sequence[str], run: Callable[[], Any]) -> dict[str, int]:
    """How many times ``run()`` called each of the notebook's functions ``names`` (looked up in
    ``namespace``, the notebook's ``globals()``, at call time): a data_parallel built from the
    student's own scatter, replicate, parallel_apply and gather calls each once."""
    counts = {name: 0 for name in names}
    with _counting(namespace, names, counts):  # type: ignore[arg-type]
        run()
    return counts


def head_batch(batch_size: int, devices: Sequence[Any]) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The lab's language-model head (fresh weights) and a batch of ``batch_size`` on ``devices[0]``."""
    work = HeadWorkload()
    return (work.model(_home(devices)), *work.batch(batch_size, device=_home(devices)))


def reference_peaks(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, devices: Sequence[Any]) -> list[int]:
    """gpulab's measurement of one cross-entropy step of ``model``: peak bytes per device."""
    return [int(r.peak) for r in step_memory(model, F.cross_entropy, inputs, targets, devices).rows]


def measured(
    measure: Callable[..., Any], model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, devices: Sequence[Any]
) -> dict[str, Any]:
    """``measure(model, inputs, targets, devices)`` (a ``step_peaks``): the peaks it returns, and
    which of the model's parameters still hold a gradient afterwards."""
    peaks = measure(model, inputs, targets, devices)
    return {
        "peak bytes per device": list(peaks),
        "parameters left with a gradient": [p.grad is not None for p in model.parameters()],
    }


# Batches where the gathered logits, not the parameters, set the output device's peak. Below about
# 96 rows, with the output on devices[0], how a correct gather copies (comm.to + torch.cat, or one
# output buffer as comm.gather does) changes device 0's peak by one parameter-sized buffer (the meter
# sums the replicas' gradients out of place: see gpulab.parallel.dp.step_memory), about 20 %.
PEAK_BATCHES = (96, 128, 160, 192, 224, 256)


def peak_cases(rng: random.Random) -> list[tuple[int, int | None]]:
    """Two ``(batch, index of the output device)`` for the hidden test of ``step_peaks``: the
    default output device (None), and one of ``devices[1..3]``, where a ``data_parallel`` that
    gathers on the wrong device shows."""
    return [(rng.choice(PEAK_BATCHES), None), (rng.choice(PEAK_BATCHES), rng.randint(1, 3))]


def dp_peaks(
    measure: Callable[..., Any],
    data_parallel: Callable[..., Any],
    devices: Sequence[Any],
    cases: Sequence[tuple[int, int | None]],
) -> dict[str, dict[str, Any]]:
    """For each case, :func:`measured` by ``measure`` (a ``step_peaks``) of one step of the lab's
    head (fresh weights) through ``data_parallel`` made a model
    (:class:`~gpulab.parallel.dp.data_parallel.FunctionalDataParallel`), gathered on
    ``devices[index]`` (None: ``data_parallel``'s default)."""
    facts = {}
    for batch, out in cases:
        head, x, y = head_batch(batch, devices)
        model = FunctionalDataParallel(data_parallel, head, devices, None if out is None else devices[out])
        facts[f"batch {batch}, output_device={'None' if out is None else f'devices[{out}]'}"] = measured(
            measure, model, x, y, devices
        )
    return facts
