"""gpulab.parallel.pipeline.timing: the timing arithmetic is that of the recorded numbers, the interleaved
timer rotates its order, intra-op threads are restored, and train_step is one SGD step of the whole
model. No test depends on machine speed."""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, split_model
from gpulab.parallel.pipeline.timing import Timings, intra_op_threads, time_interleaved, train_step


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


def test_timings_arithmetic_is_that_of_the_recorded_numbers():
    t = Timings(wall={"a": [2.0, 4.0, 3.0], "b": [1.0, 1.0, 2.0]}, cpu={"a": [2.0, 4.0, 3.0], "b": [2.0, 2.0, 4.0]})
    assert t.median("a") == 3.0 and t.median("b") == 1.0
    assert t.speedup("a", "b") == 3.0
    assert t.pair_speedup("a", "b") == 2.0  # per-round ratios 2, 4, 1.5
    assert t.cores("a") == 1.0 and t.cores("b") == 2.0
    assert "3000.0 ms" in t.table() and "2.00 cores" in t.table()


def test_time_interleaved_rotates_the_order_and_checks_its_arguments():
    calls = []
    timings = time_interleaved({n: (lambda n=n: calls.append(n)) for n in "abc"}, repeats=3, warmup=1)
    assert calls == list("abc") + list("abc") + list("bca") + list("cab")
    assert all(len(timings.wall[n]) == 3 and len(timings.cpu[n]) == 3 for n in "abc")
    with pytest.raises(ValueError, match="repeats >= 1"):
        time_interleaved({"a": lambda: None}, repeats=0)
    with pytest.raises(ValueError, match="at least one variant"):
        time_interleaved({})


def test_train_step_is_one_sgd_step_of_the_whole_model(devices):
    torch.manual_seed(0)
    model = resnet(18, num_classes=5, width=4).double().eval()  # eval: BatchNorm ignores the micro-batches
    split = split_model(copy.deepcopy(model), devices, boundaries=[4]).eval()
    x, y = torch.randn(6, 3, 16, 16, dtype=torch.double), torch.randint(0, 5, (6,))
    loss_ref = nn.functional.cross_entropy(model(x), y)
    loss_ref.backward()
    expected = [p - 0.1 * p.grad for p in model.parameters()]
    loss = train_step(PipelinedModel(split, 4), x, y, torch.optim.SGD(split.parameters(), lr=0.1))
    assert loss == pytest.approx(loss_ref.item(), rel=1e-9)
    for p, e in zip(split.parameters(), expected):
        torch.testing.assert_close(p.detach(), e.detach())


def test_intra_op_threads_restores_the_setting():
    before = torch.get_num_threads()
    with intra_op_threads(1):
        assert torch.get_num_threads() == 1
        seen = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
        assert seen == [1]  # process-wide: stage threads get it too
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError):
        with intra_op_threads(0):
            pass
