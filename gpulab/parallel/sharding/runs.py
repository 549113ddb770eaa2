"""Bytes per rank and step time of DDP, ZeRO-1 and FSDP2, measured side by side in one launch (lab 09).

Every rank builds one copy of the same seeded MLP per strategy and trains it a few AdamW steps:

- ``"ddp"``: torch ``DistributedDataParallel`` + ``torch.optim.AdamW`` (everything replicated);
- ``"zero1"``: torch DDP for the gradients + :class:`~gpulab.parallel.ShardedOptimizer` (gpulab's ZeRO-1);
- ``"torch_zero"``: torch DDP + ``torch.distributed.optim.ZeroRedundancyOptimizer`` (torch's ZeRO-1);
- ``"fsdp2"``: ``torch.distributed.fsdp.fully_shard`` on each Linear and on the root, over
  ``init_device_mesh(device_type, (world_size,))`` (parameters, gradients and state sharded);
- ``(name, make_optimizer)``: torch DDP + your ZeRO-1, ``make_optimizer(params, torch.optim.AdamW, lr=...)``,
  whose optimizer state is read from its ``local_optimizer`` attribute.

After the last step (gradients still held) each rank counts its bytes with
:func:`~gpulab.parallel.sharding.state_bytes.state_bytes`. Steps are timed from a barrier to the end of
``optimizer.step()``, the strategies interleaved step by step on the CPU; a step's time is the
slower rank's. Run it with::

    per_rank = launch(measure_sharding, 2, args=(["ddp", "zero1", "fsdp2"], ShardingConfig()))
    summarize_sharding(per_rank)   # {"ddp": {"bytes": [rank 0, rank 1], "step_s": 0.03}, ...}
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gpulab.models import MLP
from gpulab.parallel.launcher import rank_device
from gpulab.parallel.sharding.state_bytes import optimizer_state_bytes, state_bytes
from gpulab.parallel.sharding.zero1 import ShardedOptimizer

__all__ = ["ShardingConfig", "sharding_model", "measure_sharding", "summarize_sharding", "preload_sharding"]

@dataclass
class ShardingConfig:
    """What :func:`measure_sharding` trains.

    Attributes:
        width: features of each hidden layer (a multiple of every world size you use, so FSDP2's
            row shards are even and the byte counts are exact).
        depth: hidden layers.
        batch_size: the *global* batch; each rank gets ``batch_size // world_size``.
        num_steps: timed steps per strategy.
        warmup: untimed steps first.
        lr: AdamW's learning rate.
        seed: initial weights and data.
        return_params: also return each strategy's final parameters (for the tests).
    """

    width: int = 256
    depth: int = 4
    batch_size: int = 32
    num_steps: int = 4
    warmup: int = 1
    lr: float = 1e-3
    seed: int = 0
    return_params: bool = False


def sharding_model(cfg: ShardingConfig) -> MLP:
    """``depth`` hidden Linear+ReLU layers of ``width`` features and a ``width``-way classifier, seeded."""
    torch.manual_seed(cfg.seed)
    return MLP([cfg.width] * (cfg.depth + 2))


def preload_sharding() -> None:
    """Import FSDP2 and ZeroRedundancyOptimizer once here, so forked ranks do not each import them."""
    import torch._dynamo  # torch DDP imports it on first use
    import torch.distributed.fsdp
    import torch.distributed.optim
    import torch.distributed.tensor  # noqa: F401


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    # gradient_as_bucket_view: the gradients *are* the buckets, so DDP holds no second copy of them
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                               gradient_as_bucket_view=True)


def _build(strategy: Any, model: nn.Module, device: torch.device, world_size: int, lr: float):
    """(wrapped model, optimizer, the object holding the optimizer state)."""
    if isinstance(strategy, tuple):
        wrapped = _ddp(model, device)
        opt = strategy[1](list(model.parameters()), torch.optim.AdamW, lr=lr)
        return wrapped, opt, getattr(opt, "local_optimizer", opt)
    if strategy == "ddp":
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        return _ddp(model, device), opt, opt
    if strategy == "zero1":
        opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=lr)
        return _ddp(model, device), opt, opt
    if strategy == "torch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=lr)
        return _ddp(model, device), opt, opt
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh(device.type, (world_size,))
        for layer in model.modules():
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)  # one all-gather per layer, freed after use
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        return model, opt, opt
    raise ValueError(f"unknown strategy {strategy!r}; use 'ddp', 'zero1', 'torch_zero', 'fsdp2' or (name, make_optimizer)")


def _name(strategy: Any) -> str:
    return strategy[0] if isinstance(strategy, tuple) else strategy


def measure_sharding(rank: int, world_size: int, strategies: Sequence[Any],
                     cfg: ShardingConfig | None = None) -> dict[str, dict[str, Any]]:
    """Rank body: train each strategy ``warmup + num_steps`` AdamW steps; count its bytes, time its steps.

    On the CPU the strategies take their steps *interleaved* (ddp, zero1, fsdp2, ddp, ...), so
    machine load hits them alike and their time ratio means something. On a GPU they run one after
    the other, so that ``torch.cuda.max_memory_allocated`` (reset before each) is each one's own peak.

    Returns:
        ``{name: {"bytes": StateBytes.as_dict(), "step_s": [seconds per timed step], "params": ...}}``
        for this rank (``params``, the full parameters on the CPU, only with ``cfg.return_params``).
    """
    cfg = cfg or ShardingConfig()
    if cfg.batch_size % world_size:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by world_size={world_size}")
    device = rank_device(rank)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    batches = [(torch.randn(cfg.batch_size, cfg.width, generator=g), torch.randint(0, cfg.width, (cfg.batch_size,), generator=g))
               for _ in range(cfg.warmup + cfg.num_steps)]
    batches = [tuple(t.chunk(world_size)[rank].to(device) for t in b) for b in batches]  # this rank's slice
    out: dict[str, dict[str, Any]] = {}
    if device.type == "cuda":  # one at a time: each strategy's own allocator peak
        for strategy in strategies:
            run = _Run(strategy, cfg, device, world_size)
            torch.cuda.reset_peak_memory_stats(device)
            for step, batch in enumerate(batches):
                run.step(batch, timed=step >= cfg.warmup)
            out[run.name] = run.report(cfg.return_params)
            del run
            # a wrapper's hooks hold cycles back to its model: without a collection the previous
            # strategy's parameters, gradients and optimizer state count in the next one's peak
            gc.collect()
        return out
    runs = [_Run(strategy, cfg, device, world_size) for strategy in strategies]
    for step, batch in enumerate(batches):
        for run in runs:  # interleaved: a busy machine slows every strategy alike
            run.step(batch, timed=step >= cfg.warmup)
    return {run.name: run.report(cfg.return_params) for run in runs}


class _Run:
    """One strategy's model, optimizer and step times inside a rank."""

    def __init__(self, strategy: Any, cfg: ShardingConfig, device: torch.device, world_size: int) -> None:
        self.name, self.device = _name(strategy), device
        self.model = sharding_model(cfg).to(device)
        self.wrapped, self.opt, self.holder = _build(strategy, self.model, device, world_size, cfg.lr)
        self.times: list[float] = []

    def step(self, batch: tuple[torch.Tensor, torch.Tensor], timed: bool) -> None:
        inputs, targets = batch
        dist.barrier()  # time the step, not how late the other ranks arrived
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(self.wrapped(inputs), targets).backward()
        self.opt.step()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a host-device sync: the kernels must be done to be timed
        if timed:
            self.times.append(time.perf_counter() - t0)

    def report(self, return_params: bool) -> dict[str, Any]:
        counted = state_bytes(self.model, None, self.device)  # after the last step: gradients still held
        counted.optimizer_state = optimizer_state_bytes(self.holder)
        out: dict[str, Any] = {"bytes": counted.as_dict(), "step_s": self.times}
        if return_params:
            out["params"] = {n: _full(p) for n, p in self.model.named_parameters()}
        return out


def _full(p: torch.Tensor) -> torch.Tensor:
    full = getattr(p, "full_tensor", None)  # an FSDP2 DTensor: all-gather the shards (a collective)
    return (full() if callable(full) else p).detach().cpu()


def summarize_sharding(per_rank: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per strategy: ``bytes`` (the list of every rank's byte counts), ``max_bytes`` (the largest
    rank's, per field) and ``step_s`` (median over steps of the slower rank's time)."""
    out = {}
    for name in per_rank[0]:
        counts = [r[name]["bytes"] for r in per_rank]
        slowest = [max(ts) for ts in zip(*(r[name]["step_s"] for r in per_rank))]
        out[name] = {"bytes": counts,
                     "max_bytes": {k: max(c[k] for c in counts) for k in ("params", "grads", "optimizer_state", "total")},
                     "num_params": counts[0]["num_params"],
                     "step_s": statistics.median(slowest) if slowest else float("nan")}
    return out
