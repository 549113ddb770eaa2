"""gpulab.memory.fixes.loops: the reference loops keep memory flat, match a plain loop's numbers, and
evaluate without a graph (a lower peak than the same loop without no_grad)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpulab.memory import LeakFinder, peak_memory
from gpulab.memory.fixes.loops import evaluate, train_epoch
from gpulab.models import SmallCNN


def _setup():
    torch.manual_seed(0)
    model = SmallCNN(channels=(8, 16))
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(8, 3, 16, 16, generator=g), torch.randint(0, 10, (8,), generator=g)) for _ in range(14)]
    return model, batches


def test_train_epoch_is_flat_and_matches_a_plain_loop() -> None:
    model, batches = _setup()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    with LeakFinder(track=model) as finder:
        mean_loss, acc = train_epoch(model, opt, nn.CrossEntropyLoss(), finder.watch(batches))
    assert not finder.leaking and finder.growth() == 0.0
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    losses, correct = [], 0
    for x, y in batches:
        ref_opt.zero_grad()
        out = ref(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        ref_opt.step()
        losses.append(loss.item())
        correct += (out.argmax(1) == y).sum().item()
    assert mean_loss == pytest.approx(sum(losses) / len(losses), rel=1e-6)
    assert acc == correct / (8 * len(batches))


def test_evaluate_keeps_no_graph() -> None:
    model, batches = _setup()
    model.train()
    loss_fn = nn.CrossEntropyLoss()

    def without_no_grad():
        model.eval()
        outs = [model(x) for x, _ in batches[:1]]
        model.train()
        return outs

    peak_eval = peak_memory(evaluate, model, loss_fn, batches[:1], track=model)
    peak_graph = peak_memory(without_no_grad, track=model)
    assert peak_eval < 0.5 * peak_graph
    loss, acc = evaluate(model, loss_fn, batches)
    assert model.training  # put back
    model.eval()
    with torch.no_grad():
        outs = [(model(x), y) for x, y in batches]
    assert acc == sum((o.argmax(1) == y).sum().item() for o, y in outs) / (8 * len(batches))
    assert loss == pytest.approx(sum(loss_fn(o, y).item() for o, y in outs) / len(outs), rel=1e-6)


def test_empty_batches_are_refused() -> None:
    model, _ = _setup()
    with pytest.raises(ValueError, match="empty"):
        evaluate(model, nn.CrossEntropyLoss(), [])
    with pytest.raises(ValueError, match="empty"):
        train_epoch(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), [])
