"""gpulab.grading.lab08.count_host_reads: counts every read of a tensor's value into Python (the
syncs of lab 01), whichever way it is written, and nothing else; gpulab's reference loops read
twice per epoch, a loop with .item() per step twice per step."""

from __future__ import annotations

import torch
from torch import nn

from gpulab.grading.lab08 import count_host_reads
from gpulab.memory.loops import evaluate, train_epoch
from gpulab.models import SmallCNN


def test_each_way_of_reading_a_value_counts_once() -> None:
    t = torch.tensor([1.5, 2.0])
    s = t.sum()
    for read in (lambda: s.item(), lambda: float(s), lambda: int(s), lambda: bool(s > 1), lambda: f"{s:.2f}",
                 lambda: t.tolist(), lambda: s.numpy(), lambda: round(s.item()), lambda: str(s), lambda: repr(t),
                 lambda: print(t, end="")):
        assert count_host_reads(read)[1] == 1
    assert count_host_reads(lambda: (t * 2 + 1).sum().detach())[1] == 0  # device work only
    assert count_host_reads(lambda x: x + 1, 41) == (42, 0)


def _epoch_reads(loop, num_steps: int) -> int:
    torch.manual_seed(0)
    model = SmallCNN(channels=(8, 16))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(num_steps)]
    if loop is evaluate:
        return count_host_reads(evaluate, model, nn.CrossEntropyLoss(), batches)[1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # SGD reads nothing; Adam on a CPU reads its step
    return count_host_reads(loop, model, opt, nn.CrossEntropyLoss(), batches)[1]


def _item_per_step(model, optimizer, loss_fn, batches):
    total = 0.0
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()  # a sync every step
    return total


def test_reference_loops_read_once_per_epoch_and_item_per_step_reads_every_step() -> None:
    for loop in (train_epoch, evaluate):
        assert _epoch_reads(loop, 3) == _epoch_reads(loop, 9) == 2, loop.__name__
    assert (_epoch_reads(_item_per_step, 3), _epoch_reads(_item_per_step, 9)) == (3, 9)
