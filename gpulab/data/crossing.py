"""``TransferLog``: what crosses the host-to-device link, recorded where it crosses.

An input pipeline can *say* many things about itself (a ``factor`` attribute, a dataset's
``normalize`` flag); what it does shows at the one place every batch passes: the accelerator's
``copy``. :class:`TransferLog` wraps an accelerator, delegates everything to it, and records

* for every ``copy(batch)``: the dtype and bytes of each tensor that crosses, and one 64-bit
  fingerprint per sample of the batch's largest tensor (its raw bytes), so that repeated samples
  are counted from behaviour: a batch echoed twice crosses twice with the same fingerprints;
* for every ``compute(seconds, inputs)``: the dtype of the inputs the model received.

From those: :attr:`TransferLog.echo` (samples crossed per distinct sample: 2.0 for a batch echoed
twice, 3.0 for the same batches replayed for three epochs, about 1.0 for fresh data) and
:attr:`TransferLog.floating_bytes` (float bytes that crossed: 0 when uint8 crosses and the
normalisation happens after the copy, on the device).

    log = TransferLog(accel)
    prof = profile_loop(loader, step_fn, log, epochs=2)     # profile_loop copies through the log
    print(log.echo, log.bytes_by_dtype, log.compute_dtypes)

Fingerprinting costs about 0.1 ms per 64-image uint8 batch on one core (a vectorised multiply-add
over the bytes), small beside a step; an equal pair of samples always gets equal fingerprints,
and two different samples the same one with a probability of about 2**-64.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np
import torch

from gpulab.accel.base import Accelerator, StepMarks
from gpulab.devices.batches import tree_tensors

__all__ = ["TransferLog", "sample_fingerprints"]

_WEIGHTS: dict[int, np.ndarray] = {}


def _weights(n: int) -> np.ndarray:
    """``n`` fixed odd 64-bit weights (the same in every process and run)."""
    if n not in _WEIGHTS:
        rng = np.random.default_rng(0x6770756C)
        _WEIGHTS[n] = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    return _WEIGHTS[n]


def sample_fingerprints(tensor: torch.Tensor) -> np.ndarray:
    """One 64-bit fingerprint per entry of ``tensor``'s first axis, from its raw bytes.

    Equal samples (same dtype, same bytes) get equal fingerprints; a 0-d tensor counts as one sample.

    Returns:
        A ``(len(tensor),)`` uint64 array.
    """
    t = tensor.detach()
    rows = t.reshape(1, -1) if t.dim() == 0 else t.reshape(t.shape[0], -1)  # (B, values)
    if rows.device.type != "cpu":
        rows = rows.cpu()
    raw = rows.contiguous().view(torch.uint8).numpy()  # (B, bytes): any dtype, reinterpreted
    pad = (-raw.shape[1]) % 8
    if pad:
        raw = np.pad(raw, ((0, 0), (0, pad)))
    words = np.ascontiguousarray(raw).view(np.uint64)  # (B, bytes / 8)
    return (words * _weights(words.shape[1])).sum(axis=1, dtype=np.uint64)  # wraps modulo 2**64


class TransferLog(Accelerator):
    """An accelerator that records what crosses to it and what its compute receives.

    Args:
        accel: the accelerator that does the work (every call is delegated to it).
        keep: how many of the first copied batches' largest tensors, and of the first compute
            inputs, to keep (cloned, on the host) for checks after the run.

    Attributes:
        copies: number of ``copy`` calls.
        floating_bytes: bytes of floating-point tensors that crossed (0 when only uint8 and int
            tensors did, i.e. any normalisation happens after the copy).
        bytes_by_dtype: ``Counter`` of bytes that crossed, by dtype name.
        compute_dtypes: ``Counter`` of the dtypes ``compute`` received as inputs (``"none"`` for none).
        kept_copies, kept_inputs: the kept tensors (see ``keep``).
        already_on_device: tensors handed to ``copy`` that were on a device already: nothing of
            theirs crosses, so they are neither counted nor read back.
    """

    def __init__(self, accel: Accelerator, keep: int = 0) -> None:
        if not isinstance(accel, Accelerator):
            raise TypeError(f"TransferLog wraps an Accelerator (gpulab.accel.pick_accelerator()), got {type(accel).__name__}")
        self.inner = accel
        self.keep = int(keep)
        self.copies = 0
        self.floating_bytes = 0
        self.bytes_by_dtype: Counter[str] = Counter()
        self.compute_dtypes: Counter[str] = Counter()
        self.kept_copies: list[torch.Tensor] = []
        self.kept_inputs: list[torch.Tensor] = []
        self._prints: list[np.ndarray] = []
        self.already_on_device = 0

    # -- what the log adds --------------------------------------------------------------------

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        # a tensor already on a device crosses nothing, and reading it back here (.cpu()) would add
        # a device-to-host copy and a sync to every step being measured
        found = tree_tensors(batch)
        tensors = [t for t in found if t.device.type == "cpu"]
        self.already_on_device += len(found) - len(tensors)
        self.copies += 1
        for t in tensors:
            nbytes = t.numel() * t.element_size()
            self.bytes_by_dtype[str(t.dtype).replace("torch.", "")] += nbytes
            self.floating_bytes += nbytes if t.is_floating_point() else 0
        if tensors:
            largest = max(tensors, key=lambda t: t.numel() * t.element_size())  # the samples, e.g. (B, C, H, W)
            self._prints.append(sample_fingerprints(largest))
            if len(self.kept_copies) < self.keep:
                self.kept_copies.append(largest.detach().cpu().clone())
        return self.inner.copy(batch, non_blocking=non_blocking)

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> Any:
        is_tensor = isinstance(inputs, torch.Tensor)
        self.compute_dtypes[str(inputs.dtype).replace("torch.", "") if is_tensor else "none"] += 1
        if is_tensor and len(self.kept_inputs) < self.keep:  # only the first `keep`: a sync each
            self.kept_inputs.append(inputs.detach().cpu().clone())
        return self.inner.compute(seconds, inputs)

    @property
    def samples(self) -> int:
        """Samples that crossed (rows of each batch's largest tensor), repeats included."""
        return int(sum(len(p) for p in self._prints))

    @property
    def distinct_samples(self) -> int:
        """Samples that crossed, each distinct one counted once."""
        return int(len(np.unique(np.concatenate(self._prints)))) if self._prints else 0

    @property
    def echo(self) -> float:
        """Samples crossed per distinct sample: 1.0 for fresh data, k for data repeated k times."""
        return self.samples / self.distinct_samples if self.distinct_samples else 1.0

    def summary(self) -> str:
        crossed = ", ".join(f"{n / 2**20:.1f} MiB {name}" for name, n in self.bytes_by_dtype.most_common())
        model = ", ".join(f"{k} x{v}" for k, v in self.compute_dtypes.most_common())
        return (f"{self.copies} copies ({crossed or 'nothing'}); {self.samples} samples, {self.distinct_samples} distinct "
                f"(echo {self.echo:.2f}); the model received: {model or 'nothing'}")

    __str__ = summary

    # -- everything else is the wrapped accelerator's -------------------------------------------

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.inner.kind

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.inner.name

    @property
    def torch_device(self) -> torch.device:  # type: ignore[override]
        return self.inner.torch_device

    def synchronize(self) -> None:
        self.inner.synchronize()

    def begin(self) -> None:
        self.inner.begin()

    def record(self) -> Any:
        return self.inner.record()

    def event_time(self, event: Any) -> float:
        return self.inner.event_time(event)

    def busy_between(self, start: Any, end: Any) -> float:
        return self.inner.busy_between(start, end)

    def copy_between(self, start: Any, end: Any) -> float:
        return self.inner.copy_between(start, end)

    def waited(self) -> float | None:
        return self.inner.waited()

    def copy_seconds(self, step: StepMarks) -> float:
        return self.inner.copy_seconds(step)

    def step_wait(self, step: StepMarks) -> float:
        return self.inner.step_wait(step)

    def host_work(self, step: StepMarks) -> float:
        return self.inner.host_work(step)

    def busy_intervals(self, steps: Sequence[StepMarks], t_start: float, t_end: float) -> list[tuple[float, float]]:
        return self.inner.busy_intervals(steps, t_start, t_end)

    def __getattr__(self, name: str) -> Any:  # h2d_bytes_per_s, compute_intervals, sim, ...
        if name == "inner":  # not set yet (during unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"<TransferLog of {self.inner!r}: {self.copies} copies>"
