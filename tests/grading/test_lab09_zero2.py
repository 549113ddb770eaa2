"""Lab 09's ZeRO-2 graders: a right ZeRO-2 gives what the reference functions expect, and each wrong
one (DDP's all-reduce under it, a full gradient buffer kept, torch's ZeRO wrapped, the state not
sharded) differs from the reference in the evidence its test cell checks."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from gpulab.grading import lab09_zero2 as z2
from gpulab.parallel.sharding.accumulation import COUNTED


class Right:
    """A correct ZeRO-2 written the way the lab asks (its own flattening, padding and copy back)."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.params, self.rank, self.world_size = list(params), dist.get_rank(), dist.get_world_size()
        numel = sum(p.numel() for p in self.params)
        self.size = math.ceil(numel / self.world_size)
        self.padding = self.size * self.world_size - numel
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for p in self.params] + [torch.zeros(self.padding)])
        self.shard = flat[self.rank * self.size:(self.rank + 1) * self.size].clone()
        self.local_optimizer = optimizer_cls([self.shard], **kwargs)

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None

    def _flat_grad(self):
        return torch.cat([p.grad.reshape(-1) for p in self.params] + [torch.zeros(self.padding)])

    def _gather(self):
        flat = torch.empty(self.size * self.world_size)
        dist.all_gather_into_tensor(flat, self.shard)
        pieces = flat[:self.size * self.world_size - self.padding].split([p.numel() for p in self.params])
        for p, piece in zip(self.params, pieces):
            p.copy_(piece.view_as(p))

    @torch.no_grad()
    def step(self):
        self.shard.grad = torch.empty_like(self.shard)
        dist.reduce_scatter_tensor(self.shard.grad, self._flat_grad(), op=dist.ReduceOp.AVG)
        self.local_optimizer.step()
        self._gather()


class AllReduceFirst(Right):
    """Right parameters, but DDP's all-reduce of the whole gradient, then the shard cut out of it."""

    @torch.no_grad()
    def step(self):
        flat = self._flat_grad()
        dist.all_reduce(flat)
        self.shard.grad = flat[self.rank * self.size:(self.rank + 1) * self.size] / self.world_size
        self.local_optimizer.step()
        self._gather()


class KeepsFullGradient(Right):
    """Right parameters and calls, but the full-size gradient buffer outlives the step."""

    @torch.no_grad()
    def step(self):
        self.flat_grad = self._flat_grad()
        self.shard.grad = torch.empty_like(self.shard)
        dist.reduce_scatter_tensor(self.shard.grad, self.flat_grad, op=dist.ReduceOp.AVG)
        self.local_optimizer.step()
        self._gather()


class TorchZero:
    """torch's ZeroRedundancyOptimizer over DDP-style averaged gradients: refused."""

    def __init__(self, params, optimizer_cls, **kwargs):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.params = list(params)
        self.local_optimizer = ZeroRedundancyOptimizer(self.params, optimizer_class=optimizer_cls, **kwargs)

    def zero_grad(self, set_to_none=True):
        self.local_optimizer.zero_grad()

    @torch.no_grad()
    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()
        self.local_optimizer.step()


class Replicated(AllReduceFirst):
    """Right parameters, but the optimizer state of the whole model on every rank."""

    def __init__(self, params, optimizer_cls, **kwargs):
        super().__init__(params, optimizer_cls, **kwargs)
        self.local_optimizer = optimizer_cls(self.params, **kwargs)

    @torch.no_grad()
    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        self.local_optimizer.step()


def _close(a, b, atol=1e-5):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], atol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y, atol) for x, y in zip(a, b))
    return a.shape == b.shape and bool((a - b).abs().max() <= atol)


def _evidence(runs):
    return ([r["calls"] for r in runs], [r["c10d_ops"] for r in runs], [r["state_bytes"] for r in runs],
            [r["refused_built"] for r in runs])


@pytest.mark.parametrize("ws, model, opt", [(2, "mlp", "adamw"), (3, "mlp", "adamw"), (3, "tied", "sgd")])
def test_a_right_zero2_gives_the_expected_evidence(ws, model, opt):
    runs = z2.run_zero2(Right, ws, model=model, optimizer=opt, seed=5)
    ref = z2.reference_zero2(ws, model, opt, 3, 5)
    single = z2.single_process_params(model, opt, 3, 5)
    assert _close([r["params"] for r in runs], [single] * ws)
    assert _close([r["params"] for r in ref], [single] * ws), "the reference trains like one process"
    assert _close([r["shard"] for r in runs], z2.expected_shards(ws, model, opt, 3, 5))
    assert _close([r["shard"] for r in ref], z2.expected_shards(ws, model, opt, 3, 5))
    assert _evidence(runs) == _evidence(ref)
    assert max(r["held_bytes"] for r in runs) <= max(r["held_bytes"] for r in ref)
    once = {k: 0 for k in COUNTED} | {"reduce_scatter_tensor": 1, "all_gather_into_tensor": 1}
    assert [r["calls"] for r in ref] == [[once] * 3] * ws and [r["c10d_ops"] for r in ref] == [[2] * 3] * ws
    assert [r["refused_built"] for r in ref] == [dict.fromkeys(z2.REFUSED, 0)] * ws
    shard = math.ceil(sum(p.numel() for p in single.values()) / ws)
    per_state = 8 * shard + 4 if opt == "adamw" else 4 * shard
    assert [r["state_bytes"] for r in ref] == [per_state] * ws, "the state of one shard"
    assert [r["held_bytes"] for r in ref] == [per_state + 2 * 4 * shard] * ws, "master shard and its gradient"


def test_seeds_change_the_data():
    assert not _close([r["params"] for r in z2.reference_zero2(2, "mlp", "adamw", 3, 6)],
                      [z2.single_process_params("mlp", "adamw", 3, 5)] * 2, atol=1e-4)


def test_wrong_zero2s_are_caught():
    ref = z2.reference_zero2(2, "mlp", "adamw", 3, 5)
    single = [z2.single_process_params("mlp", "adamw", 3, 5)] * 2
    ref_held = max(r["held_bytes"] for r in ref)
    all_reduce = z2.run_zero2(AllReduceFirst, 2, seed=5)
    assert _close([r["params"] for r in all_reduce], single), "right parameters..."
    assert [r["calls"] for r in all_reduce] != [r["calls"] for r in ref], "...but DDP's all-reduce"
    keeps = z2.run_zero2(KeepsFullGradient, 2, seed=5)
    assert _close([r["params"] for r in keeps], single) and _evidence(keeps) == _evidence(ref), "right parameters and calls..."
    assert max(r["held_bytes"] for r in keeps) > ref_held, "...but a full-size gradient kept"
    torch_zero = z2.run_zero2(TorchZero, 2, seed=5)
    assert _close([r["params"] for r in torch_zero], single)
    assert [r["refused_built"]["ZeroRedundancyOptimizer"] for r in torch_zero] == [1, 1]
    replicated = z2.run_zero2(Replicated, 2, seed=5)
    assert _close([r["params"] for r in replicated], single)
    assert [r["state_bytes"] for r in replicated] != [r["state_bytes"] for r in ref]
    assert not _close([r["shard"] for r in replicated], z2.expected_shards(2, "mlp", "adamw", 3, 5))


def test_held_bytes_counts_a_view_as_its_whole_buffer():
    from torch import nn

    model = nn.Linear(4, 4)

    class Holder:
        pass

    h = Holder()
    h.flat = torch.zeros(100)
    h.shard = h.flat[:10]  # a view: the 100-element storage is what stays alive
    h.params = list(model.parameters())  # the model's own: not counted
    h.nested = {"a": [h.shard, (torch.ones(3),)]}
    assert z2._held_bytes(h, model) == 400 + 12
