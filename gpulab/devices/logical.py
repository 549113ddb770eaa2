"""Logical devices: N "GPUs" on any machine, and where each tensor lives among them.

Multi-device lessons (DataParallel, the balanced criterion, model parallelism, OOM) need N devices,
and most students have none or one. :func:`logical_devices` gives N :class:`LogicalDevice`s that
map round-robin onto the real GPUs: one-to-one on a server with enough GPUs (a real run), sharing
one physical device otherwise (a *simulated* run, and it says so). The same notebook runs
unchanged on both.

Where each tensor lives among them is :mod:`gpulab.devices.registry`'s job (:func:`placement`, re-exported
by :mod:`gpulab.devices` with these names).

Example::

    devices = logical_devices(4)          # [logical:0 -> cpu (simulated), ...] on a laptop
    print(devices.describe())
    with devices[1]:                      # the current logical device of this thread
        assert current_device() == devices[1]
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from gpulab.devices.physical import physical_devices

__all__ = ["LogicalDevice", "LogicalDevices", "logical_devices", "current_device"]


@dataclass(frozen=True, repr=False, eq=False)
class LogicalDevice:
    """One logical device: a numbered slot that lives on a physical ``torch.device``.

    Equality and hashing use ``index`` and ``physical`` only, so a device can key a dict.
    ``with dev:`` makes it the current logical device of this thread (and, on a GPU, also the
    current CUDA device), until the block ends; blocks nest.

    Attributes:
        index: the logical number (0 is the output device of DataParallel).
        physical: the ``torch.device`` the memory and the compute really use.
        simulated: True when this device shares its physical device with other logical devices,
            so figures about it are gpulab's per-device accounting, not a hardware measurement.
    """

    index: int
    physical: torch.device
    simulated: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.index, bool) or not isinstance(self.index, int) or self.index < 0:
            raise ValueError(f"LogicalDevice index must be an int >= 0, got {self.index!r}")
        phys = torch.device(self.physical)
        if phys.type == "cuda" and phys.index is None:
            phys = torch.device("cuda", 0)  # "cuda" means the first GPU; keep equality exact
        object.__setattr__(self, "physical", phys)
        # hashed on every allocation a meter counts: compute it once (a dataclass hash is Python code)
        object.__setattr__(self, "_hash", hash((self.index, phys)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LogicalDevice):
            return NotImplemented
        return self.index == other.index and self.physical == other.physical

    def __hash__(self) -> int:
        return self._hash

    def __enter__(self) -> "LogicalDevice":
        cuda_ctx = torch.cuda.device(self.physical) if self.physical.type == "cuda" else None
        if cuda_ctx is not None:
            cuda_ctx.__enter__()
        _stack().append((self, cuda_ctx))
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _stack()
        if not stack or stack[-1][0] is not self:
            raise RuntimeError(f"{self} exited out of order: leave `with` blocks innermost first")
        _, cuda_ctx = stack.pop()
        if cuda_ctx is not None:
            cuda_ctx.__exit__(None, None, None)

    def __str__(self) -> str:
        return f"logical:{self.index}"

    def __repr__(self) -> str:
        return f"logical:{self.index} -> {self.physical}" + (" (simulated)" if self.simulated else "")


class LogicalDevices(list):
    """What :func:`logical_devices` returns: a plain ``list`` of :class:`LogicalDevice`, which
    also says whether the run is simulated and how it maps onto the machine."""

    @property
    def simulated(self) -> bool:
        """True when some logical devices share a physical device (figures are gpulab's own)."""
        return any(d.simulated for d in self)

    @property
    def physical(self) -> list[torch.device]:
        """The distinct physical devices used, in order."""
        return list(dict.fromkeys(d.physical for d in self))

    def describe(self) -> str:
        """One line for a notebook: how many devices, on what, and whether it is simulated."""
        phys = ", ".join(str(p) for p in self.physical)
        if self.simulated:
            return (f"{len(self)} logical devices on {len(self.physical)} physical ({phys}): simulated; "
                    "memory is counted per logical device by gpulab.devices.MemoryMeter, and they share compute")
        return f"{len(self)} logical devices on {len(self.physical)} physical ({phys}): real devices"


def logical_devices(n: int, physical: Sequence[torch.device | str] | None = None) -> LogicalDevices:
    """``n`` logical devices, round-robin over the physical devices.

    With at least ``n`` GPUs, logical device ``i`` is ``cuda:i`` and the run is real. With fewer
    (one GPU, or a CPU-only machine) several logical devices share a physical device and every
    device is marked ``simulated``.

    Args:
        n: how many devices the lesson needs (they need not exist).
        physical: the physical devices to use; default :func:`gpulab.devices.physical_devices`
            (every GPU torch can see, else the CPU). Pass ``["cpu"]`` to force a CPU run.

    Returns:
        A :class:`LogicalDevices` list; ``.simulated`` says whether the run is simulated.

    Raises:
        ValueError: if ``n`` is not a positive int, or ``physical`` is empty.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"logical_devices(n) needs n >= 1, got {n!r}: ask for the devices the lesson "
                         "uses, e.g. logical_devices(4); they need not exist, fewer GPUs are shared")
    if physical is None:

        physical = physical_devices()
    phys = [torch.device(p) for p in physical]
    if not phys:
        raise ValueError("physical is empty: pass None (every GPU, else the CPU) or e.g. ['cpu']")
    simulated = n > len(phys)
    return LogicalDevices(LogicalDevice(i, phys[i % len(phys)], simulated) for i in range(n))


# -- the current device of each thread ----------------------------------------------------------

_local = threading.local()  # per-thread state, like CUDA's current device (one per thread)


def _stack() -> list[tuple[LogicalDevice, Any]]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def current_device() -> LogicalDevice | None:
    """The innermost ``with dev:`` device of *this* thread, or None outside any.

    Like CUDA's current device it is not inherited: a thread you start begins with None, so each
    replica thread enters its own device (as ``torch.nn.parallel.parallel_apply`` does).
    """
    stack = _stack()
    return stack[-1][0] if stack else None


@contextlib.contextmanager
def placing(device: LogicalDevice) -> Iterator[None]:
    """Attribute every storage created in this thread to ``device``, whatever the op's inputs
    (used by :mod:`gpulab.parallel.comm` around a copy, whose input lives on the source)."""
    prev = getattr(_local, "forced", None)
    _local.forced = device
    try:
        yield
    finally:
        _local.forced = prev


def forced_device() -> LogicalDevice | None:
    """The device set by :func:`placing` in this thread, if any."""
    return getattr(_local, "forced", None)
