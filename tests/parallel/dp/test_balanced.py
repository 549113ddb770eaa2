"""gpulab.parallel.DataParallelModel + DataParallelCriterion against a single-device run: loss and
gradients equal, tensor or tuple outputs, loss modules with buffers, only scalars gathered, and
clear errors for mismatched targets and misuse."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices, placement
from gpulab.models import MLP
from gpulab.parallel import DataParallel, DataParallelCriterion, DataParallelModel, comm


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


class WithAux(nn.Module):
    """Returns (logits, aux): the shape PyTorch-Encoding's criterion demanded of every model."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 5)

    def forward(self, x):
        logits = self.body(x)
        return logits, logits.square().mean(dim=1)


def _same(model, ref, loss, ref_loss) -> None:
    torch.testing.assert_close(loss, ref_loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("rows", [8, 12])
def test_loss_and_gradients_equal_a_single_device_run(devs, rows) -> None:
    torch.manual_seed(rows)
    model = MLP([6, 16, 5])
    ref = copy.deepcopy(model)
    x, y = torch.randn(rows, 6), torch.randint(0, 5, (rows,))
    with MemoryMeter():  # computed tensors are placed on their logical device while a meter runs
        outputs = DataParallelModel(model, devs)(x)
    assert isinstance(outputs, list) and [placement(o) for o in outputs] == devs  # not gathered
    loss = DataParallelCriterion(nn.CrossEntropyLoss(), devs)(outputs, y)
    assert loss.dim() == 0 and placement(loss) == devs[0]
    loss.backward()
    ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    _same(model, ref, loss, ref_loss)


def test_uneven_splits_are_weighted_by_rows(devs) -> None:
    """7 rows split 2, 2, 2, 1: an equal average of the four means would be wrong; weighting is exact."""
    torch.manual_seed(3)
    model = MLP([6, 5])
    ref = copy.deepcopy(model)
    x, y = torch.randn(7, 6), torch.randint(0, 5, (7,))
    loss = DataParallelCriterion(F.cross_entropy, devs)(DataParallelModel(model, devs)(x), y)
    loss.backward()
    ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    _same(model, ref, loss, ref_loss)


def test_sum_reduction_and_a_batch_smaller_than_the_devices(devs) -> None:
    model = MLP([6, 5])
    ref = copy.deepcopy(model)
    x, y = torch.randn(3, 6), torch.randint(0, 5, (3,))
    outputs = DataParallelModel(model, devs)(x)
    assert len(outputs) == 3
    crit = DataParallelCriterion(nn.CrossEntropyLoss(reduction="sum"), devs, reduction="sum")
    loss = crit(outputs, y)
    loss.backward()
    ref_loss = F.cross_entropy(ref(x), y, reduction="sum")
    ref_loss.backward()
    _same(model, ref, loss, ref_loss)


def test_tuple_outputs_are_unpacked_and_a_plain_tensor_needs_no_tuple(devs) -> None:
    torch.manual_seed(4)
    model = WithAux()
    ref = copy.deepcopy(model)
    x, y = torch.randn(8, 6), torch.randint(0, 5, (8,))

    def loss_fn(logits, aux, target):
        return F.cross_entropy(logits, target) + 0.1 * aux.mean()

    loss = DataParallelCriterion(loss_fn, devs)(DataParallelModel(model, devs)(x), y)
    loss.backward()
    ref_loss = loss_fn(*ref(x), y)
    ref_loss.backward()
    _same(model, ref, loss, ref_loss)
    # the "return (x,)" trap: a model returning a bare tensor works as it is
    plain = DataParallelCriterion(F.mse_loss, devs)(DataParallelModel(nn.Linear(6, 2), devs)(x), torch.zeros(8, 2))
    assert plain.dim() == 0


def test_a_loss_module_with_a_class_weight_buffer_is_replicated(devs) -> None:
    torch.manual_seed(5)
    model = MLP([6, 5])
    ref = copy.deepcopy(model)
    w = torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])
    x = torch.randn(8, 6)
    y = torch.tensor([0, 1, 1, 4, 2, 2, 3, 4])  # each device sees the same total class weight
    crit = DataParallelCriterion(nn.CrossEntropyLoss(weight=w), devs)
    assert "loss_fn.weight" in crit.state_dict()
    loss = crit(DataParallelModel(model, devs)(x), y)
    loss.backward()
    # per-device weighted means averaged by rows: equals the single-device loss when every
    # device's pieces carry the same summed weight (here 3.0 on each device)
    per_device = [F.cross_entropy(ref(xi), yi, weight=w) for xi, yi in zip(x.chunk(4), y.chunk(4))]
    ref_loss = torch.stack(per_device).mean()
    ref_loss.backward()
    _same(model, ref, loss, ref_loss)


def test_only_scalars_reach_the_output_device(devs) -> None:
    """The loss's work stays on every device; gathering first puts all of it on devices[0]."""
    head = nn.Linear(8, 1000)
    x, y = torch.randn(16, 8), torch.randint(0, 1000, (16,))
    with MemoryMeter():
        outputs = DataParallelModel(head, devs)(x)  # placed on their devices while metered
    piece = 4 * 1000 * 4  # one device's logits: 4 rows of 1000 float32
    with MemoryMeter(devices=devs) as balanced:
        DataParallelCriterion(F.cross_entropy, devs)(outputs, y)
    # each device: its log-softmax (one piece), its 4 int64 targets, the loss and nll's total weight
    # (4 B each); devices[0] also receives 3 scalars and makes the 4 weights of the average
    assert [balanced.peak(d) for d in devs[1:]] == [piece + 4 * 8 + 4 + 4] * 3
    assert balanced.peak(devs[0]) - balanced.peak(devs[1]) <= 64
    with MemoryMeter(devices=devs) as gathered:
        F.cross_entropy(comm.gather(outputs, devs[0]), y)
    assert gathered.peak(devs[0]) >= 8 * piece and gathered.peak(devs[1]) == 0  # all logits, twice


def test_bad_targets_and_misuse_get_clear_errors(devs) -> None:
    model = DataParallelModel(MLP([6, 5]), devs)
    crit = DataParallelCriterion(F.cross_entropy, devs)
    outputs = model(torch.randn(8, 6))
    with pytest.raises(ValueError, match=r"10 rows .* 8 rows \(2, 2, 2, 2 on 4 devices\)"):
        crit(outputs, torch.randint(0, 5, (10,)))
    with pytest.raises(ValueError, match="rows"):
        crit(outputs, torch.tensor(3))
    gathered = DataParallel(MLP([6, 5]), devs)(torch.randn(8, 6))
    with pytest.raises(TypeError, match="DataParallelModel, not DataParallel"):
        crit(gathered, torch.randint(0, 5, (8,)))
    with pytest.raises(ValueError, match="scalar"):
        DataParallelCriterion(nn.CrossEntropyLoss(reduction="none"), devs)(outputs, torch.randint(0, 5, (8,)))
    with pytest.raises(ValueError, match="only 2 devices"):
        DataParallelCriterion(F.cross_entropy, devs[:2])(outputs, torch.randint(0, 5, (8,)))
    with pytest.raises(TypeError, match=r"logical_devices\(2\)"):
        DataParallelCriterion(F.cross_entropy, ["cuda:0", "cuda:1"])
    with pytest.raises(TypeError, match="logical_devices"):
        DataParallelModel(MLP([6, 5]), ["cpu"])
    with pytest.raises(ValueError, match="reduction"):
        DataParallelCriterion(F.cross_entropy, devs, reduction="avg")
