"""Tests of lab 07's grading helpers (gpulab.grading.lab07) and timing helpers
(gpulab.parallel.pipeline.timing): a real pipeline passes the overlap check, code that runs the
stages one after the other fails it, hung or failing student code fails fast with a clear message,
and the timing arithmetic is that of the recorded numbers. No test depends on machine speed.
"""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.grading import GradingError
from gpulab.grading.lab07 import check_overlap_speedup, check_stages_overlap, run_with_timeout
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, SplitModel, split_model
from gpulab.parallel.pipeline.timing import Timings, time_interleaved, train_step


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


def _reference(stages, devices, x, split_size):
    """gpulab's pipeline behind the student's signature."""
    return PipelinedModel(SplitModel(list(stages), devices), split_size)(x)


def _sequential(stages, devices, x, split_size):
    """The same micro-batches, one stage after the other: no overlap."""
    return PipelinedModel(SplitModel(list(stages), devices), split_size, overlap=False)(x)


def test_a_real_pipeline_passes_the_overlap_check(devices):
    check_stages_overlap(_reference, devices, timeout_s=5.0)


def test_stages_run_one_after_the_other_fail_the_overlap_check(devices):
    t0 = time.perf_counter()
    with pytest.raises(GradingError, match="one after the other"):
        check_stages_overlap(_sequential, devices, timeout_s=1.0)
    assert time.perf_counter() - t0 < 10  # the barrier times out; nothing waits forever


def test_a_pipeline_that_returns_the_wrong_thing_fails(devices):
    def drops_the_last_micro_batch(stages, devs, x, split_size):
        return _reference(stages, devs, x, split_size)[:-1]

    with pytest.raises(GradingError, match="output must equal the input"):
        check_stages_overlap(drops_the_last_micro_batch, devices, timeout_s=5.0)


def test_run_with_timeout_returns_raises_and_passes_grad_mode():
    assert run_with_timeout(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="boom"):
        run_with_timeout(lambda: {}["boom"])
    with torch.no_grad():
        assert run_with_timeout(torch.is_grad_enabled) is False
        assert run_with_timeout(torch.is_grad_enabled, grad=True) is True
    assert run_with_timeout(torch.is_grad_enabled) is True


def test_run_with_timeout_gives_up_on_code_that_hangs():
    never = threading.Event()
    t0 = time.perf_counter()
    with pytest.raises(GradingError, match="did not return within 1 s.*pass the exception on"):
        run_with_timeout(never.wait, timeout_s=1.0, what="pipelined_forward")
    assert time.perf_counter() - t0 < 5
    never.set()  # let the daemon thread finish


def test_overlap_speedup_check_fails_fast_on_a_stub(devices):
    def stub(stages, devs, x, split_size):
        raise NotImplementedError()

    split = split_model(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), devices)
    t0 = time.perf_counter()
    with pytest.raises(NotImplementedError):
        check_overlap_speedup(stub, split, torch.randn(8, 4), 2)
    assert time.perf_counter() - t0 < 5  # before anything is timed


def test_overlap_speedup_check_reports_sequential_code_with_its_figures(devices):
    # sleeps release the GIL like kernels do, and take the same time on any machine: sequential
    # code is 1.0x of the sequential baseline, far from the 3x asked here
    class Nap(nn.Module):
        def forward(self, x):
            time.sleep(0.01)
            return x + 1

    split = split_model(nn.Sequential(Nap(), Nap()), devices)
    with pytest.raises(GradingError, match=r"needs at least 3.00x.*measured yours"):
        check_overlap_speedup(_sequential, split, torch.randn(8, 2), 2, at_least=3.0, repeats=2, attempts=1)
    result = check_overlap_speedup(_reference, split, torch.randn(8, 2), 2, at_least=1.0, repeats=2, attempts=1)
    assert result.yours >= 1.0 and not result.against_reference and "overlap speedup" in str(result)


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
