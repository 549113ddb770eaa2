"""gpulab.grading.lab06 (lab 06's graders) and the sampler's rank bodies: they pass correct
code, fail wrong code, and catch calls to the reference inside the ranks."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpulab.grading.lab06 import check_ddp_wrapping, compare_amp_steps, compare_with_single_process
from gpulab.parallel import (
    BranchyNet,
    RankFailedError,
    allreduce_gradients,
    amp_step,
    distributed_accuracy,
    epoch_orders,
    launch,
    unused_parameters,
)
from gpulab.parallel.ddp.examples import torch_ddp_steps


def _sum_only(model, world_size):  # forgets to divide by world_size
    for p in model.parameters():
        dist.all_reduce(p.grad)


def test_compare_with_single_process_separates_right_from_wrong():
    assert compare_with_single_process(allreduce_gradients, 2).worst < 1e-6
    assert compare_with_single_process(lambda m, w: None, 2).worst > 1e-3, "no synchronisation must be caught"
    assert compare_with_single_process(_sum_only, 2).worst > 1e-3, "a sum instead of a mean must be caught"


def test_forbidden_reference_is_caught_inside_the_ranks():
    with pytest.raises(RankFailedError, match="calls gpulab's reference"):
        compare_with_single_process(lambda m, w: allreduce_gradients(m, w), 2, forbidden=[allreduce_gradients])


def _fp32_step(model, inputs, targets, loss_fn, optimizer, scaler, device):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_compare_amp_steps_sees_the_autocast_dtype():
    ours = compare_amp_steps(amp_step, 2)[0]
    assert set(ours["yours"]["forward_dtypes"]) == {"torch.bfloat16"}
    for n, p in ours["reference"]["params"].items():
        torch.testing.assert_close(ours["yours"]["params"][n], p)
    plain = compare_amp_steps(_fp32_step, 2)[0]["yours"]
    assert set(plain["forward_dtypes"]) == {"torch.float32"}, "a step without autocast must be visible"


def _wrap_always(model, device, inputs):
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def _wrap_detect(model, device, inputs):
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=bool(unused_parameters(model, inputs)))


def test_check_ddp_wrapping_reports_the_flag_and_the_training():
    res = check_ddp_wrapping(_wrap_detect, 2)
    assert res["unused_branch"]["find_unused"] and not res["all_used"]["find_unused"]
    assert res["unused_branch"]["max_abs_diff"] < 1e-6 and res["all_used"]["max_abs_diff"] < 1e-6
    assert check_ddp_wrapping(_wrap_always, 2)["all_used"]["find_unused"]


def test_torch_ddp_without_the_flag_fails_on_an_unused_branch():
    with pytest.raises(RankFailedError, match="find_unused_parameters=True"):
        launch(torch_ddp_steps, 2, args=(False,), echo=False)
    params = launch(torch_ddp_steps, 2, args=(True,), echo=False)
    torch.testing.assert_close(params[0]["aux_head.weight"], BranchyNet().aux_head.weight)


def _loader(dataset, rank, world_size):
    from gpulab.parallel import DistributedSampler
    return torch.utils.data.DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, world_size, rank))


def test_epoch_orders_shows_the_set_epoch_pitfall():
    without = launch(epoch_orders, 2, args=(_loader, 16, 3, False), echo=False)
    with_ = launch(epoch_orders, 2, args=(_loader, 16, 3, True), echo=False)
    assert without[0][0] == without[0][1] == without[0][2]
    assert with_[0][0] != with_[0][1]
    assert sorted(with_[0][1] + with_[1][1]) == list(range(16))


def test_distributed_accuracy_padding_skew():
    correct = [True] * 5 + [False] * 5
    assert launch(distributed_accuracy, 3, args=(correct, True), echo=False)[0] == pytest.approx(7 / 12)
    assert launch(distributed_accuracy, 3, args=(correct, False), echo=False) == [0.5, 0.5, 0.5]
