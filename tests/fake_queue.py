"""A CUDA stand-in for timing code on a CPU-only machine: work "launched" on a device returns at
once and is only waited for by ``torch.cuda.synchronize``, as with real kernels. A timer that does
not synchronise measures the launch (about 0 s); one that does measures the work."""

from __future__ import annotations

import time

import torch


class FakeQueue:
    """Patches ``torch.cuda`` (a CUDA build, initialised, ``num_gpus`` devices, memory reserved on
    ``used`` of them) and counts every ``synchronize(index)`` call."""

    def __init__(self, monkeypatch, num_gpus: int = 2, used: tuple[int, ...] = (0, 1)) -> None:
        self.pending = {i: 0.0 for i in range(num_gpus)}
        self.syncs: list[int] = []
        self.used = set(used)
        for name, value in {"_is_compiled": lambda: True, "is_initialized": lambda: True,
                            "device_count": lambda: num_gpus, "current_device": lambda: 0,
                            "memory_reserved": lambda i=0: 2**20 if i in self.used else 0,
                            "synchronize": self.synchronize}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def launch(self, seconds: float, device: int = 0) -> None:
        """Queue ``seconds`` of work on ``device`` and return at once."""
        self.pending[device] += seconds

    def synchronize(self, device: int | None = None) -> None:
        index = 0 if device is None else int(getattr(device, "index", device) or 0)
        self.syncs.append(index)
        time.sleep(self.pending[index])
        self.pending[index] = 0.0
