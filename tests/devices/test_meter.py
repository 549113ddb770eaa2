"""gpulab.devices.meter: MemoryMeter against analytic byte counts: a Linear layer, transfers, views, frees,
peaks, budgets, replicas in threads, backward attribution, nesting and misuse.

Sizes are float32 (4 bytes): a (B, n) activation is B * n * 4 bytes of storage.
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.parallel import comm

F32 = 4


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_linear_parameters_activations_and_gradients_exactly(devs) -> None:
    B, IN, OUT = 16, 32, 8
    params = (IN * OUT + OUT) * F32
    model = nn.Linear(IN, OUT)
    x = torch.randn(B, IN)  # made before the meter: not counted
    meter = MemoryMeter()
    assert meter.track(model, devs[0]) == params
    with meter:
        assert meter.live(devs[0]) == params
        y = model(x)  # addmm: one (B, OUT) activation; W.t() is a view
        assert meter.live(devs[0]) == params + B * OUT * F32
        loss = y.sum()
        loss.backward()  # dW (OUT, IN) and db (OUT,): as many bytes as the parameters
        assert meter.live(devs[0]) == params + B * OUT * F32 + F32 + params
        # the peak also held backward's seed, ones_like(loss), while the gradients were computed
        assert meter.peak(devs[0]) == params + B * OUT * F32 + F32 + F32 + params
        del y, loss
        assert meter.live(devs[0]) == 2 * params
        before = meter.live(devs[0])
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        opt.step()  # one momentum buffer per parameter, alive as long as the optimizer
        assert meter.live(devs[0]) - before == params
        model.zero_grad(set_to_none=True)
        assert meter.live(devs[0]) == 2 * params  # parameters + momentum
    assert placement(model.weight) == devs[0]


def test_adam_state_is_two_buffers_and_a_step_per_parameter(devs) -> None:
    model = nn.Linear(10, 6)
    params = (10 * 6 + 6) * F32
    model(torch.randn(3, 10)).sum().backward()
    with MemoryMeter() as meter:
        opt = torch.optim.Adam(model.parameters())
        opt.step()
    assert meter.live(0) == 2 * params + 2 * F32  # exp_avg, exp_avg_sq, and a 0-d step tensor each


def test_peak_live_and_frees(devs) -> None:
    with MemoryMeter() as meter:
        a = torch.empty(1024)
        b = torch.empty(2048)
        del a
        c = torch.empty(512)
        assert meter.live(0) == (2048 + 512) * F32
        assert meter.peak(0) == (1024 + 2048) * F32
        meter.reset_peak()
        assert meter.peak(0) == meter.live(0)
        del b, c
        assert meter.live(0) == 0


def test_views_and_in_place_ops_are_not_counted_twice(devs) -> None:
    with MemoryMeter() as meter:
        x = torch.zeros(64, 32)
        size = 64 * 32 * F32
        views = [x.view(32, 64), x.t(), x[3:], x.reshape(-1), x.expand(2, 64, 32), x.detach(),
                 x.unsqueeze(0), x.narrow(0, 1, 3), x.flatten(), *x.chunk(4)]
        x.add_(1).mul_(2)
        torch.relu_(x)
        assert meter.live(0) == size
        y = x.t().contiguous()  # a real copy
        assert meter.live(0) == 2 * size
        del x
        assert meter.live(0) == 2 * size  # the views keep x's storage alive...
        del views
        assert meter.live(0) == size  # ...until the last one goes
        del y


def test_other_ways_to_make_storage(devs) -> None:
    with MemoryMeter() as meter:
        t = torch.tensor([1.0, 2.0, 3.0])  # made outside the dispatcher, then lifted
        assert meter.live(0) == 3 * F32
        out = torch.empty(0)
        torch.add(t, t, out=out)  # an out= op resizes its output
        assert meter.live(0) == 6 * F32
        out.resize_(100)
        assert meter.live(0) == (3 + 100) * F32
        del t, out
        assert meter.live(0) == 0


def test_transfers_count_on_the_destination(devs) -> None:
    x = torch.randn(256, 16)
    with MemoryMeter(devices=devs) as meter:
        y = comm.to(x, devs[1])
        z = comm.to(y, devs[2])
        assert [meter.live(d) for d in devs] == [0, x.nbytes, x.nbytes, 0]
        del y
        assert [meter.live(d) for d in devs] == [0, 0, x.nbytes, 0]
        assert [meter.peak(d) for d in devs] == [0, x.nbytes, x.nbytes, 0]
        assert meter.devices == devs  # given devices are reported even if unused
        del z


def test_a_transfer_to_a_device_outside_the_meters_list_names_the_fix(devs) -> None:
    x = torch.randn(4)
    other = logical_devices(6, physical=["cpu"])[5]
    with MemoryMeter(devices=devs[:2]) as meter:
        with pytest.raises(ValueError, match=r"not one of the devices.*devices=logical_devices\(n\)"):
            comm.to(x, devs[2])
        with pytest.raises(ValueError, match="logical:5"):
            comm.scatter(x, [devs[0], other])
        assert meter.live(devs[1]) == 0  # nothing was copied
        y = comm.to(x, devs[1])
    assert placement(comm.to(y, devs[2])) == devs[2]  # the list applies only while that meter is active


def test_budget_raises_a_cuda_shaped_out_of_memory_error(devs) -> None:
    with MemoryMeter(budget=10_000) as meter:
        a = torch.empty(2000)  # 8000 bytes: fits
        with pytest.raises(torch.OutOfMemoryError) as err:
            torch.empty(1000)  # 4000 more: 2000 are free
        msg = str(err.value)
        for part in ["Tried to allocate 3.91 KiB", "logical:0", "budget of 9.77 KiB", "1.95 KiB is free",
                     "7.81 KiB is allocated by live tensors", "smaller batch"]:
            assert part in msg, (part, msg)
        assert meter.live(0) == 8000  # the refused allocation left nothing behind
        b = comm.to(a, devs[1])  # each device has its own budget
        assert meter.live(devs[1]) == 8000
        with pytest.raises(torch.OutOfMemoryError, match="logical:1"):
            comm.to(a, devs[1]) * 2
        del b


def test_budget_applies_in_backward(devs) -> None:
    model = nn.Linear(256, 256)
    params = (256 * 256 + 256) * F32
    x = torch.randn(64, 256)
    meter = MemoryMeter(budget=params + 64 * 256 * F32 + 1024)  # forward fits, the gradients do not
    meter.track(model, devs[0])
    with meter:
        loss = model(x).sum()
        with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
            loss.backward()


def test_budget_smaller_than_live_is_refused(devs) -> None:
    with MemoryMeter() as meter:
        x = torch.empty(1000)
        with pytest.raises(ValueError, match="already live on logical:0"):
            meter.budget = 100
        assert meter.budget is None  # nothing changed
        meter.budget = 8000
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1001)
        del x
    with pytest.raises(torch.OutOfMemoryError, match="budget"):
        MemoryMeter(budget=100).track(nn.Linear(10, 10), devs[0])


@pytest.mark.parametrize("bad", [0, -5, 1.5, "64MiB", True])
def test_bad_budget_names_the_fix(bad) -> None:
    with pytest.raises(ValueError, match=r"64 \* 2\*\*20"):
        MemoryMeter(budget=bad)


def test_misuse_gets_clear_errors(devs) -> None:
    meter = MemoryMeter()
    with pytest.raises(RuntimeError, match="inside or after"):
        meter.live(0)
    with pytest.raises(RuntimeError, match="inside or after"):
        meter.report()
    with pytest.raises(RuntimeError, match="not active"):
        meter.__exit__(None, None, None)
    with meter:
        with pytest.raises(RuntimeError, match="entered twice"):
            meter.__enter__()
        x = torch.empty(10)  # still measuring after the refused entry
        assert meter.live(0) == 40
        with pytest.raises(TypeError, match="LogicalDevice"):
            meter.live("cuda:0")
        with pytest.raises(ValueError, match="already lives on logical:0"):
            meter.track(x, devs[1])
    with pytest.raises(RuntimeError, match="new MemoryMeter"):
        meter.__enter__()
    with pytest.raises(RuntimeError, match="track"):
        meter.track(torch.empty(1), devs[0])
    assert meter.live(0) == 40  # results stay readable


def test_exits_in_the_wrong_order_or_thread_are_refused() -> None:
    outer, inner = MemoryMeter(), MemoryMeter()
    outer.__enter__()
    inner.__enter__()
    try:
        with pytest.raises(RuntimeError, match="innermost first"):
            outer.__exit__(None, None, None)
        errors = []
        t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError, inner.__exit__, None, None, None)))
        t.start()
        t.join()
        assert "thread that entered" in str(errors[0].value)
    finally:
        inner.__exit__(None, None, None)
        outer.__exit__(None, None, None)


def test_nested_meters_both_count(devs) -> None:
    with MemoryMeter() as outer:
        a = torch.empty(1000)
        with MemoryMeter() as inner:
            b = torch.empty(500)
            c = comm.to(a, devs[1])
        assert (inner.live(0), inner.live(devs[1])) == (2000, 4000)
        assert (outer.live(0), outer.live(devs[1])) == (6000, 4000)
        del b
        assert outer.live(0) == 4000 and inner.live(0) == 2000  # the inner one is frozen at its exit
        del c


def _data_parallel_forward(model, x, devs, loss_on_each_device: bool):
    """DataParallel by hand: broadcast the parameters, scatter the batch, one thread per replica."""
    weights, biases = comm.broadcast(model.weight, devs), comm.broadcast(model.bias, devs)
    chunks = comm.scatter(x, devs)
    outs: list = [None] * len(devs)

    def replica(i: int) -> None:
        with devs[i]:
            out = F.linear(chunks[i], weights[i], biases[i])
            outs[i] = out.sum() if loss_on_each_device else out

    threads = [threading.Thread(target=replica, args=(i,)) for i in range(len(devs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loss = comm.gather(outs, devs[0]).sum()
    return loss, (weights, biases, chunks, outs)


def test_replicas_in_threads_and_backward_match_analytic_counts(devs) -> None:
    B, IN, OUT, n = 64, 256, 128, 4
    P = (IN * OUT + OUT) * F32  # parameters
    C = B // n * IN * F32  # one input chunk
    O = B // n * OUT * F32  # one replica's output
    G = B * OUT * F32  # the gathered output on device 0 (freed once summed: sum saves nothing)
    model = nn.Linear(IN, OUT)
    x = torch.randn(B, IN)  # on device 0 before the meter (chunk 0 is a view of it)
    meter = MemoryMeter(devices=devs)
    meter.track(model, devs[0])
    with meter:
        loss, held = _data_parallel_forward(model, x, devs, loss_on_each_device=False)
        assert [meter.live(d) for d in devs] == [P + O + F32] + [P + C + O] * 3
        assert [meter.peak(d) for d in devs] == [P + O + G + F32] + [P + C + O] * 3
        loss.backward()  # runs in this thread; every op is attributed from its inputs
        # each replica's device held its gradient's copy of the output (O) and dW, db (P) too
        assert [meter.peak(d) for d in devs[1:]] == [2 * P + C + 2 * O] * 3
        assert placement(model.weight.grad) == devs[0]
        del loss, held
        assert [meter.live(d) for d in devs] == [2 * P, 0, 0, 0]  # parameters + summed gradients
    torch.testing.assert_close(model.weight.grad, torch.ones(B, OUT).t() @ x)  # the single-device gradient


def test_loss_on_each_device_balances_memory(devs) -> None:
    B, IN, OUT, n = 64, 64, 1024, 4  # a wide head: outputs outweigh the parameters
    P, C, O = (IN * OUT + OUT) * F32, B // n * IN * F32, B // n * OUT * F32
    model = nn.Linear(IN, OUT)
    x = torch.randn(B, IN)
    reports = []
    for each in (False, True):
        meter = MemoryMeter(devices=devs)
        meter.track(model, devs[0])
        with meter:
            loss, held = _data_parallel_forward(model, x, devs, loss_on_each_device=each)
            del loss, held
        reports.append(meter.report())
    gathered, balanced = reports
    assert [r.peak for r in gathered.rows] == [P + O + B * OUT * F32 + F32] + [P + C + O] * 3
    # balanced: each device sums its own output (O, then a 4-byte loss); device 0 gathers 4 losses
    assert [r.peak for r in balanced.rows] == [P + O + F32] + [P + C + O + F32] * 3
    assert gathered.imbalance > 1.7 and balanced.imbalance < 1.02


@pytest.mark.gpu
def test_cuda_statistics_and_host_memory() -> None:
    dev = logical_devices(1)[0]
    with MemoryMeter(budget=2**20) as meter:
        torch.empty(1000)  # host memory beside a GPU: not counted
        x = torch.empty(1000, device=dev.physical)
        assert meter.live(dev) == 4000
        with pytest.raises(torch.OutOfMemoryError, match="CUDA allocator"):
            torch.empty(2**20, device=dev.physical)
    assert str(dev.physical) in meter.report().cuda
    del x
