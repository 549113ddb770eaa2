"""gpulab.data.crossing: TransferLog records what crosses to the device (dtypes, bytes, repeated
samples) and what the model receives, and changes nothing about the run it records."""

from __future__ import annotations

import pytest
import torch

from gpulab.accel import HostAccelerator, SimAccelerator
from gpulab.data.crossing import TransferLog, sample_fingerprints
from gpulab.data.loading import BatchEcho
from gpulab.profiling import profile_loop


def test_fingerprints_are_equal_exactly_for_equal_samples() -> None:
    x = torch.randint(0, 256, (6, 3, 5, 7), dtype=torch.uint8)  # 105 bytes a row: padded to whole words
    x[4] = x[1]
    fp = sample_fingerprints(x)
    assert fp.shape == (6,) and fp[4] == fp[1]
    assert len(set(fp.tolist())) == 5
    y = x.clone()
    y[2, 0, 0, 0] ^= 1  # one bit of one sample
    assert (sample_fingerprints(y) != fp).tolist() == [False, False, True, False, False, False]
    for dtype in (torch.float32, torch.bfloat16, torch.bool, torch.int64):
        t = torch.randn(4, 9).to(dtype)
        assert len(sample_fingerprints(t)) == 4
    assert len(sample_fingerprints(torch.tensor(3.0))) == 1


def test_the_log_counts_dtypes_bytes_and_echoes() -> None:
    batches = [(torch.randint(0, 256, (4, 3, 2, 2), dtype=torch.uint8), torch.arange(4)) for _ in range(5)]
    log = TransferLog(HostAccelerator(), keep=2)
    for batch in BatchEcho(batches, 3):
        images, labels = log.copy(batch)
        log.compute(0.0, images.float() / 255)
    assert log.copies == 15 and log.samples == 60 and log.distinct_samples == 20
    assert log.echo == pytest.approx(3.0)
    assert log.bytes_by_dtype == {"uint8": 15 * 48, "int64": 15 * 32} and log.floating_bytes == 0
    assert log.compute_dtypes == {"float32": 15}
    assert [t.dtype for t in log.kept_copies] == [torch.uint8] * 2 and len(log.kept_inputs) == 2
    assert torch.equal(log.kept_copies[0], batches[0][0])

    floats = TransferLog(HostAccelerator())
    floats.copy((torch.arange(6.0).reshape(2, 3), torch.zeros(2, dtype=torch.long)))
    assert floats.floating_bytes == 24 and floats.echo == 1.0
    assert "float32" in floats.summary()


def test_profiling_through_the_log_is_profiling_the_accelerator() -> None:
    accel = SimAccelerator()
    log = TransferLog(accel)
    assert (log.kind, log.name, log.torch_device, log.simulated) == (accel.kind, accel.name, accel.torch_device, True)
    assert log.h2d_bytes_per_s == accel.h2d_bytes_per_s  # anything else is the wrapped accelerator's
    batch = (torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8), torch.zeros(8))
    loader = [batch] * 6
    prof = profile_loop(loader, lambda b: accel.compute(0.002, b[0]), log, disable=True)
    assert prof.mode == "simulated" and prof.num_steps == 6 and prof.busy_fraction > 0
    assert log.copies == 6 and log.echo == pytest.approx(6.0)  # the same batch, six times over
    with pytest.raises(TypeError, match="wraps an Accelerator"):
        TransferLog("cuda")


@pytest.mark.gpu
def test_the_log_around_a_gpu_records_the_host_side_of_the_copy() -> None:
    from gpulab.accel import CudaAccelerator

    log = TransferLog(CudaAccelerator(), keep=1)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8).pin_memory()
    on_device, labels = log.copy((images, torch.arange(4)), non_blocking=True)
    assert on_device.is_cuda and labels.is_cuda and log.kept_copies[0].device.type == "cpu"
    log.compute(0.001, on_device.float())
    log.synchronize()
    assert log.bytes_by_dtype["uint8"] == images.numel() and log.compute_dtypes == {"float32": 1}


def test_a_batch_already_on_the_device_crosses_nothing_and_is_not_read_back() -> None:
    """TransferLog read every copied batch back with .cpu(): on a GPU, a batch already on the device
    paid a device-to-host copy and a sync per step (the meta device cannot be read back at all)."""
    from gpulab.accel import HostAccelerator
    from gpulab.data.crossing import TransferLog

    log = TransferLog(HostAccelerator())
    log.copy((torch.zeros(4, 3, device="meta"), torch.zeros(4, dtype=torch.int64)))
    assert log.already_on_device == 1 and dict(log.bytes_by_dtype) == {"int64": 32} and log.samples == 4
