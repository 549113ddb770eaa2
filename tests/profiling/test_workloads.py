"""gpulab.profiling.workloads: the demo dataset is deterministic (sample i is the base image rolled by i),
costs the CPU time it says per sample (lower bounds only: a loaded machine is slower, never faster),
and the demo loader and step give exactly the batches and device work asked for."""

from __future__ import annotations

import time

import pytest
import torch

from gpulab.accel import SimAccelerator
from gpulab.profiling.workloads import BusyDataset, demo_loader, demo_step


def test_samples_are_a_deterministic_function_of_seed_and_index() -> None:
    ds, again, other = BusyDataset(5, 0.0, shape=(2, 3, 4)), BusyDataset(5, 0.0, shape=(2, 3, 4)), BusyDataset(5, 0.0, (2, 3, 4), seed=1)
    base, _ = ds[0]
    assert base.dtype == torch.uint8 and base.shape == (2, 3, 4) and len(ds) == 5
    for i in range(5):
        image, label = ds[i]
        assert torch.equal(image, torch.roll(base, shifts=i, dims=-1))
        assert torch.equal(image, again[i][0]) and label == again[i][1] and 0 <= int(label) < 10
    assert not torch.equal(other[0][0], base)
    batch = ds.__getitems__([4, 1])
    assert torch.equal(batch[0][0], ds[4][0]) and torch.equal(batch[1][0], ds[1][0])


def test_each_sample_costs_its_time() -> None:
    ds = BusyDataset(8, 0.01)
    t0 = time.perf_counter()
    ds[3]
    assert time.perf_counter() - t0 >= 0.01
    t0 = time.perf_counter()
    ds.__getitems__([0, 1, 2])  # one busy loop for the whole batch
    assert time.perf_counter() - t0 >= 3 * 0.01


def test_bad_sizes_and_indices() -> None:
    with pytest.raises(ValueError, match="num_samples >= 1"):
        BusyDataset(0)
    with pytest.raises(ValueError, match="sample_cost_s >= 0"):
        BusyDataset(4, -1.0)
    with pytest.raises(IndexError, match="out of range"):
        BusyDataset(4, 0.0)[4]


def test_demo_loader_and_step() -> None:
    loader = demo_loader(num_batches=3, batch_size=4, sample_cost_s=0.0)
    batches = list(loader)
    assert len(batches) == 3 and all(images.shape == (4, 3, 32, 32) for images, _ in batches)
    acc = SimAccelerator()
    step = demo_step(acc, compute_s=0.005)
    loss = step(batches[0])
    assert acc.waited() == 0  # queued on the device, not waited for
    assert step.__name__ == "async_step" and demo_step(acc, sync=True).__name__ == "sync_step"
    assert 0 <= loss.item() <= 255  # reading it waits for the device: a uint8 image's mean
    t0 = time.perf_counter()
    assert isinstance(demo_step(acc, 0.02, sync=True)(batches[1]), float)
    assert time.perf_counter() - t0 >= 0.02  # the sync version waits for its own device work
