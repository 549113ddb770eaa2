"""Tensor parallelism: gpulab's Megatron-style MLP block against one process and against DTensor,
at 2 and 4 ranks, with its collectives and bytes counted against the analytic figures.

    .venv/bin/python benchmarks/tensor_parallel.py          # prints ONE JSON line

Per world size N (2 and 4), one launch runs gpulab's TensorParallelMLP and one runs DTensor's
``parallelize_module`` (ColwiseParallel / RowwiseParallel) on the same seeded weights, for odd
batch sizes (gpulab.parallel.tp.runs). Reported: the largest difference of the outputs and of every
gradient from one process, and from DTensor; each rank's weight bytes over the full block's; the
all-reduce bytes per training step counted by CollectiveCounter beside the analytic count. Then the
step time of a wider block (h = 512, 512 tokens) on N ranks over one process.

Targets: ``max_abs_diff_vs_single`` and ``max_abs_diff_vs_dtensor`` < 1e-5 (float32);
``weight_bytes_per_rank_ratio`` = 1/N; ``allreduce_bytes_per_step`` = ``analytic_allreduce_bytes``.
The step-time ratio is reported, not targeted: on a CPU the ranks share the same cores and talk
through gloo over loopback TCP, so it says nothing about what TP does with NVLink between GPUs.
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

from gpulab.parallel import launch, resolve_backend
from gpulab.parallel.tp import TensorParallelMLP, analytic_allreduces, feed_forward, runs
from gpulab.parallel.tp.memory import parameter_bytes
from gpulab.parallel.tp.timing import time_block, time_single

WORLD_SIZES = (2, 4)
CASES = ((3, 5), (7, 3))  # (batch_size, seq_len): odd batch sizes
TIMED_HIDDEN, TIMED_TOKENS = 512, 512


def main() -> None:
    t0 = time.perf_counter()
    full_weight_bytes = parameter_bytes(feed_forward(runs.HIDDEN, runs.FFN), matrices_only=True)
    out: dict[str, dict[str, float]] = {k: {} for k in (
        "max_abs_diff_vs_single", "max_abs_diff_vs_dtensor", "weight_bytes_per_rank_ratio", "allreduce_calls_per_step",
        "analytic_allreduce_calls", "allreduce_bytes_per_step", "analytic_allreduce_bytes", "step_time_vs_one_process",
        "step_ms")}
    backends, one_process = {}, []
    for n in WORLD_SIZES:
        backends[n] = resolve_backend("auto", n)
        ours = launch(runs.run_block, n, args=(TensorParallelMLP, "mlp", CASES, 0), timeout=300, echo=False)
        theirs = launch(runs.run_dtensor, n, args=("mlp", CASES, 0), timeout=300, echo=False)
        key = str(n)
        out["max_abs_diff_vs_single"][key] = runs.max_abs_diff(ours, runs.expected_shards("mlp", CASES, 0, n))
        out["max_abs_diff_vs_dtensor"][key] = runs.max_abs_diff(ours, theirs)
        out["weight_bytes_per_rank_ratio"][key] = max(r[0]["weight_bytes"] for r in ours) / full_weight_bytes
        tokens = sum(b * t for b, t in CASES)  # every case is one step: summed over the steps, per step below
        counted = [sum(res["comm"]["all_reduce"][k] for res in r) for r in ours for k in ("calls", "bytes")]
        analytic = [analytic_allreduces(b * t, runs.HIDDEN, "mlp") for b, t in CASES]
        out["allreduce_calls_per_step"][key] = max(counted[0::2]) / len(CASES)
        out["analytic_allreduce_calls"][key] = sum(a["calls"] for a in analytic) / len(CASES)
        out["allreduce_bytes_per_step"][key] = max(counted[1::2]) / len(CASES)
        out["analytic_allreduce_bytes"][key] = 2 * tokens * runs.HIDDEN * 4 / len(CASES)
        # one process just before and just after the ranks, so a change of load hits both sides alike
        before = time_single(TIMED_HIDDEN, TIMED_TOKENS)
        step_s = max(launch(time_block, n, args=(TensorParallelMLP, TIMED_HIDDEN, TIMED_TOKENS), timeout=300, echo=False))
        baseline = (before + time_single(TIMED_HIDDEN, TIMED_TOKENS)) / 2
        one_process.append(baseline)
        out["step_time_vs_one_process"][key] = round(step_s / baseline, 3)
        out["step_ms"][key] = round(1e3 * step_s, 2)
    out["step_ms"]["1"] = round(1e3 * min(one_process), 2)
    gloo = all(b == "gloo" for b in backends.values())
    ok = (max(out["max_abs_diff_vs_single"].values()) < 1e-5 and max(out["max_abs_diff_vs_dtensor"].values()) < 1e-5
          and all(abs(out["weight_bytes_per_rank_ratio"][str(n)] - 1 / n) < 1e-12 for n in WORLD_SIZES)
          and out["allreduce_bytes_per_step"] == out["analytic_allreduce_bytes"])
    print(json.dumps({
        "benchmark": "tensor_parallel",
        "device": "cpu" if gloo else "cuda",
        "backend": {str(n): b for n, b in backends.items()},
        "world_size": list(WORLD_SIZES),
        "cpu_cores": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "model": f"MLP {runs.HIDDEN} -> {runs.FFN} -> {runs.HIDDEN}, float32, (batch, seq) cases {list(CASES)}; "
                 f"timed: {TIMED_HIDDEN} -> {4 * TIMED_HIDDEN} -> {TIMED_HIDDEN} on {TIMED_TOKENS} tokens",
        **out,
        "step_time_note": ("CPU: the ranks share this machine's cores and all-reduce through gloo over loopback TCP; "
                           "the ratio is not what tensor parallelism gives with NVLink between GPUs"
                           if gloo else "GPUs under NCCL, one per rank"),
        "wall_s": round(time.perf_counter() - t0, 1),
        "target": "max_abs_diff_vs_single and _vs_dtensor < 1e-5; weight_bytes_per_rank_ratio == 1/N; "
                  "allreduce_bytes_per_step == analytic_allreduce_bytes",
        "ok": ok,
    }))


if __name__ == "__main__":
    main()
