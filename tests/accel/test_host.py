"""gpulab.accel.host: the CPU as the device. Work runs synchronously (the call takes the time it was
given), copies are free (the batch is already where the work runs), and nothing is ever waited for.
Only lower bounds on time are asserted: a loaded machine can make a call slower, never faster.
"""

from __future__ import annotations

import time

import torch

from gpulab.accel import HostAccelerator, as_accelerator


def test_compute_runs_synchronously_and_returns_the_inputs_mean() -> None:
    acc = HostAccelerator()
    x = torch.arange(6, dtype=torch.uint8).reshape(2, 3)
    t0 = time.perf_counter()
    out = acc.compute(0.03, x)
    assert time.perf_counter() - t0 >= 0.03  # no queue: the host did the work before returning
    assert out.item() == x.float().mean().item() == 2.5
    assert acc.compute(0.0).item() == 0.0


def test_copies_are_the_batch_itself_and_nothing_is_waited_for() -> None:
    acc = HostAccelerator()
    batch = {"x": torch.ones(3)}
    assert acc.copy(batch) is batch and acc.copy(batch, non_blocking=True) is batch
    acc.synchronize()
    assert acc.waited() == 0.0
    start = acc.record()
    time.sleep(0.01)
    end = acc.record()
    assert acc.event_time(end) - acc.event_time(start) >= 0.01


def test_a_cpu_device_means_the_host() -> None:
    acc = as_accelerator(torch.device("cpu"))
    assert isinstance(acc, HostAccelerator) and acc.kind == "host"
