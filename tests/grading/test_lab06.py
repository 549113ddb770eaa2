"""gpulab.grading.lab06 (lab 06's graders) and the sampler's rank bodies: the graders return what the
student's code produced (in the kernel or in the ranks), and the values they return tell right code
from wrong against the expected values the reference functions next to them compute."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gpulab.grading import lab06
from gpulab.grading.lab06 import (
    compare_with_single_process,
    run_amp_steps,
    run_ddp_wrapping,
    single_process_wrapping,
)
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
from gpulab.parallel.sampler import DistributedSampler
from gpulab.parallel.workloads.ddp_examples import torch_ddp_steps


def _close(a, b, atol=1e-6):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], atol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, atol) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and bool((a - b).abs().max() <= atol) if a.numel() else a.shape == b.shape
    return abs(a - b) <= atol if isinstance(a, float) else a == b


def _sum_only(model, world_size):  # forgets to divide by world_size
    for p in model.parameters():
        dist.all_reduce(p.grad)


def test_compare_with_single_process_separates_right_from_wrong():
    assert compare_with_single_process(allreduce_gradients, 2).worst < 1e-6
    assert compare_with_single_process(lambda m, w: None, 2).worst > 1e-3, "no synchronisation must be caught"
    assert compare_with_single_process(_sum_only, 2).worst > 1e-3, "a sum instead of a mean must be caught"


def test_sampler_cases_are_seeded_and_torch_gives_the_expected_shards():
    a, b = lab06.sampler_cases(random.Random(1)), lab06.sampler_cases(random.Random(2))
    assert a == lab06.sampler_cases(random.Random(1)) and a != b and len(a) == 4 * 11
    ours = lab06.sampler_shards(DistributedSampler, a)
    assert ours == lab06.sampler_shards(torch.utils.data.DistributedSampler, a)
    assert all(shard == ([], 0) for name, shard in ours.items() if name.startswith("n=0,"))


def test_loader_facts_match_the_loader_the_exercise_describes():
    cases = lab06.loader_cases(random.Random(3))

    def right(dataset, rank, world_size, global_batch_size=8, total_workers=2, seed=0):
        return torch.utils.data.DataLoader(dataset, batch_size=global_batch_size // world_size,
                                           num_workers=total_workers // world_size,
                                           sampler=DistributedSampler(dataset, world_size, rank, seed=seed))

    def no_shuffle(dataset, rank, world_size, global_batch_size=8, total_workers=2, seed=0):
        return torch.utils.data.DataLoader(dataset, batch_size=global_batch_size // world_size,
                                           num_workers=total_workers // world_size,
                                           sampler=DistributedSampler(dataset, world_size, rank, shuffle=False))

    assert lab06.loader_facts(right, cases) == lab06.expected_loader_facts(cases)
    assert lab06.loader_facts(no_shuffle, cases) != lab06.expected_loader_facts(cases)


def test_torch_rank_loader_is_the_demo_fallback_and_not_an_answer():
    loader = lab06.torch_rank_loader(torch.arange(40), 1, 4, global_batch_size=8, total_workers=6, seed=3)
    assert (loader.batch_size, loader.num_workers, len(loader)) == (2, 1, 5)
    assert type(loader.sampler) is torch.utils.data.DistributedSampler   # not the student's: the visible check fails it
    with pytest.raises(ValueError, match="not divisible"):
        lab06.torch_rank_loader(torch.arange(40), 0, 4, global_batch_size=10)


def _fp32_step(model, inputs, targets, loss_fn, optimizer, scaler, device):
    optimizer.zero_grad()
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def test_run_amp_steps_returns_the_dtypes_and_the_training():
    ours = run_amp_steps(amp_step, 2, num_steps=3, seed=5)
    assert ours[0]["forward_dtypes"] == ["torch.bfloat16"] and ours[0]["param_dtypes"] == ["torch.float32"]
    assert _close(ours, lab06.amp_reference(2, 3, 5)), "the same step on the same seed gives the same values"
    assert not _close(ours, run_amp_steps(amp_step, 2, num_steps=3, seed=6), atol=1e-4), "the seed changes the data"
    plain = run_amp_steps(_fp32_step, 2, num_steps=3, seed=5)[0]
    assert plain["forward_dtypes"] == ["torch.float32"], "a step without autocast must be visible"


@pytest.mark.multigpu
def test_on_two_gpus_the_amp_grader_runs_nccl_with_bf16_autocast():
    from gpulab.parallel import resolve_backend

    assert resolve_backend("auto", 2) == "nccl"
    ours = run_amp_steps(amp_step, 2, num_steps=3, seed=5)
    assert ours[0]["forward_dtypes"] == ["torch.bfloat16"] and ours[0]["param_dtypes"] == ["torch.float32"]
    assert _close(ours, lab06.amp_reference(2, 3, 5), atol=1e-4)


def _wrap_always(model, device, inputs):
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)


def _wrap_detect(model, device, inputs):
    return nn.parallel.DistributedDataParallel(model, find_unused_parameters=bool(unused_parameters(model, inputs)))


def test_run_ddp_wrapping_reports_the_flag_and_the_training():
    expected = single_process_wrapping(2, 3, 7)
    res = run_ddp_wrapping(_wrap_detect, 2, seed=7)
    assert res["unused_branch"]["find_unused"] == [True, True] and res["all_used"]["find_unused"] == [False, False]
    assert _close(res, expected, atol=1e-6)
    assert run_ddp_wrapping(_wrap_always, 2, seed=7)["all_used"]["find_unused"] != expected["all_used"]["find_unused"]


def test_gated_models_have_unused_and_frozen_parameters():
    models = lab06.gated_models(random.Random(4), n=12)
    found = {name: unused_parameters(m, x) for name, (m, x) in models.items()}
    assert any(found.values()) and not all(found.values())
    assert any(not p.requires_grad for m, _ in models.values() for p in m.parameters())


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

def _matches(runs, cases, world_size, num_steps=3, seed=1, atol=1e-6):
    """Which cases of a run_ddp_class result equal one process (parameters and .grad None)."""
    return {label: _close(runs[label], lab06.single_process_run(m, world_size, num_steps, seed), atol)
            for label, m, _ in cases}


def test_run_ddp_class_returns_every_rank_equal_to_one_process_for_right_classes():
    from .lab06_classes import Bucketed, PerParameter

    for cls, cases in ((PerParameter, lab06.PER_PARAMETER_CASES), (Bucketed, lab06.BUCKETED_CASES)):
        runs = lab06.run_ddp_class(cls, cases, 2, perturb=True, seed=11)
        assert all(_matches(runs, cases, 2, seed=11).values()), cls.__name__
    assert runs["unused parameter, 3 buckets"]["grad_none"] == [["aux_head.weight", "aux_head.bias"]] * 2
    three = lab06.run_ddp_class(Bucketed, lab06.BUCKETED_CASES[:2], 3, num_steps=4, seed=12)
    assert all(_matches(three, lab06.BUCKETED_CASES[:2], 3, 4, 12).values())
    assert not any(_matches(three, lab06.BUCKETED_CASES[:2], 3, 4, 13, atol=1e-4).values()), "the seed changes the data"


def test_run_ddp_class_catches_each_wrong_class():
    from .lab06_classes import BucketedZeroFill, PerParameterNoBroadcast, PerParameterSum

    cases = lab06.PER_PARAMETER_CASES[:1]
    assert not _matches(lab06.run_ddp_class(PerParameterSum, cases, 2), cases, 2, atol=1e-3)["MLP"], "a sum, not a mean"
    assert not _matches(lab06.run_ddp_class(PerParameterNoBroadcast, cases, 2, perturb=True), cases, 2, atol=1e-3)["MLP"], \
        "replicas that start apart"
    label, model, _ = case = lab06.BUCKETED_CASES[-1]
    zero = lab06.run_ddp_class(BucketedZeroFill, [case], 2)[label]
    expected = lab06.single_process_run(model, 2)
    assert zero["grad_none"] == [[], []] != expected["grad_none"], "weight decay moves a zero-filled unused parameter"
    assert not _close(zero["params"], expected["params"], 1e-5)
    # (the shared-weight case has no such test: the plausible slips there, a weight listed or hooked twice,
    # stay correct when the bookkeeping is keyed by the parameter, as the lab's skeleton suggests)


def _early(trace):
    return min(t["early_elements"] for t in trace)


def test_trace_overlap_tells_overlap_from_waiting_for_the_end():
    from .lab06_classes import Bucketed, BucketedAllInFinish, BucketedPerParameterCalls, PerParameter

    plan = lab06.overlap_plan()
    assert plan["buckets"] == 3 and plan["num_params"] == 14
    good = lab06.trace_overlap(Bucketed)
    assert _early(good) >= plan["min_elements"]
    assert [t["calls"] for t in good] == [plan["buckets"] + 1] * 2, "a call per bucket, and one for the used flags"
    late = lab06.trace_overlap(BucketedAllInFinish)
    assert _early(late) == 0 and [t["calls"] for t in late] == [4, 4], "the same calls, all after backward"
    assert lab06.trace_overlap(BucketedPerParameterCalls)[0]["calls"] == plan["num_params"] + 1
    per_parameter = lab06.trace_overlap(PerParameter, None)
    assert _early(per_parameter) >= plan["min_elements"] and per_parameter[0]["calls"] == plan["num_params"]
    assert _early(lab06.trace_overlap(lambda m, mb: NaiveDDPNoHooks(m))) == 0


def test_overlap_case_draws_a_model_whose_first_bucket_starts_early():
    from .lab06_classes import Bucketed

    cfg, mb = lab06.overlap_case(random.Random(5), layers_per_bucket=1.1)
    plan = lab06.overlap_plan(mb, cfg)
    assert plan["buckets"] >= 3 and plan["min_elements"] == 10 * cfg.width
    trace = lab06.trace_overlap(Bucketed, mb, 3, cfg=cfg)
    assert _early(trace) >= plan["min_elements"] and trace[0]["calls"] == plan["buckets"] + 1


def test_the_calls_rule_plans_the_contracts_buckets_from_plain_sizes():
    from gpulab.verdict import rules
    from gpulab.verdict.lab06 import fewest_buckets

    from .lab06_classes import Bucketed, BucketedPerParameterCalls

    for cfg, mb in ((lab06.OVERLAP_CFG, lab06.OVERLAP_BUCKET_MB), (lab06.SPEED_CFG, 1.0), (lab06.SPEED_CFG, 0.25),
                    (lab06.SPEED_CFG, 2.0), (*lab06.overlap_case(random.Random(5), layers_per_bucket=1.1),)):
        plan = lab06.overlap_plan(mb, cfg)
        assert fewest_buckets(lab06.gradient_bytes(cfg), mb) == plan["buckets"], (cfg, mb)
        assert 10 * cfg.width == plan["min_elements"], "the bound the test cells write: the classifier's weight"

    def judge(calls, mb=1.0):
        return rules.judge("lab06.calls_per_step", calls, None, sizes=lab06.gradient_bytes(lab06.SPEED_CFG), bucket_mb=mb)

    buckets = lab06.overlap_plan(1.0, lab06.SPEED_CFG)["buckets"]
    assert judge(buckets) is None and judge(buckets + 1) is None
    assert "fewer than" in judge(buckets - 1) and "at most one more" in judge(buckets + 2)
    assert "expected a number" in judge(True) and "could not be judged" in judge(3, mb=0)
    # the timed model's cell: gpulab-style buckets pass, one call per parameter fails
    mb = lab06.SPEED_CFG.bucket_size_mb
    good = lab06.trace_overlap(Bucketed, mb, cfg=lab06.SPEED_CFG)
    assert judge(max(t["calls"] for t in good)) is None
    per_parameter = lab06.trace_overlap(BucketedPerParameterCalls, mb, cfg=lab06.SPEED_CFG)
    assert "at most one more" in judge(max(t["calls"] for t in per_parameter))


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


def test_bucketing_run_is_seeded_and_depends_on_every_synchronisation():
    from .lab06_classes import Bucketed, PerParameter

    cfg = type(lab06.SPEED_CFG)(width=32, depth=4, batch_size=8, num_steps=3, warmup=1, bucket_size_mb=0.01)
    bucketed = lab06.bucketing_run(Bucketed, 3, cfg.bucket_size_mb, cfg=cfg)
    assert len(bucketed) == cfg.warmup + cfg.num_steps + 2 and bucketed[-1] == bucketed[-2], "every rank ends equal"
    assert _close(bucketed, lab06.bucketing_run(PerParameter, 3, cfg=cfg), 1e-6), "the same training, whichever class"
    assert not _close(bucketed, lab06.bucketing_run(Bucketed, 4, cfg.bucket_size_mb, cfg=cfg), 1e-4), "the seed matters"
    unsynced = lab06.bucketing_run(lambda m, mb: NoSync(m), 3, cfg.bucket_size_mb, cfg=cfg)
    assert not _close(unsynced, bucketed, 1e-4), "skipping the all-reduce changes the result"


class NoSync(NaiveDDPNoHooks):
    def finish(self):
        pass


def test_a_class_that_returns_torch_ddp_or_has_no_finish_is_refused():
    cases = lab06.PER_PARAMETER_CASES[:1]
    with pytest.raises(RankFailedError, match="write the class yourself"):
        lab06.run_ddp_class(lambda m: nn.parallel.DistributedDataParallel(m), cases, 2)
    with pytest.raises(RankFailedError, match="no finish"):
        lab06.run_ddp_class(lambda m: m, cases, 2)


def test_references_are_the_exercises_answers_and_leave_the_demos_working():
    from gpulab.parallel import BucketedDDP, NaiveDDP, OverlappedDDP, bucket_assignment
    from gpulab.parallel.ddp import rebuild
    from gpulab.parallel.measure import ring_cost
    from gpulab.parallel.workloads import spawn_job

    assert set(lab06.REFERENCES) == {OverlappedDDP, BucketedDDP, lab06._Bucket, bucket_assignment, amp_step,
                                     unused_parameters, ring_cost.fit_alpha_beta, ring_cost.predict_sync_seconds,
                                     ring_cost.best_bucket_size, rebuild.ready_order, rebuild.rebuilt_buckets,
                                     spawn_job.single_process_training}
    # the instruments and workloads the new sections' demos use stay available
    assert not {ring_cost.allreduce_seconds, ring_cost.backward_seconds, ring_cost.ring_allreduce_seconds,
                rebuild.torch_ddp_buckets, rebuild.head_first_net, spawn_job.make_job} & set(lab06.REFERENCES)
    assert NaiveDDP not in lab06.REFERENCES and DistributedSampler not in lab06.REFERENCES  # the demos train them
