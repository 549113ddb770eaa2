"""gpulab.devices.logical (re-exported by gpulab.devices): logical devices over the physical ones, and the
current device (per thread, nested)."""

from __future__ import annotations

import threading

import pytest
import torch

from gpulab import devices
from gpulab.devices import LogicalDevice, current_device, logical, logical_devices
from gpulab.devices import registry as registry


def test_reexported_from_devices() -> None:
    assert devices.LogicalDevice is logical.LogicalDevice
    assert devices.logical_devices is logical.logical_devices
    assert devices.placement is registry.placement
    assert {"LogicalDevice", "logical_devices", "current_device", "placement"} <= set(devices.__all__)


def test_more_devices_than_physical_share_and_are_simulated() -> None:
    devs = logical_devices(4, physical=["cpu"])
    assert isinstance(devs, list) and len(devs) == 4
    assert [d.index for d in devs] == [0, 1, 2, 3]
    assert all(d.physical == torch.device("cpu") and d.simulated for d in devs)
    assert devs.simulated and devs.physical == [torch.device("cpu")]
    assert "simulated" in devs.describe()


def test_round_robin_over_gpus() -> None:
    # A machine description, not real GPUs: building LogicalDevices needs no CUDA.
    two = [torch.device("cuda", 0), torch.device("cuda", 1)]
    real = logical_devices(2, physical=two)
    assert [d.physical for d in real] == two and not real.simulated
    assert "real devices" in real.describe()
    shared = logical_devices(3, physical=two)
    assert [d.physical.index for d in shared] == [0, 1, 0] and shared.simulated


def test_default_uses_the_machine() -> None:
    devs = logical_devices(2)
    phys = devices.physical_devices()
    assert [d.physical for d in devs] == [phys[i % len(phys)] for i in range(2)]
    assert devs.simulated == (len(phys) < 2)
    one = logical_devices(1)
    assert not one.simulated  # one device on one physical device is the real thing


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_count_names_the_fix(bad) -> None:
    with pytest.raises(ValueError, match=r"logical_devices\(4\)"):
        logical_devices(bad)


def test_empty_physical_list_is_refused() -> None:
    with pytest.raises(ValueError, match="physical is empty"):
        logical_devices(2, physical=[])


def test_repr_equality_and_hash() -> None:
    dev = LogicalDevice(1, torch.device("cpu"), simulated=True)
    assert repr(dev) == "logical:1 -> cpu (simulated)"
    assert str(dev) == "logical:1"
    assert repr(LogicalDevice(0, "cuda")) == "logical:0 -> cuda:0"  # "cuda" means cuda:0
    assert dev == LogicalDevice(1, "cpu")  # the simulated flag describes, it does not identify
    assert len({dev, LogicalDevice(1, "cpu"), LogicalDevice(2, "cpu")}) == 2
    with pytest.raises(ValueError, match="index"):
        LogicalDevice(-1, "cpu")


def test_with_sets_the_current_device_and_nests() -> None:
    d0, d1 = logical_devices(2, physical=["cpu"])
    assert current_device() is None
    with d0:
        assert current_device() is d0
        with d1:
            assert current_device() is d1
        assert current_device() is d0
    assert current_device() is None
    with pytest.raises(KeyError):
        with d1:
            raise KeyError("boom")
    assert current_device() is None  # restored after an exception


def test_out_of_order_exit_is_refused() -> None:
    d0, d1 = logical_devices(2, physical=["cpu"])
    d0.__enter__()
    d1.__enter__()
    try:
        with pytest.raises(RuntimeError, match="innermost first"):
            d0.__exit__(None, None, None)
    finally:
        d1.__exit__(None, None, None)
        d0.__exit__(None, None, None)
    assert current_device() is None


def test_current_device_is_per_thread() -> None:
    devs = logical_devices(3, physical=["cpu"])
    barrier = threading.Barrier(3)
    seen: dict[int, object] = {}

    def work(i: int) -> None:
        seen[-i - 1] = current_device()  # a new thread starts with none, like CUDA's current device
        with devs[i]:
            barrier.wait()  # all three are inside their own `with` at the same time
            seen[i] = current_device()

    with devs[0]:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert [seen[i] for i in range(3)] == devs
    assert [seen[-i - 1] for i in range(3)] == [None] * 3


@pytest.mark.gpu
def test_with_sets_the_cuda_device_too() -> None:
    dev = logical_devices(1)[0]
    with dev:
        assert torch.cuda.current_device() == dev.physical.index
        assert torch.empty(1, device="cuda").device == dev.physical
