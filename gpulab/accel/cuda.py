"""The real-GPU :class:`~gpulab.accel.Accelerator`: a calibrated spin kernel, timed by CUDA events.

``compute(seconds)`` launches ``torch.cuda._sleep(cycles)``, a kernel of one thread block that
spins for a number of clock cycles calibrated once per device. It is real device work (NVML's
GPU-Util reads 100 % while it runs) that occupies one SM, which is lab 01's point about what
GPU-Util does not measure. Times come from CUDA events anchored to the host clock in ``begin()``;
each spin kernel is bracketed by two events, so the device's busy time is the kernels' own, not the
span from a step's copy to its end (which would count the idle gaps between kernels as busy). Work
that ``step_fn`` queues without ``compute`` is not bracketed: a step with no spin kernel falls back to
that span, an upper bound.

``torch.cuda._sleep`` is private (underscored, undocumented) but has been in torch for years and
serves torch's own stream tests; no public op spins the GPU for a known number of cycles.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import torch

from gpulab.accel.base import Accelerator, StepMarks
from gpulab.devices.batches import tree_map

__all__ = ["CudaAccelerator"]


class CudaAccelerator(Accelerator):
    """A real CUDA device; work is a calibrated spin kernel, times come from CUDA events.

    Args:
        device: a CUDA ``torch.device`` (or string such as ``"cuda:1"``).

    Raises:
        RuntimeError: if torch cannot use CUDA here (names the fix).
    """

    kind = "cuda"

    def __init__(self, device: torch.device | str = "cuda") -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(f"{device} requested but torch sees no CUDA GPU ({torch.__version__}); "
                               "use pick_accelerator() (simulated on CPU) or run `python -m gpulab doctor`")
        dev = torch.device(device)
        self.torch_device = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        self.name = f"{self.torch_device} ({torch.cuda.get_device_name(self.torch_device)})"
        self._cycles_per_s: float | None = None
        self._anchor: Any = None
        self._anchor_t = 0.0
        self._kernels: list[tuple[Any, Any]] = []  # (start, end) events of each spin kernel since begin()

    def _calibrate(self) -> float:
        if self._cycles_per_s is None:
            with torch.cuda.device(self.torch_device):
                torch.cuda._sleep(1_000_000)  # (private, see above) warm up the kernel
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(50_000_000)
                end.record()
                end.synchronize()
                self._cycles_per_s = 50_000_000 / (start.elapsed_time(end) / 1e3)
        return self._cycles_per_s

    def compute(self, seconds: float, inputs: torch.Tensor | None = None) -> torch.Tensor:
        cycles = int(seconds * self._calibrate())
        with torch.cuda.device(self.torch_device):
            start = self.record()
            torch.cuda._sleep(cycles)  # (private, see above) one block spinning: 100 % GPU-Util on one SM of many
            self._kernels.append((start, self.record()))
            if isinstance(inputs, torch.Tensor):
                return inputs.float().mean()
            return torch.zeros((), device=self.torch_device)

    def copy(self, batch: Any, non_blocking: bool = False) -> Any:
        return tree_map(lambda t: t.to(self.torch_device, non_blocking=non_blocking), batch)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.torch_device)

    def begin(self) -> None:
        self._calibrate()
        self.synchronize()
        self._kernels = []
        self._anchor = self.record()
        self._anchor.synchronize()
        self._anchor_t = time.perf_counter()

    def record(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.torch_device))
        return ev

    def event_time(self, event: Any) -> float:
        if self._anchor is None:
            raise RuntimeError("call begin() before reading event times")
        return self._anchor_t + self._anchor.elapsed_time(event) / 1e3

    def _kernel_times(self, lo: float, hi: float) -> list[tuple[float, float]]:
        """The spin kernels that ran within ``[lo, hi]`` (host-clock seconds)."""
        eps = 1e-6  # event timestamps are microseconds
        out = []
        for start, end in self._kernels:
            s, e = self.event_time(start), self.event_time(end)
            if s >= lo - eps and e <= hi + eps:
                out.append((s, e))
        return out

    def busy_between(self, start: Any, end: Any) -> float:
        lo, hi = self.event_time(start), self.event_time(end)
        kernels = self._kernel_times(lo, hi)
        if not kernels:
            return super().busy_between(start, end)  # no spin kernel here: the span, an upper bound
        return sum(e - s for s, e in kernels)

    def busy_intervals(self, steps: Sequence[StepMarks], t_start: float, t_end: float) -> list[tuple[float, float]]:
        intervals = []
        for step in steps:
            lo, hi = self.event_time(step.copy_end), self.event_time(step.step_end)
            kernels = self._kernel_times(lo, hi) or ([(lo, hi)] if hi > lo else [])
            intervals += [(s - t_start, e - t_start) for s, e in kernels]
        return intervals

    def step_wait(self, step: StepMarks) -> float:
        """The base inference (``step_fn`` returned as the step's work ended), narrowed by the kernels:
        the host can only have been blocked on work queued behind it, and a gap before a kernel means
        the device sat idle waiting for the host to launch it. So the wait starts no earlier than the
        last run of back-to-back kernels. A launch-bound step (short kernels, idle gaps) then waits
        about one kernel, not the whole step, and is not mistaken for a sync-bound one."""
        lo, hi = self.event_time(step.copy_end), self.event_time(step.step_end)
        kernels = self._kernel_times(lo, hi)
        if not kernels:
            return super().step_wait(step)
        if abs(step.returned - hi) >= 1e-3:
            return 0.0  # step_fn returned before (or long after) the device finished: no sync seen
        run_start = kernels[-1][0]
        for i in range(len(kernels) - 1, 0, -1):
            if kernels[i][0] - kernels[i - 1][1] > 1e-4:  # an idle gap: the device waited for the host here
                break
            run_start = kernels[i - 1][0]
        return max(0.0, min(step.returned, hi) - max(step.copied, run_start))
