"""Student-style answers to lab 06's DDP exercises, right and wrong, for the graders' tests.

The right ones are written the way the notebook's solution is (no gpulab import); each wrong one
changes one thing a student could get wrong.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def assign_buckets(params, bucket_size_mb):
    cap = bucket_size_mb * 2**20
    buckets, size = [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].numel() * params[i].element_size()
        if buckets and size + nbytes <= cap:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size = nbytes
    return buckets


class PerParameter(nn.Module):
    """Right: one async all-reduce per gradient, from its post-accumulate-grad hook."""

    def __init__(self, module):
        super().__init__()
        self.module, self.world_size, self.handles = module, dist.get_world_size(), []
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
        for p in module.parameters():
            if p.requires_grad:
                self._register(p)

    def _register(self, p):
        p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, p):
        p.grad.div_(self.world_size)
        self.handles.append(dist.all_reduce(p.grad, async_op=True))

    def finish(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()


class PerParameterSum(PerParameter):
    """Wrong: forgets to divide by the world size."""

    def _on_grad_ready(self, p):
        self.handles.append(dist.all_reduce(p.grad, async_op=True))


class PerParameterNoBroadcast(PerParameter):
    """Wrong: replicas that start different stay different."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module, self.world_size, self.handles = module, dist.get_world_size(), []
        for p in module.parameters():
            self._register(p)


class Bucketed(nn.Module):
    """Right: flat buckets, launched in order from the hooks; unused parameters as torch DDP."""

    def __init__(self, module, bucket_size_mb):
        super().__init__()
        self.module, self.world_size = module, dist.get_world_size()
        with torch.no_grad():
            for p in module.parameters():
                dist.broadcast(p, src=0)
        self.params = self._param_list(module)
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.buckets, self.bucket_of = [], {}
        for indices in assign_buckets(self.params, bucket_size_mb):
            members, slices, lo = [self.params[i] for i in indices], {}, 0
            for p in members:
                slices[id(p)] = (lo, lo + p.numel())
                lo += p.numel()
            bucket = {"params": members, "slices": slices, "ready": 0, "handle": None,
                      "buffer": torch.zeros(lo, dtype=members[0].dtype, device=members[0].device)}
            self.buckets.append(bucket)
            for p in members:
                self.bucket_of[id(p)] = bucket
        self.used = torch.zeros(len(self.params), dtype=torch.int32, device=self.params[0].device)
        self.next = 0
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _param_list(self, module):
        return [p for p in module.parameters() if p.requires_grad]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _on_grad_ready(self, p):
        bucket = self.bucket_of[id(p)]
        lo, hi = bucket["slices"][id(p)]
        bucket["buffer"][lo:hi].copy_(p.grad.reshape(-1))
        bucket["ready"] += 1
        self.used[self.index[id(p)]] = 1
        self._launch_buckets(everything=False)

    def _launch_buckets(self, everything):
        while self.next < len(self.buckets):
            bucket = self.buckets[self.next]
            if not everything and bucket["ready"] < len(bucket["params"]):
                break
            bucket["buffer"].div_(self.world_size)
            bucket["handle"] = dist.all_reduce(bucket["buffer"], async_op=True)
            self.next += 1

    def _keep_none(self, used):
        return used == 0

    def finish(self):
        self._launch_buckets(everything=True)
        dist.all_reduce(self.used)
        used = self.used.tolist()
        for bucket in self.buckets:
            bucket["handle"].wait()
            for p in bucket["params"]:
                if self._keep_none(used[self.index[id(p)]]):
                    continue
                lo, hi = bucket["slices"][id(p)]
                average = bucket["buffer"][lo:hi].view_as(p)
                if p.grad is None:
                    p.grad = average.clone()
                else:
                    p.grad.copy_(average)
            bucket["buffer"].zero_()
            bucket["ready"], bucket["handle"] = 0, None
        self.used.zero_()
        self.next = 0


class BucketedZeroFill(Bucketed):
    """Wrong: an unused parameter gets a zero gradient (weight decay then moves it; one process would not)."""

    def _keep_none(self, used):
        return False


class BucketedAllInFinish(Bucketed):
    """Wrong (slow, not wrong in value): nothing is launched before finish(), so nothing overlaps backward."""

    def _launch_buckets(self, everything):
        if everything:  # only finish() launches
            super()._launch_buckets(everything)


class BucketedPerParameterCalls(Bucketed):
    """Wrong in spirit: buckets in name, but one all-reduce per parameter slice."""

    def _launch_buckets(self, everything):
        while self.next < len(self.buckets):
            bucket = self.buckets[self.next]
            if not everything and bucket["ready"] < len(bucket["params"]):
                break
            bucket["buffer"].div_(self.world_size)
            handles = [dist.all_reduce(bucket["buffer"][lo:hi], async_op=True) for lo, hi in bucket["slices"].values()]
            bucket["handle"] = _AllOf(handles)
            self.next += 1


class _AllOf:
    def __init__(self, handles):
        self.handles = handles

    def wait(self):
        for h in self.handles:
            h.wait()
