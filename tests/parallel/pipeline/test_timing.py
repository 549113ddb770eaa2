"""gpulab.parallel.pipeline.timing: intra-op threads are restored, and train_step is one SGD step of the
whole model. No test depends on machine speed. (The interleaved timer it re-exports is tested in
tests/profiling/test_interleave.py.)"""

from __future__ import annotations

import copy
import threading

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, split_model
from gpulab.parallel.pipeline.timing import intra_op_threads, train_step


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


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
