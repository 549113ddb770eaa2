"""A machine described as data, and the two rules lab 00 teaches: which backend, which device per rank.

Lab 00's exercises are written against :class:`MachineSpec`, a plain description of a machine, so
they can be graded on any machine: :func:`choose_backend` and :func:`place_ranks` are the
references the hidden tests compare with, and :mod:`gpulab.parallel.launcher.startup` applies the same
rules to the machine it runs on.

    .venv/bin/python -m pytest tests/devices/test_machine.py
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpulab.devices.physical import cuda_device_count

__all__ = ["MachineSpec", "choose_backend", "place_ranks"]


@dataclass(frozen=True)
class MachineSpec:
    """A description of a machine, as far as choosing a backend and placement is concerned.

    A job may span several nodes, each one like this: torchrun starts ``world_size // num_nodes``
    ranks on every node (its ``--nproc-per-node``), numbered node by node, and each rank's *local*
    rank (``LOCAL_RANK``) counts from 0 on its own node. A GPU belongs to one node, so every rule about
    GPUs is a rule about one node: its GPUs and its local ranks.

    Attributes:
        num_gpus: CUDA GPUs that torch can see on each node (after ``CUDA_VISIBLE_DEVICES``).
        cuda_build: whether the installed torch drives GPUs through ``torch.cuda`` (a CUDA build, or
            a ROCm one, which uses the same API).
        nccl: whether torch was built with NCCL (``torch.distributed.is_nccl_available()``).
        name: a label for messages.
    """

    num_gpus: int = 0
    cuda_build: bool = False
    nccl: bool = False
    num_nodes: int = 1
    name: str = "machine"

    @classmethod
    def this_machine(cls) -> "MachineSpec":
        """The spec of the machine this runs on; fork-safe (counts GPUs without initialising CUDA)."""
        import torch.distributed as dist

        nccl = bool(dist.is_available() and dist.is_nccl_available())
        # torch.cuda._is_compiled (private) is the build test cuda_device_count uses; it touches no driver
        return cls(cuda_device_count(), torch.cuda._is_compiled(), nccl, name="this machine")

    @property
    def usable_gpus(self) -> int:
        """GPUs torch can actually use: none on a CPU build, whatever the hardware."""
        return self.num_gpus if self.cuda_build else 0


    def ranks_per_node(self, world_size: int) -> int:
        """torchrun's ``--nproc-per-node`` for ``world_size`` ranks over :attr:`num_nodes` nodes.

        Raises:
            ValueError: if ``world_size`` is not a positive int, or not a multiple of the nodes.
        """
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int (one process per rank), got {world_size!r}")
        if world_size % self.num_nodes:
            raise ValueError(f"world_size={world_size} does not split evenly over {self.num_nodes} nodes: "
                             "torchrun starts the same number of ranks on every node")
        return world_size // self.num_nodes


def choose_backend(machine: MachineSpec, world_size: int) -> str:
    """The torch.distributed backend for ``world_size`` ranks on ``machine``.

    NCCL is the fast choice, but only when every rank owns a GPU: NCCL refuses two ranks on one
    GPU ("Duplicate GPU detected"), and it has no CPU path. Everything else uses gloo. The GPUs a rank
    can own are those of its own node, so the test compares one node's GPUs with one node's ranks:
    2 nodes of 8 GPUs run 16 ranks under NCCL.

    Args:
        machine: the description of each node.
        world_size: number of processes (ranks) in the whole job.

    Returns:
        ``"nccl"`` or ``"gloo"``.

    Raises:
        ValueError: if ``world_size`` is not a positive int, or not a multiple of the nodes.
    """
    per_node = machine.ranks_per_node(world_size)
    if machine.nccl and machine.usable_gpus >= per_node:
        return "nccl"
    return "gloo"


def place_ranks(machine: MachineSpec, world_size: int) -> list[str]:
    """The device string for each global rank: ``cuda:i`` round-robin over its node's usable GPUs by
    *local* rank (``torch.cuda.set_device(local_rank)``, as torchrun's scripts do), else ``cpu``.

    With fewer GPUs than ranks on a node, ranks share GPUs (and the backend must be gloo, see
    :func:`choose_backend`); on a CPU build every rank is on the CPU even if GPUs exist.

    Raises:
        ValueError: if ``world_size`` is not a positive int, or not a multiple of the nodes.
    """
    per_node, gpus = machine.ranks_per_node(world_size), machine.usable_gpus
    if gpus == 0:
        return ["cpu"] * world_size
    return [f"cuda:{(rank % per_node) % gpus}" for rank in range(world_size)]
