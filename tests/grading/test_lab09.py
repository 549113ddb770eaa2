"""Lab 09's graders tell a right ZeRO-1 / accumulation step from wrong ones, and catch the reference."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from gpulab.grading.lab09 import REFERENCES, check_zero1, run_accumulation
from gpulab.parallel import RankFailedError, ShardedOptimizer
from gpulab.parallel.ddp.accumulation import accumulation_step
from gpulab.parallel.ddp.sharded import balanced_owners


class Right:
    """A correct ZeRO-1 written the way the lab asks (its own partition, broadcast per tensor)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params, self.rank, world_size = list(params), dist.get_rank(), dist.get_world_size()
        load, self.owners = [0] * world_size, [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: -self.params[i].numel()):
            r = load.index(min(load))
            self.owners[i], load[r] = r, load[r] + self.params[i].numel()
        self.local_optimizer = optimizer_cls([{"params": [p for p, o in zip(self.params, self.owners) if o == self.rank]}],
                                             **kwargs)

    def zero_grad(self):
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


class CallsTheReference(ShardedOptimizer):
    pass


def test_check_zero1_passes_a_right_class_and_fails_wrong_ones():
    ok = check_zero1(Right, 2, model="tied", optimizer="adamw", forbidden=REFERENCES)
    assert ok.worst < 1e-5 and ok.state_bytes == ok.reference_state_bytes
    assert sum(ok.state_bytes) == ok.full_state_bytes
    assert check_zero1(NoBroadcast, 2).worst > 1e-3, "without the broadcast the replicas differ"
    rep = check_zero1(Replicated, 2, optimizer="sgd")
    assert rep.worst < 1e-5 and rep.state_bytes == [rep.full_state_bytes] * 2 != rep.reference_state_bytes
    with pytest.raises(RankFailedError, match="reference"):
        check_zero1(CallsTheReference, 2, forbidden=REFERENCES)


def wrong_accumulation(model, optimizer, micro_batches, loss_fn):
    with model.no_sync():  # the last micro-batch too: nothing is ever averaged
        for x, y in micro_batches:
            (loss_fn(model(x), y) / len(micro_batches)).backward()
            model.sync_gradients()
    optimizer.step()
    optimizer.zero_grad()


def test_run_accumulation_counts_and_compares():
    res = run_accumulation([("reference", accumulation_step), ("wrong", wrong_accumulation)], 2,
                           wrapper="bucketed", micro_batches=3, forbidden=REFERENCES)
    assert res["reference"]["all_reduce_per_step"] == res["reference"]["per_sync"] == 3
    assert res["reference"]["max_abs_diff"] < 1e-5 and res["reference"]["rank_spread"] == 0
    assert res["wrong"]["all_reduce_per_step"] == 0 and res["wrong"]["rank_spread"] > 1e-3
    with pytest.raises(ValueError, match="wrapper"):
        run_accumulation([], wrapper="fsdp")
    with pytest.raises(ValueError, match="divisible by world_size x micro_batches"):
        run_accumulation([], 4, micro_batches=4)  # 24 samples: 6 per rank do not split in 4


def test_the_reference_is_caught_inside_the_ranks():
    with pytest.raises(RankFailedError, match="accumulation_step"):
        run_accumulation([("mine", accumulation_step)], 2, forbidden=REFERENCES)
    assert balanced_owners in REFERENCES
