"""The host as the device: work runs synchronously on the CPU and nothing overlaps."""

from __future__ import annotations

import time
from typing import Any

import torch

from gpulab.accel.base import Accelerator, StepMarks, spin

__all__ = ["HostAccelerator"]


class HostAccelerator(Accelerator):
    """The CPU as the device: work runs synchronously on the host, nothing overlaps."""

    kind = "host"
    name = "cpu (host)"

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> torch.Tensor:
        spin(seconds)
        return inputs.float().mean() if isinstance(inputs, torch.Tensor) else torch.zeros(())

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        return batch  # already where the work runs

    def synchronize(self) -> None:
        pass

    def record(self) -> float:
        return time.perf_counter()

    def event_time(self, event: float) -> float:
        return event

    def waited(self) -> float:
        return 0.0

    # The host is the device: step_fn's time is the device's compute (busy_between counts it),
    # so none of it is host work or a wait, and the copy (a no-op) is all copy.

    def copy_seconds(self, step: StepMarks) -> float:
        return step.copy_host

    def step_wait(self, step: StepMarks) -> float:
        return 0.0

    def host_work(self, step: StepMarks) -> float:
        return 0.0
