"""gpulab.devices: discovery falls back to the CPU; lab 00's references follow the NCCL rules."""

from __future__ import annotations

import pytest
import torch

from gpulab import devices
from gpulab.devices import MachineSpec, choose_backend, place_ranks


def test_physical_devices_match_torch() -> None:
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    expected = [torch.device("cuda", i) for i in range(n)] or [torch.device("cpu")]
    assert devices.physical_devices() == expected
    assert devices.default_device() == expected[0]
    assert devices.try_gpu(n) == torch.device("cpu")  # one past the last GPU falls back


def test_broken_cuda_counts_as_no_gpu(monkeypatch) -> None:
    def boom():
        raise RuntimeError("CUDA driver initialization failed")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    assert devices.cuda_device_count() == 0
    assert devices.physical_devices() == [torch.device("cpu")]


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


@pytest.mark.parametrize("bad", [0, -2, 1.5, "2"])
def test_bad_world_size_names_the_fix(bad) -> None:
    with pytest.raises(ValueError, match="positive int"):
        choose_backend(MachineSpec(), bad)
    with pytest.raises(ValueError, match="positive int"):
        place_ranks(MachineSpec(), bad)


def test_this_machine_agrees_with_torch() -> None:
    spec = MachineSpec.this_machine()
    assert spec.cuda_build == (torch.version.cuda is not None)
    assert spec.usable_gpus == devices.cuda_device_count()


@pytest.mark.gpu
def test_gpu_is_the_default_device() -> None:
    assert devices.default_device().type == "cuda"
