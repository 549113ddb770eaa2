"""gpulab.devices.validate: the one LogicalDevice check, its wording and its two strengths."""

from __future__ import annotations

import pytest
import torch

from gpulab.devices import LogicalDevice, MemoryMeter, logical_devices
from gpulab.devices.validate import check_device, check_devices


@pytest.fixture
def devs():
    return logical_devices(3, ["cpu"])


def test_good_devices_come_back_as_given(devs) -> None:
    assert check_device(devs[1]) is devs[1]
    assert check_devices(devs) == list(devs)
    assert check_devices(tuple(devs[:2])) == list(devs[:2])
    assert check_devices(d for d in devs) == list(devs)  # any iterable


@pytest.mark.parametrize("bad", ["cuda:1", 1, torch.device("cpu"), None])
def test_names_ids_and_torch_devices_are_refused_with_the_fix(devs, bad) -> None:
    with pytest.raises(TypeError, match=r"output_device is .* not a LogicalDevice.*logical_devices\(n\)"):
        check_device(bad, "output_device")
    with pytest.raises(TypeError, match=r"devices\[1\] is .*device names and ids are not accepted.*logical_devices\(2\)"):
        check_devices([devs[0], bad])


@pytest.mark.parametrize("bad", ["cuda", 0, torch.device("cpu")])
def test_one_device_instead_of_a_list_is_refused(bad, devs) -> None:
    with pytest.raises(TypeError, match="must be a list of LogicalDevice"):
        check_devices(bad)
    with pytest.raises(TypeError, match="must be a list of LogicalDevice"):
        check_devices(devs[0])


def test_empty_and_repeated_lists_are_refused(devs) -> None:
    with pytest.raises(ValueError, match="devices is empty"):
        check_devices([])
    with pytest.raises(ValueError, match="lists logical:0 twice"):
        check_devices([devs[0], devs[1], devs[0]])


def test_a_gpu_this_machine_lacks_is_usable_only_by_type() -> None:
    missing = LogicalDevice(0, torch.device("cuda", 99))
    with pytest.raises(ValueError, match=r"cuda:99, which this machine does not have"):
        check_device(missing)
    with pytest.raises(ValueError, match="does not have"):
        check_devices([missing])
    assert check_device(missing, usable=False) is missing  # what a meter is created with
    assert check_devices([missing], usable=False) == [missing]


def test_a_device_the_active_meter_does_not_measure_is_not_usable(devs) -> None:
    with MemoryMeter(devices=devs[:2]):
        assert check_device(devs[1]) is devs[1]
        with pytest.raises(ValueError, match=r"not one of the devices the active MemoryMeter measures"):
            check_device(devs[2])
        assert check_device(devs[2], usable=False) is devs[2]
    assert check_device(devs[2]) is devs[2]  # the meter has exited
