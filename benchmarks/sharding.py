"""Bytes per rank and step time of DDP, ZeRO-1 (gpulab's ShardedOptimizer and torch's
ZeroRedundancyOptimizer) and FSDP2, and what no_sync saves in gradient accumulation.

    .venv/bin/python benchmarks/sharding.py                  # prints ONE JSON line (2 ranks)
    .venv/bin/python benchmarks/sharding.py --world-size 4

One launch trains the same MLP (8 Linear layers of 512 features: 2.1 M parameters) with AdamW
under each strategy, side by side (gpulab.parallel.sharding.runs), and counts the bytes each rank
holds from its tensors. A second launch accumulates 4 micro-batches per step on NaiveDDP with and
without no_sync and counts the all-reduce calls (gpulab.parallel.sharding.accumulation.count_collectives).

Targets: ``optimizer_state_per_rank_ratio`` (the fullest rank's AdamW state under ZeRO-1 over
DDP's) <= 1/N + 0.05; ``fsdp_param_grad_state_per_rank_ratio`` about 1/N;
``nosync_allreduce_ratio`` = 1/k (k = 4 micro-batches). The step-time ratios over DDP are reported,
not targeted: ZeRO-1 adds one broadcast of the model per step, FSDP2 all-gathers every layer in
forward and in backward, and on gloo CPU ranks nothing hides that traffic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from gpulab.grading.lab09_accumulation import run_accumulation
from gpulab.parallel import launch, resolve_backend
from gpulab.parallel.sharding.accumulation import accumulation_step
from gpulab.parallel.sharding.runs import ShardingConfig, measure_sharding, preload_sharding, summarize_sharding

MICRO_BATCHES = 4


def every_micro_batch(model, optimizer, micro_batches, loss_fn):
    """Accumulation without no_sync: one synchronisation per micro-batch."""
    for inputs, targets in micro_batches:
        (loss_fn(model(inputs), targets) / len(micro_batches)).backward()
        model.sync_gradients()
    optimizer.step()
    optimizer.zero_grad()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    n = args.world_size
    cfg = ShardingConfig(width=512, depth=7, batch_size=32, num_steps=8, warmup=2)
    t0 = time.perf_counter()
    preload_sharding()
    s = summarize_sharding(
        launch(measure_sharding, n, args=(["ddp", "zero1", "torch_zero", "fsdp2"], cfg), timeout=600, echo=False)
    )
    acc = run_accumulation(
        [("no_sync", accumulation_step), ("every_micro_batch", every_micro_batch)],
        n,
        wrapper="naive",
        micro_batches=MICRO_BATCHES,
        num_steps=6,
        warmup=1,
        sizes=(64, 512, 512, 512, 8),
        num_samples=8 * n * MICRO_BATCHES,
    )
    ddp = s["ddp"]
    state_ratio = s["zero1"]["max_bytes"]["optimizer_state"] / ddp["max_bytes"]["optimizer_state"]
    nosync_ratio = acc["no_sync"]["all_reduce_per_step"] / acc["every_micro_batch"]["all_reduce_per_step"]
    backend = resolve_backend("auto", n)
    print(
        json.dumps(
            {
                "benchmark": "sharding",
                "device": "cpu" if backend == "gloo" else "cuda",
                "backend": backend,
                "world_size": n,
                "cpu_cores": os.cpu_count(),
                "machine": platform.processor() or platform.machine(),
                "model": f"MLP {cfg.depth + 1} Linear x {cfg.width}, {ddp['num_params']} parameters, AdamW, global batch {cfg.batch_size}",
                "torch": torch.__version__,
                "optimizer_state_per_rank_ratio": round(state_ratio, 4),
                "torch_zero_optimizer_state_per_rank_ratio": round(
                    s["torch_zero"]["max_bytes"]["optimizer_state"] / ddp["max_bytes"]["optimizer_state"], 4
                ),
                "fsdp_param_grad_state_per_rank_ratio": round(
                    s["fsdp2"]["max_bytes"]["total"] / ddp["max_bytes"]["total"], 4
                ),
                "bytes_per_parameter": {k: round(v["max_bytes"]["total"] / v["num_params"], 3) for k, v in s.items()},
                "zero1_step_time_ratio": round(s["zero1"]["step_s"] / ddp["step_s"], 2),
                "torch_zero_step_time_ratio": round(s["torch_zero"]["step_s"] / ddp["step_s"], 2),
                "fsdp2_step_time_ratio": round(s["fsdp2"]["step_s"] / ddp["step_s"], 2),
                "step_ms": {k: round(1e3 * v["step_s"], 1) for k, v in s.items()},
                "nosync_allreduce_ratio": round(nosync_ratio, 4),
                "nosync_step_time_ratio": round(
                    statistics.median(acc["no_sync"]["step_s"]) / statistics.median(acc["every_micro_batch"]["step_s"]),
                    2,
                ),
                "micro_batches": MICRO_BATCHES,
                "wall_s": round(time.perf_counter() - t0, 1),
                "target": f"optimizer_state_per_rank_ratio <= 1/{n} + 0.05 and nosync_allreduce_ratio == 1/{MICRO_BATCHES}",
                "ok": state_ratio <= 1 / n + 0.05 and abs(nosync_ratio - 1 / MICRO_BATCHES) < 1e-9,
            }
        )
    )


if __name__ == "__main__":
    main()
