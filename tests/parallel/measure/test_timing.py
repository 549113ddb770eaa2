"""gpulab.parallel.measure.timing: the step-time harness measures every sync strategy on every rank."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from gpulab.parallel import OverlappedDDP, StepTimingConfig, launch, summarize_step_times, time_sync_strategies


def _with_cpu(rank, world_size, strategies, cfg):
    return time_sync_strategies(rank, world_size, strategies, cfg, cpu=True)


def test_step_time_harness_measures_every_strategy():
    def my_allreduce(model, world_size):
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size

    cfg = StepTimingConfig(width=32, depth=3, batch_size=8, num_steps=3, warmup=1)
    names = ("naive", "overlapped", "bucketed", "torch_ddp", "local", "mine", "wrapped")
    strategies = [*names[:5], ("mine", my_allreduce), ("wrapped", "wrap", OverlappedDDP)]
    per_rank = launch(_with_cpu, 2, args=(strategies, cfg), echo=False)
    assert all(len(r[name]) == len(r["cpu:" + name]) == 3 for r in per_rank for name in names)
    assert all(c >= 0 for r in per_rank for n in names for c in r["cpu:" + n]), "CPU seconds per step"
    summary = summarize_step_times(per_rank)
    assert set(summary) == set(names), "the cpu: entries are not step times"
    for k, v in summary.items():  # the median (3 steps: the middle one) of the slower rank's times
        assert v == sorted(max(a, b) for a, b in zip(per_rank[0][k], per_rank[1][k]))[1] > 0
    with pytest.raises(Exception, match="unknown strategy"):
        launch(time_sync_strategies, 1, args=(["fast"], cfg), echo=False)
