"""gpulab.parallel.dp.parallel_apply: one thread per replica, outputs in order, the caller's grad /
inference / autocast state carried into the threads, and a replica's exception re-raised with its
index after every thread has finished."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from gpulab.devices import current_device, logical_devices
from gpulab.parallel.dp.parallel_apply import ReplicaError, parallel_apply


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_outputs_in_order_each_on_its_thread_and_device(devs) -> None:
    seen = []

    def fn(x, scale=1):
        seen.append((threading.current_thread().name, current_device()))
        return x * scale

    outs = parallel_apply([fn] * 4, [(torch.tensor(i),) for i in range(4)], devs, [{"scale": 10}] * 4)
    assert [int(o) for o in outs] == [0, 10, 20, 30]
    assert sorted(d.index for _, d in seen) == [0, 1, 2, 3]
    assert all(name.startswith("gpulab-replica-") for name, _ in seen)
    assert current_device() is None  # the caller's device context is untouched


def test_a_single_tensor_input_is_one_argument(devs) -> None:
    outs = parallel_apply([lambda x: x.shape] * 2, [torch.ones(3, 2), torch.ones(5, 2)], devs[:2])
    assert outs == [(3, 2), (5, 2)]


def test_replicas_overlap_in_time(devs) -> None:
    """Four 0.2 s sleeps take about 0.2 s, not 0.8 s: the replicas run at the same time."""
    inside, peak, lock = [0], [0], threading.Lock()

    def fn(_):
        with lock:
            inside[0] += 1
            peak[0] = max(peak[0], inside[0])
        time.sleep(0.2)
        with lock:
            inside[0] -= 1

    parallel_apply([fn] * 4, [(None,)] * 4, devs)
    assert peak[0] == 4


def test_grad_mode_and_inference_mode_are_carried(devs) -> None:
    w = torch.ones(2, requires_grad=True)
    fns = [lambda x: x * w] * 2
    assert all(o.requires_grad for o in parallel_apply(fns, [(torch.ones(2),)] * 2, devs[:2]))
    with torch.no_grad():
        assert not any(o.requires_grad for o in parallel_apply(fns, [(torch.ones(2),)] * 2, devs[:2]))
    with torch.inference_mode():
        assert all(o.is_inference() for o in parallel_apply(fns, [(torch.ones(2),)] * 2, devs[:2]))


def test_autocast_is_carried(devs) -> None:
    a = torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outs = parallel_apply([torch.mm] * 2, [(a, a)] * 2, devs[:2])
    assert [o.dtype for o in outs] == [torch.bfloat16] * 2
    assert parallel_apply([torch.mm] * 2, [(a, a)] * 2, devs[:2])[0].dtype == torch.float32


def test_the_callers_autocast_dtype_reaches_every_thread(devs) -> None:
    """Not a fixed dtype: float16 under the caller's float16 autocast, with no_grad carried as well."""
    def seen(_):
        return torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_grad_enabled()

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        assert parallel_apply([seen] * 4, [(None,)] * 4, devs) == [(True, torch.float16, False)] * 4
    assert parallel_apply([seen] * 4, [(None,)] * 4, devs)[0][0] is False


def test_an_exception_names_the_replica_and_every_thread_finishes(devs) -> None:
    finished = []

    def fn(i):
        if i == 2:
            raise ValueError("shapes do not match")
        time.sleep(0.05)
        finished.append(i)

    with pytest.raises(ValueError, match=r"in replica 2 on logical:2.*shapes do not match") as info:
        parallel_apply([fn] * 4, [(i,) for i in range(4)], devs)
    assert isinstance(info.value.__cause__, ValueError)  # the original, with its traceback
    assert sorted(finished) == [0, 1, 3]


def test_out_of_memory_in_a_replica_stays_an_out_of_memory_error(devs) -> None:
    def fn(i):
        if i:
            raise torch.OutOfMemoryError("Tried to allocate 2.00 GiB")
    with pytest.raises(torch.OutOfMemoryError, match="replica 1"):
        parallel_apply([fn] * 2, [(0,), (1,)], devs[:2])


def test_exceptions_that_cannot_be_rebuilt_become_replica_errors(devs) -> None:
    class Picky(Exception):
        def __init__(self, code, detail):
            super().__init__(f"{code}: {detail}")

    def fn(i):
        raise Picky(7, "odd constructor")
    with pytest.raises(ReplicaError, match="in replica 0 .*Picky: 7: odd constructor"):
        parallel_apply([fn] * 2, [(0,), (1,)], devs[:2])
    with pytest.raises(KeyError, match="replica 0"):
        parallel_apply([lambda d: d["missing"]] * 2, [({},), ({},)], devs[:2])


def test_mismatched_lengths_are_refused(devs) -> None:
    with pytest.raises(ValueError, match="one input, device and kwargs"):
        parallel_apply([abs] * 3, [(1,)] * 2, devs[:3])
