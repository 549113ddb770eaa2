"""gpulab.devices.machine: lab 00's backend and placement rules on hand-written machines, and
MachineSpec.this_machine against torch's own answers (here, and on a faked two-GPU CUDA build).

The expected answers are written out by hand from NCCL's rules: NCCL only when every rank owns a
GPU (two ranks on one GPU fail with "Duplicate GPU detected") and torch was built with it; ranks go
round-robin over the GPUs a CUDA build can use, else to the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gpulab.devices import MachineSpec, choose_backend, cuda_device_count, place_ranks

DGX = MachineSpec(8, cuda_build=True, nccl=True, name="8-GPU server")
WORKSTATION = MachineSpec(2, cuda_build=True, nccl=True, name="2-GPU workstation")
WINDOWS = MachineSpec(2, cuda_build=True, nccl=False, name="Windows, no NCCL in the build")
CPU_WHEEL = MachineSpec(8, cuda_build=False, nccl=False, name="GPUs, but the CPU wheel")
CPU_WHEEL_NCCL_FLAG = MachineSpec(4, cuda_build=False, nccl=True, name="a CPU build cannot run NCCL")
LAPTOP = MachineSpec(name="laptop")


@pytest.mark.parametrize(
    "machine, world_size, backend, placement",
    [
        (MachineSpec(4, True, True), 4, "nccl", ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]),
        (MachineSpec(2, True, True), 3, "gloo", ["cuda:0", "cuda:1", "cuda:0"]),  # shared GPU: no NCCL
        (MachineSpec(2, True, False), 2, "gloo", ["cuda:0", "cuda:1"]),  # no NCCL in the build
        (MachineSpec(8, False, False), 2, "gloo", ["cpu", "cpu"]),  # CPU build ignores the hardware
        (MachineSpec(), 1, "gloo", ["cpu"]),
    ],
)
def test_backend_and_placement(machine, world_size, backend, placement) -> None:
    assert choose_backend(machine, world_size) == backend
    assert place_ranks(machine, world_size) == placement


@pytest.mark.parametrize(
    "machine, world_size, backend, placement",
    [
        (DGX, 1, "nccl", ["cuda:0"]),
        (DGX, 8, "nccl", [f"cuda:{i}" for i in range(8)]),
        (DGX, 9, "gloo", [f"cuda:{i}" for i in range(8)] + ["cuda:0"]),  # rank 8 shares GPU 0
        (WORKSTATION, 2, "nccl", ["cuda:0", "cuda:1"]),
        (WORKSTATION, 4, "gloo", ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]),
        (WINDOWS, 1, "gloo", ["cuda:0"]),
        (CPU_WHEEL, 8, "gloo", ["cpu"] * 8),
        (CPU_WHEEL_NCCL_FLAG, 2, "gloo", ["cpu", "cpu"]),
        (MachineSpec(1, True, True), 2, "gloo", ["cuda:0", "cuda:0"]),
        (LAPTOP, 3, "gloo", ["cpu", "cpu", "cpu"]),
    ],
    ids=lambda v: v.name if isinstance(v, MachineSpec) else None,
)
def test_more_machines_written_out_by_hand(machine, world_size, backend, placement) -> None:
    assert choose_backend(machine, world_size) == backend
    assert place_ranks(machine, world_size) == placement


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2"])
def test_bad_world_size_names_the_fix(bad) -> None:
    with pytest.raises(ValueError, match="positive int"):
        choose_backend(MachineSpec(), bad)
    with pytest.raises(ValueError, match="positive int"):
        place_ranks(MachineSpec(), bad)


def test_usable_gpus_are_none_on_a_cpu_build() -> None:
    assert CPU_WHEEL.usable_gpus == 0 and DGX.usable_gpus == 8 and LAPTOP.usable_gpus == 0


def test_this_machine_agrees_with_torch() -> None:
    spec = MachineSpec.this_machine()
    # a ROCm build drives its GPUs through torch.cuda as well
    assert spec.cuda_build == (torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None)
    assert spec.num_gpus == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert spec.nccl == (dist.is_available() and dist.is_nccl_available())
    assert spec.usable_gpus == cuda_device_count()


def test_this_machine_on_a_faked_two_gpu_cuda_build(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    spec = MachineSpec.this_machine()
    assert (spec.num_gpus, spec.cuda_build, spec.nccl) == (2, True, True)
    assert choose_backend(spec, 2) == "nccl" and place_ranks(spec, 2) == ["cuda:0", "cuda:1"]
    assert choose_backend(spec, 3) == "gloo"


def test_two_nodes_of_eight_gpus_run_sixteen_ranks_under_nccl() -> None:
    """The rule is per node (torchrun's local view): 2 nodes x 8 GPUs hold 16 ranks, one GPU each."""
    two_dgx = MachineSpec(num_gpus=8, cuda_build=True, nccl=True, num_nodes=2)
    assert choose_backend(two_dgx, 16) == "nccl"
    assert choose_backend(two_dgx, 32) == "gloo"  # 16 ranks on each node's 8 GPUs
    assert place_ranks(two_dgx, 16) == [f"cuda:{r % 8}" for r in range(16)]


def test_placement_counts_local_ranks_not_global_ones() -> None:
    """3 ranks on each of 2 two-GPU nodes: node 1's first rank (global rank 3) is local rank 0 -> cuda:0,
    where a round-robin over global ranks would put it on cuda:1."""
    nodes = MachineSpec(num_gpus=2, cuda_build=True, nccl=False, num_nodes=2)
    assert place_ranks(nodes, 6) == ["cuda:0", "cuda:1", "cuda:0", "cuda:0", "cuda:1", "cuda:0"]


@pytest.mark.parametrize("rule", [choose_backend, place_ranks])
def test_a_world_size_that_does_not_split_over_the_nodes_names_the_fix(rule) -> None:
    with pytest.raises(ValueError, match="does not split evenly over 2 nodes"):
        rule(MachineSpec(num_gpus=4, cuda_build=True, nccl=True, num_nodes=2), 3)
