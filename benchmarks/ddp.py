"""Step time of four ways to average gradients over 2 ranks: NaiveDDP, OverlappedDDP, BucketedDDP, torch DDP.

    .venv/bin/python benchmarks/ddp.py            # prints ONE JSON line

All four train the same MLP (24 hidden layers of 256 features: 50 gradient tensors, 6 MB) on a
global batch of 64, in one launch of 2 ranks (gloo on a CPU; nccl when each rank has a GPU),
interleaved step by step so machine load hits them alike (see gpulab.parallel.measure.timing):

- ``naive``: after backward, one blocking all-reduce per tensor;
- ``overlapped``: one asynchronous all-reduce per tensor, started by its gradient hook during
  backward (what lab 06's ``MyOverlappedDDP`` exercise writes);
- ``bucketed``: 1 MB buckets launched from the hooks (lab 06's ``MyBucketedDDP``);
- ``torch_ddp``: ``torch.nn.parallel.DistributedDataParallel`` with ``bucket_cap_mb=1``;
- ``local``: no synchronisation, the compute-only floor.

Target: bucketing removes the per-call cost of 50 small all-reduces, so BucketedDDP should be
clearly faster than NaiveDDP (> 1.5x) and than OverlappedDDP (> 1.3x: lab 06 grades the student's
ratio at 1.3x), and within about 1.5x of torch DDP, which does the same in C++.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch._dynamo  # torch DDP imports it lazily: once here, not in every rank

from gpulab.parallel import StepTimingConfig, launch, resolve_backend, summarize_step_times, time_sync_strategies


def main() -> None:
    world_size = 2
    cfg = StepTimingConfig(num_steps=15, warmup=3)
    t0 = time.perf_counter()
    per_rank = launch(time_sync_strategies, world_size, echo=False,
                      args=(["naive", "overlapped", "bucketed", "torch_ddp", "local"], cfg))
    s = summarize_step_times(per_rank)
    speedup, vs_overlapped, vs_torch = s["naive"] / s["bucketed"], s["overlapped"] / s["bucketed"], s["bucketed"] / s["torch_ddp"]
    backend = resolve_backend("auto", world_size)
    print(json.dumps({
        "benchmark": "ddp_step_time",
        "device": "cpu" if backend == "gloo" else "cuda",
        "backend": backend,
        "world_size": world_size,
        "cpu_cores": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "model": f"MLP {cfg.depth}x{cfg.width}, global batch {cfg.batch_size}, bucket {cfg.bucket_size_mb} MB",
        "torch": torch.__version__,
        "bucketed_speedup_vs_naive": round(speedup, 2),
        "overlapped_speedup_vs_naive": round(s["naive"] / s["overlapped"], 2),
        "bucketed_speedup_vs_overlapped": round(vs_overlapped, 2),
        "torch_ddp_speedup_vs_naive": round(s["naive"] / s["torch_ddp"], 2),
        "bucketed_vs_torch_ddp_time": round(vs_torch, 2),
        "sync_overhead_bucketed_vs_local": round(s["bucketed"] / s["local"], 2),
        "ms": {k: round(v * 1e3, 1) for k, v in s.items()},
        "wall_s": round(time.perf_counter() - t0, 1),
        "target": "bucketed_speedup_vs_naive >= 1.5, bucketed_speedup_vs_overlapped >= 1.3, bucketed_vs_torch_ddp_time <= 1.5",
        "ok": speedup >= 1.5 and vs_overlapped >= 1.3 and vs_torch <= 1.5,
    }))


if __name__ == "__main__":
    main()
