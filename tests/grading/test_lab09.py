"""Lab 09's graders return what a right ZeRO-1 / accumulation step produces, equal to the expected
values their reference functions compute, and what wrong ones produce, different from them."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from gpulab.grading import lab09, lab09_accumulation
from gpulab.parallel import ShardedOptimizer
from gpulab.parallel.sharding.accumulation import accumulation_step
from gpulab.parallel.sharding.zero1 import balanced_owners


def _close(a, b, atol=1e-5):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], atol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, atol) for x, y in zip(a, b))
    return bool((a - b).abs().max() <= atol)


class Right:
    """A correct ZeRO-1 written the way the lab asks (its own partition, broadcast per tensor)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params, self.rank, world_size = list(params), dist.get_rank(), dist.get_world_size()
        load, self.owners = [0] * world_size, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = load.index(min(load))
            self.owners[i], load[r] = r, load[r] + self.params[i].numel()
        self.local_optimizer = optimizer_cls(
            [{"params": [p for p, o in zip(self.params, self.owners) if o == self.rank]}], **kwargs
        )

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.local_optimizer.step()
        with torch.no_grad():
            for p, o in zip(self.params, self.owners):
                dist.broadcast(p, src=o)


class NoBroadcast(Right):
    def step(self):
        self.local_optimizer.step()


class Replicated(Right):
    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
        self.local_optimizer = optimizer_cls(self.params, **kwargs)  # everything, on every rank: DDP's memory

    def step(self):
        self.local_optimizer.step()


def test_random_partition_cases_are_seeded():
    a = lab09.random_partition_cases(random.Random(1))
    assert len(a) == 25 and list(a) == list(lab09.random_partition_cases(random.Random(1)))
    assert list(a) != list(lab09.random_partition_cases(random.Random(2)))
    assert {n for _, n in a.values()} > {1}


def test_run_zero1_of_a_right_class_equals_one_process_and_the_reference():
    for model, opt, ws in (("tied", "adamw", 2), ("tiny", "sgd", 3)):
        runs = lab09.run_zero1(Right, ws, model=model, optimizer=opt, seed=7)
        assert _close([r["params"] for r in runs], [lab09.single_process_params(model, opt, 3, 7)] * ws), (model, ws)
        ref = lab09.reference_zero1(ws, model, opt, 3, 7)
        assert [(r["local_params"], r["state_bytes"]) for r in runs] == [
            (r["local_params"], r["state_bytes"]) for r in ref
        ]
    assert [r["local_params"] for r in lab09.reference_zero1(3, "tiny", "sgd", 3, 7)][2] == [], (
        "more ranks than tensors"
    )
    assert not _close(
        [r["params"] for r in lab09.run_zero1(Right, 2, seed=8)],
        [lab09.single_process_params("mlp", "adamw", 3, 7)] * 2,
        atol=1e-4,
    ), "the seed changes the data"


def test_run_zero1_of_wrong_classes_differs():
    ones = [lab09.single_process_params("mlp", "adamw", 3)] * 2
    assert not _close([r["params"] for r in lab09.run_zero1(NoBroadcast, 2)], ones, atol=1e-3), "the replicas differ"
    rep = lab09.run_zero1(Replicated, 2, optimizer="sgd")
    assert _close([r["params"] for r in rep], [lab09.single_process_params("mlp", "sgd", 3)] * 2)
    ref = lab09.reference_zero1(2, "mlp", "sgd")
    assert [r["local_params"] for r in rep] == [list(range(6))] * 2 != [r["local_params"] for r in ref]
    assert [r["state_bytes"] for r in rep] != [r["state_bytes"] for r in ref], "DDP's memory, not ZeRO-1's"


def test_a_class_without_local_optimizer_is_refused():
    class NoLocal(Right):
        def __init__(self, params, optimizer_cls, **kwargs):
            super().__init__(params, optimizer_cls, **kwargs)
            self.opt, self.local_optimizer = self.local_optimizer, None

        def step(self):
            self.opt.step()

    from gpulab.parallel import RankFailedError

    with pytest.raises(RankFailedError, match="local_optimizer"):
        lab09.run_zero1(NoLocal, 2)


def test_measured_bytes_of_a_right_class_are_gpulabs():
    assert lab09.measure_zero1_bytes(Right, 2, 4, 3) == lab09.reference_zero1_bytes(2, 4, 3)
    full = lab09.measure_zero1_bytes(Replicated, 2, 4, 3)
    assert full != lab09.reference_zero1_bytes(2, 4, 3)
    assert (
        full[0]["optimizer_state"]
        == full[1]["optimizer_state"]
        > lab09.reference_zero1_bytes(2, 4, 3)[0]["optimizer_state"]
    )


def wrong_accumulation(model, optimizer, micro_batches, loss_fn):
    with model.no_sync():  # the last micro-batch too: nothing is ever averaged
        for x, y in micro_batches:
            (loss_fn(model(x), y) / len(micro_batches)).backward()
            model.sync_gradients()
    optimizer.step()
    optimizer.zero_grad()


def test_run_accumulation_counts_and_returns_every_ranks_parameters():
    res = lab09_accumulation.run_accumulation(
        [("right", accumulation_step), ("wrong", wrong_accumulation), ("every", lab09_accumulation.every_micro_batch)],
        2,
        wrapper="bucketed",
        micro_batches=3,
        seed=5,
    )
    expected = lab09_accumulation.single_process_accumulation(2, seed=5)
    assert (
        res["right"]["all_reduce_per_step"]
        == res["right"]["per_sync"]
        == lab09_accumulation.calls_per_sync("bucketed")
        == 3
    )
    assert res["every"]["all_reduce_per_step"] == 3 * lab09_accumulation.calls_per_sync("bucketed")
    assert _close(res["right"]["params"], expected) and _close(res["every"]["params"], expected)
    assert res["wrong"]["all_reduce_per_step"] == 0 and not _close(res["wrong"]["params"], expected, atol=1e-3)
    assert res["right"]["rank_spread"] == 0 and res["wrong"]["rank_spread"] > 1e-3
    naive = lab09_accumulation.run_accumulation([("right", accumulation_step)], 2, wrapper="naive", micro_batches=2)[
        "right"
    ]
    assert naive["all_reduce_per_step"] == lab09_accumulation.calls_per_sync("naive") == 6
    assert _close(naive["params"], lab09_accumulation.single_process_accumulation(2))
    with pytest.raises(ValueError, match="wrapper"):
        lab09_accumulation.run_accumulation([], wrapper="fsdp")
    with pytest.raises(ValueError, match="divisible by world_size x micro_batches"):
        lab09_accumulation.run_accumulation([], 4, micro_batches=4)  # 24 samples: 6 per rank do not split in 4


def test_references_are_the_exercises_answers():
    from gpulab.parallel.sharding.fsdp import apply_fsdp
    from gpulab.parallel.sharding.zero1 import _assign
    from gpulab.parallel.sharding.zero2 import ZeRO2Optimizer

    assert set(lab09.REFERENCES) == {
        ShardedOptimizer,
        balanced_owners,
        _assign,
        ZeRO2Optimizer,
        accumulation_step,
        apply_fsdp,
    }


@pytest.mark.multigpu
def test_on_two_gpus_the_zero1_grader_runs_nccl_and_trains_like_one_process():
    """The grader's ranks take nccl where every rank owns a GPU (its tolerance: 1e-4, GPU kernels
    round differently from the single CPU process it compares with)."""
    from gpulab.parallel import resolve_backend

    assert resolve_backend("auto", 2) == "nccl"
    runs = lab09.run_zero1(Right, 2, seed=7)
    assert _close([r["params"] for r in runs], [lab09.single_process_params("mlp", "adamw", 3, 7)] * 2, atol=1e-4)
    res = lab09_accumulation.run_accumulation([("right", accumulation_step)], 2, wrapper="naive", micro_batches=2)[
        "right"
    ]
    assert res["all_reduce_per_step"] == lab09_accumulation.calls_per_sync("naive"), (
        "one synchronisation per step, on nccl too"
    )
    assert _close(res["params"], lab09_accumulation.single_process_accumulation(2), atol=1e-4)


def test_accumulation_steps_are_timed_after_their_queued_gpu_work(monkeypatch):
    """The ranks read the clock without synchronising, so on a GPU a step timed its launches. Stand-in
    for a GPU queue: synchronize_all waits 30 ms (the forked ranks inherit the patch)."""
    import time

    from gpulab.profiling import interleave

    def wait_for_queue():
        time.sleep(0.03)

    monkeypatch.setattr(interleave, "synchronize_all", wait_for_queue)  # what timed_call waits on
    res = lab09_accumulation.run_accumulation(
        [("right", accumulation_step)], 2, wrapper="naive", micro_batches=2, num_steps=2
    )
    assert min(res["right"]["step_s"]) >= 0.03, res["right"]["step_s"]


class WrapsTorchZero:
    """A 'MyZeRO1' that wraps torch's ZeroRedundancyOptimizer: it trains right and holds its share, so
    only the count of ZeroRedundancyOptimizers built tells it apart (lab 09 did not refuse it)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.params = list(params)
        self.zero = ZeroRedundancyOptimizer(self.params, optimizer_class=optimizer_cls, **kwargs)
        self.local_optimizer = self.zero.optim

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def step(self):
        self.zero.step()


def test_a_zero1_that_wraps_torchs_is_counted():
    wrapped = lab09.run_zero1(WrapsTorchZero, 2, seed=7)
    assert _close([r["params"] for r in wrapped], [lab09.single_process_params("mlp", "adamw", 3, 7)] * 2)
    assert [r["torch ZeroRedundancyOptimizers built"] for r in wrapped] == [1, 1]
    assert [r["torch ZeroRedundancyOptimizers built"] for r in lab09.run_zero1(Right, 2, seed=7)] == [0, 0]
