"""gpulab.devices.meter_threads: a MemoryMeter sees the work of threads and pools it did not start, each with its
own mode, and a thread that outlives the meter is harmless."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from gpulab.devices import MemoryMeter, logical_devices


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_threads_and_pools_each_get_their_own_mode(devs) -> None:
    pool = ThreadPoolExecutor(2)  # made, and its threads started, before the meter
    list(pool.map(torch.ones, [1, 1]))
    original_start, original_submit = threading.Thread.start, ThreadPoolExecutor.submit

    class Worker(threading.Thread):  # a subclass that overrides run
        def run(self) -> None:
            with devs[3]:
                self.mode = _get_current_dispatch_mode()
                self.out = torch.empty(300)

    with MemoryMeter() as meter:
        worker = Worker()
        worker.start()
        worker.join()

        def task(i):
            with devs[i]:
                return _get_current_dispatch_mode(), torch.empty(100)

        results = list(pool.map(task, [1, 2]))
        modes = {id(worker.mode), *(id(m) for m, _ in results), id(_get_current_dispatch_mode())}
        assert len(modes) == 4  # one mode instance per thread...
        assert all(m.meter is meter for m in [worker.mode, *(m for m, _ in results)])  # ...one meter
        assert [meter.live(d) for d in devs] == [0, 400, 400, 1200]
    assert threading.Thread.start is original_start and ThreadPoolExecutor.submit is original_submit
    pool.shutdown()


def test_a_thread_that_outlives_the_meter_is_harmless(devs) -> None:
    go, done = threading.Event(), threading.Event()

    def late() -> None:
        go.wait(5)
        torch.empty(1000) + 1  # after the meter exited: its mode here passes ops through
        done.set()

    with MemoryMeter() as meter:
        t = threading.Thread(target=late)
        t.start()
    go.set()
    assert done.wait(5)
    t.join()
    assert meter.peak(0) == 0
