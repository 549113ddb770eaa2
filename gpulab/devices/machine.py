"""A machine described as data, and the two rules lab 00 teaches: which backend, which device per rank.

Lab 00's exercises are written against :class:`MachineSpec`, a plain description of a machine, so
they can be graded on any machine: :func:`choose_backend` and :func:`place_ranks` are the
references the hidden tests compare with, and :mod:`gpulab.parallel.ddp.startup` applies the same
rules to the machine it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.devices.physical import cuda_device_count

__all__ = ["MachineSpec", "choose_backend", "place_ranks"]


@dataclass(frozen=True)
class MachineSpec:
    """A description of a machine, as far as choosing a backend and placement is concerned.

    Attributes:
        num_gpus: CUDA GPUs that torch can see (after ``CUDA_VISIBLE_DEVICES``).
        cuda_build: whether the installed torch drives GPUs through ``torch.cuda`` (a CUDA build, or
            a ROCm one, which uses the same API).
        nccl: whether torch was built with NCCL (``torch.distributed.is_nccl_available()``).
        name: a label for messages.
    """

    num_gpus: int = 0
    cuda_build: bool = False
    nccl: bool = False
    name: str = "machine"

    @classmethod
    def this_machine(cls) -> "MachineSpec":
        """The spec of the machine this runs on; fork-safe (counts GPUs without initialising CUDA)."""
        import torch.distributed as dist

        nccl = bool(dist.is_available() and dist.is_nccl_available())
        # torch.cuda._is_compiled (private) is the build test cuda_device_count uses; it touches no driver
        return cls(cuda_device_count(), torch.cuda._is_compiled(), nccl, "this machine")

    @property
    def usable_gpus(self) -> int:
        """GPUs torch can actually use: none on a CPU build, whatever the hardware."""
        return self.num_gpus if self.cuda_build else 0


def _check_world_size(world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int (one process per rank), got {world_size!r}")


def choose_backend(machine: MachineSpec, world_size: int) -> str:
    """The torch.distributed backend for ``world_size`` ranks on ``machine``.

    NCCL is the fast choice, but only when every rank owns a GPU: NCCL refuses two ranks on one
    GPU ("Duplicate GPU detected"), and it has no CPU path. Everything else uses gloo.

    Args:
        machine: the machine description.
        world_size: number of processes (ranks).

    Returns:
        ``"nccl"`` or ``"gloo"``.

    Raises:
        ValueError: if ``world_size`` is not a positive int.
    """
    _check_world_size(world_size)
    if machine.nccl and machine.usable_gpus >= world_size:
        return "nccl"
    return "gloo"


def place_ranks(machine: MachineSpec, world_size: int) -> list[str]:
    """The device string for each rank: ``cuda:i`` round-robin over usable GPUs, else ``cpu``.

    With fewer GPUs than ranks, ranks share GPUs (and the backend must be gloo, see
    :func:`choose_backend`); on a CPU build every rank is on the CPU even if GPUs exist.

    Raises:
        ValueError: if ``world_size`` is not a positive int.
    """
    _check_world_size(world_size)
    gpus = machine.usable_gpus
    if gpus == 0:
        return ["cpu"] * world_size
    return [f"cuda:{rank % gpus}" for rank in range(world_size)]
