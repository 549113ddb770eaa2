"""gpulab.devices.physical: the GPU count and the device lists agree with torch's own answers here, and
with a faked torch.cuda (no GPU, two GPUs, a driver that raises, a CPU build); the count never asks
``torch.cuda.is_available()``, which may initialise CUDA before ranks fork.

The fakes replace what torch itself consults (``torch.cuda._is_compiled``, torch's "is this a CUDA
build" test, and ``torch.cuda.device_count``), so the expected answers are known without a GPU.
"""

from __future__ import annotations

import time

import pytest
import torch

from gpulab import devices
from gpulab.devices import cuda_device_count, default_device, physical_devices

CPU = torch.device("cpu")


def _fake_cuda(monkeypatch, *, compiled: bool, count) -> None:
    """Make torch.cuda report ``count`` GPUs (or raise, if ``count`` is an exception) on a CUDA or CPU build.

    ``is_available`` and ``init`` raise: the functions under test must not reach for them.
    """

    def device_count() -> int:
        if isinstance(count, BaseException):
            raise count
        return count

    def must_not_be_called(*_a, **_k):
        raise AssertionError("this call may initialise CUDA: forked ranks could no longer use the GPU")

    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: compiled)
    monkeypatch.setattr(torch.cuda, "device_count", device_count)
    monkeypatch.setattr(torch.cuda, "is_available", must_not_be_called)
    monkeypatch.setattr(torch.cuda, "init", must_not_be_called)


def test_the_count_and_the_devices_agree_with_torch_on_this_machine() -> None:
    torch_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert cuda_device_count() == torch_count
    devs = physical_devices()
    if torch_count == 0:
        assert devs == [CPU] and default_device() == CPU
    else:
        assert devs == [torch.device("cuda", i) for i in range(torch_count)]
        assert [torch.cuda.get_device_name(d) for d in devs]  # every device is one torch can open
        assert default_device() == devs[0]


def test_two_gpus(monkeypatch) -> None:
    _fake_cuda(monkeypatch, compiled=True, count=2)
    assert cuda_device_count() == 2
    assert physical_devices() == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert default_device() == torch.device("cuda", 0)


def test_a_cuda_build_without_gpus_falls_back_to_the_cpu(monkeypatch) -> None:
    _fake_cuda(monkeypatch, compiled=True, count=0)
    assert cuda_device_count() == 0
    assert physical_devices() == [CPU] and default_device() == CPU


@pytest.mark.parametrize("error", [RuntimeError("CUDA driver initialization failed"), OSError("libcuda.so.1: not found")])
def test_a_driver_that_raises_counts_as_no_gpu(monkeypatch, error) -> None:
    _fake_cuda(monkeypatch, compiled=True, count=error)
    assert cuda_device_count() == 0
    assert physical_devices() == [CPU] and default_device() == CPU


def test_a_cpu_build_has_no_gpu_whatever_the_driver_says(monkeypatch) -> None:
    _fake_cuda(monkeypatch, compiled=False, count=4)
    assert cuda_device_count() == 0
    assert physical_devices() == [CPU]


def test_reexported_from_devices() -> None:
    assert devices.cuda_device_count is cuda_device_count
    assert devices.physical_devices is physical_devices and devices.default_device is default_device
    assert {"cuda_device_count", "physical_devices", "default_device"} <= set(devices.__all__)


@pytest.mark.gpu
def test_gpu_is_the_default_device() -> None:
    assert default_device() == torch.device("cuda", 0)


def test_synchronize_all_waits_for_the_devices_in_use_and_creates_no_context(monkeypatch) -> None:
    from fake_queue import FakeQueue

    from gpulab.devices.physical import synchronize_all

    queue = FakeQueue(monkeypatch, num_gpus=3, used=(2,))
    queue.launch(0.05, device=2)
    t0 = time.perf_counter()
    synchronize_all()
    assert time.perf_counter() - t0 >= 0.05
    assert queue.syncs == [0, 2]  # the current device and the one holding memory, never GPU 1


def test_synchronize_all_does_nothing_before_cuda_starts(monkeypatch) -> None:
    from gpulab.devices.physical import synchronize_all

    called = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: called.append(a))
    synchronize_all()  # this CPU build: not compiled, not initialised
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    synchronize_all()
    assert called == []


def _nvml(monkeypatch, *, driver: int, mig: tuple[tuple[int, int], ...] = ((0, 0), (0, 0))) -> None:
    """A fake NVML: the driver's CUDA version, and per GPU (MIG mode, MIG instances)."""
    import sys
    import types

    from gpulab.devices import physical

    def instance(h, j):
        if j >= mig[h][1]:
            raise RuntimeError("NVML_ERROR_NOT_FOUND")
        return (h, j)

    fake = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: len(mig),
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlSystemGetCudaDriverVersion=lambda: driver,
        nvmlDeviceGetMigMode=lambda h: (mig[h][0], mig[h][0]), NVML_DEVICE_MIG_ENABLE=1,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7, nvmlDeviceGetMigDeviceHandleByIndex=instance)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    physical._unusable_by_nvml.cache_clear()  # the test clears it again when done


@pytest.mark.parametrize(("driver", "mig", "usable"), [
    (12040, ((0, 0), (0, 0)), 2),   # a 12.4 driver runs a 12.8 build (minor-version compatibility)
    (11080, ((0, 0), (0, 0)), 0),   # an 11.8 driver cannot: the doctor's driver-too-old, and no GPU to pick
    (12040, ((1, 0), (0, 0)), 1),   # GPU 0 in MIG mode with no instance made
    (12040, ((1, 2), (1, 0)), 1),   # GPU 0 has two instances; GPU 1 none
])
def test_the_count_leaves_out_gpus_cuda_cannot_use(monkeypatch, driver, mig, usable) -> None:
    """torch.cuda.device_count() is NVML's count: 2 where CUDA could use fewer, and every lab crashed
    on cuda instead of falling back to the CPU."""
    from gpulab.devices import physical

    _fake_cuda(monkeypatch, compiled=True, count=len(mig))
    _nvml(monkeypatch, driver=driver, mig=mig)
    try:
        assert cuda_device_count() == usable
        assert (default_device() == CPU) == (usable == 0)
    finally:
        physical._unusable_by_nvml.cache_clear()
