"""gpulab.memory.leaks: LeakFinder flags a leaking loop and not a steady one, nor a one-off allocation or
noise, and names the surviving tensors with the line that made them."""

from __future__ import annotations

import random

import matplotlib
import pytest
import torch
from torch import nn

from gpulab.devices import MemoryMeter
from gpulab.memory import LeakFinder

matplotlib.use("Agg")


F32 = 4


@pytest.fixture
def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))


def _batches(n, batch=16):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(n)]


def test_accumulated_loss_without_no_grad_leaks_and_is_named(mlp) -> None:
    loss_fn = nn.CrossEntropyLoss()
    with LeakFinder(track=mlp) as finder:
        total = 0
        for x, y in finder.watch(_batches(20)):
            total = total + loss_fn(mlp(x), y)  # keeps every batch's graph alive
    assert finder.leaking and finder.leak_step == finder.criterion.window - 1
    # per step: the graph's saved tensors (hidden activations, logits, softmax) stay
    assert finder.growth_per_step > 16 * 64 * F32
    rep = finder.report()
    top = rep.sites[0]
    assert "total = total + loss_fn(mlp(x), y)" in top.where.code
    assert top.where.function == "test_accumulated_loss_without_no_grad_leaks_and_is_named"
    assert top.steps == list(range(19))  # steps 0-18 survive (the last one, 19, is min_age=1 too young)
    assert "LEAKING" in str(rep) and "total = total + loss_fn" in str(rep)


def test_a_steady_training_loop_is_not_flagged(mlp) -> None:
    opt = torch.optim.SGD(mlp.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    with LeakFinder(track=mlp) as finder:
        running = 0.0
        for x, y in finder.watch(_batches(30)):
            opt.zero_grad()
            loss = loss_fn(mlp(x), y)
            loss.backward()
            opt.step()
            running += loss.item()
    assert not finder.leaking
    assert finder.growth() == 0.0  # exactly flat after the first step (gradients, momentum)
    assert finder.history[1] > finder.history[0] - 1  # step 0 made the one-off state
    # the momentum buffers (step 0) survive, but only from one step: no growing site
    assert all(len(s.steps) == 1 for s in finder.report().sites)


def test_growth_per_step_is_what_torch_profiler_nets_in_each_step(mlp) -> None:
    """Lab 08, section 3: LeakFinder and torch.profiler (profile_memory=True, a record_function range
    per step) see the same leak: the live bytes grow by exactly each step's allocated minus freed."""
    from torch.profiler import ProfilerActivity, profile, record_function

    loss_fn = nn.CrossEntropyLoss()
    with LeakFinder(track=mlp) as finder, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        total = 0
        for x, y in finder.watch(_batches(6)):
            with record_function("step"):
                total = total + loss_fn(mlp(x), y)  # keeps every batch's graph alive
    steps = sorted((e for e in prof.events() if e.name == "step"), key=lambda e: e.time_range.start)
    net = [e.cpu_memory_usage for e in steps]
    assert len(net) == 6 and net[1] > 16 * 64 * F32  # at least the hidden activations, kept every step
    assert [b - a for a, b in zip(finder.history, finder.history[1:])] == net[1:]
    del total


def test_one_off_allocations_are_not_a_leak() -> None:
    keep = []
    with LeakFinder() as finder:
        for i in range(40):
            if i in (10, 25):
                keep.append(torch.empty(2**20))  # a cache filled once, then another: two jumps
            torch.empty(1000) * 2  # transient work
            finder.step()
    assert not finder.leaking
    assert finder.history[-1] == 2 * 2**20 * F32


def test_noise_is_not_a_leak() -> None:
    rng = random.Random(0)
    flagged = 0
    for trial in range(5):
        held = None
        with LeakFinder() as finder:
            for _ in range(60):
                held = torch.empty(rng.randrange(0, 64 * 1024))  # variable-size state kept one step
                finder.step()
        flagged += finder.leaking
        del held
    assert flagged == 0


def test_a_leak_every_other_step_is_flagged() -> None:
    keep = []
    with LeakFinder() as finder:
        for i in range(24):
            if i % 2:
                keep.append(torch.empty(4096))
            finder.step()
    assert finder.leaking


def test_a_leak_smaller_than_the_threshold_is_not_flagged() -> None:
    keep = []
    with LeakFinder(threshold=1024) as finder:
        for _ in range(30):
            keep.append(torch.empty(64))  # 256 bytes per step
            finder.step()
    assert not finder.leaking
    with LeakFinder(threshold=128) as finder:
        for _ in range(30):
            keep.append(torch.empty(64))
            finder.step()
    assert finder.leaking


def test_a_negative_threshold_names_the_fix() -> None:
    with pytest.raises(ValueError, match="threshold"):
        LeakFinder(threshold=-1)


def test_misuse() -> None:
    finder = LeakFinder()
    with pytest.raises(RuntimeError, match="inside"):
        finder.step()
    with finder:
        finder.step()
    with pytest.raises(RuntimeError, match="new LeakFinder"):
        finder.__enter__()
    with pytest.raises(ValueError, match="active"):
        with LeakFinder(MemoryMeter()):
            pass
    with pytest.raises(ValueError, match="more than 5 steps"):
        finder.growth(since=5)


def test_reads_a_given_meter_and_its_budget() -> None:
    keep = []
    with MemoryMeter(budget=64 * 1024) as meter, LeakFinder(meter) as finder:
        with pytest.raises(torch.OutOfMemoryError):
            for _ in range(100):
                keep.append(torch.empty(1024))  # 4 KiB per step: out of memory after 16
                finder.step()
    assert len(finder.history) == 16 and finder.history[-1] == 16 * 4096
    assert finder.leaking
    ax = finder.plot()
    assert ax.get_lines()  # the history and the budget line


@pytest.mark.gpu
def test_cuda_allocator_mode() -> None:
    keep = []
    with LeakFinder(device="cuda") as finder:
        for _ in range(16):
            keep.append(torch.empty(2**16, device="cuda"))
            finder.step()
    assert finder.mode.startswith("CUDA allocator") and finder.leaking
