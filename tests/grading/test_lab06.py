"""gpulab.grading.lab06 (lab 06's graders) and the sampler's rank bodies: they pass correct
code, fail wrong code, and catch calls to the reference inside the ranks."""

from __future__ import annotations

import os

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


# --- the student's DDP classes (lab06_ddp): equality, overlap, speed --------------------------------

def test_check_ddp_class_passes_right_classes_and_reports_grad_none():
    from gpulab.grading.lab06 import BUCKETED_CASES, PER_PARAMETER_CASES, REFERENCES, check_ddp_class

    from .lab06_classes import Bucketed, PerParameter

    for cls, cases in ((PerParameter, PER_PARAMETER_CASES), (Bucketed, BUCKETED_CASES)):
        res = check_ddp_class(cls, cases, 2, perturb=True, forbidden=REFERENCES)
        assert res.worst_case()[1] < 1e-6, (cls.__name__, str(res))
        for label in res.max_abs_diff:
            assert all(none == res.expected_none[label] for none in res.grad_none[label]), label
    assert res.expected_none["unused parameter, 3 buckets"] == ["aux_head.weight", "aux_head.bias"]


def test_check_ddp_class_catches_each_wrong_class():
    from gpulab.grading.lab06 import BUCKETED_CASES, PER_PARAMETER_CASES, check_ddp_class

    from .lab06_classes import BucketedZeroFill, PerParameterNoBroadcast, PerParameterSum

    summed = check_ddp_class(PerParameterSum, PER_PARAMETER_CASES[:1], 2)
    assert summed.max_abs_diff["MLP"] > 1e-3, "a sum instead of a mean"
    assert check_ddp_class(PerParameterNoBroadcast, PER_PARAMETER_CASES[:1], 2, perturb=True).max_abs_diff["MLP"] > 1e-3, \
        "replicas that start apart"
    zero = check_ddp_class(BucketedZeroFill, BUCKETED_CASES[-1:], 2)
    label = BUCKETED_CASES[-1][0]
    assert zero.max_abs_diff[label] > 1e-5, "weight decay moves a zero-filled unused parameter"
    assert zero.grad_none[label][0] == [] != zero.expected_none[label]
    # (the shared-weight case has no such test: the plausible slips there, a weight listed or hooked twice,
    # stay correct when the bookkeeping is keyed by the parameter, as the lab's skeleton suggests)


def test_trace_overlap_tells_overlap_from_waiting_for_the_end():
    from gpulab.grading.lab06 import trace_overlap

    from .lab06_classes import Bucketed, BucketedAllInFinish, BucketedPerParameterCalls, PerParameter

    good = trace_overlap(Bucketed)
    assert good.overlapped and good.plan_buckets == 3
    assert len(good.all_reduces()) == good.plan_buckets + 1, "a call per bucket, and one for the used flags"
    late = trace_overlap(BucketedAllInFinish)
    assert not late.overlapped and late.early == [(0, 0), (0, 0)]
    assert len(late.all_reduces()) == 4, "the same calls, all after backward"
    assert len(trace_overlap(BucketedPerParameterCalls).all_reduces()) == late.num_params + 1
    per_parameter = trace_overlap(PerParameter, None)
    assert per_parameter.overlapped and len(per_parameter.all_reduces()) == per_parameter.num_params
    assert not trace_overlap(lambda m, mb: NaiveDDPNoHooks(m)).overlapped


class NaiveDDPNoHooks(nn.Module):
    """All-reduce after backward, one tensor at a time (gpulab's NaiveDDP, written as a student would)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return self.module(x)

    def finish(self):
        for p in self.module.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()


def test_measure_bucketing_speedup_times_every_variant_in_one_launch():
    from gpulab.grading.lab06_ddp import SPEED_CFG, measure_bucketing_speedup

    from .lab06_classes import Bucketed, PerParameter

    cfg = type(SPEED_CFG)(width=32, depth=4, batch_size=8, num_steps=3, warmup=1, bucket_size_mb=0.01)
    m = measure_bucketing_speedup(PerParameter, Bucketed, cfg=cfg)
    assert set(m.times) == {"per-parameter (yours)", "bucketed (yours)", "per-parameter (gpulab)", "bucketed (gpulab)",
                            "local"}
    assert m.yours == m.times["per-parameter (yours)"] / m.times["bucketed (yours)"] > 0
    assert m.reference == m.times["per-parameter (gpulab)"] / m.times["bucketed (gpulab)"] > 0
    assert 0 < m.cores <= 2 * 1.05 * os.cpu_count()


def test_a_class_that_returns_torch_ddp_or_has_no_finish_is_refused():
    from gpulab.grading.lab06 import PER_PARAMETER_CASES, check_ddp_class

    with pytest.raises(RankFailedError, match="write the class yourself"):
        check_ddp_class(lambda m: nn.parallel.DistributedDataParallel(m), PER_PARAMETER_CASES[:1], 2)
    with pytest.raises(RankFailedError, match="no finish"):
        check_ddp_class(lambda m: m, PER_PARAMETER_CASES[:1], 2)
