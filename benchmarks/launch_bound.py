"""The launch-bound step (lab 12): what torch.compile wins on small ops and loses on large ones, MFU by batch size.

    python benchmarks/launch_bound.py                  # on gpulab.devices.default_device()
    python benchmarks/launch_bound.py --device cpu --repeats 7 --threads 2

Target: ``compile_speedup`` >= 1.5 on 2 CPU cores, for gpulab.launchbound.fusion's elementwise block on
16 x 64 elements, where eager time is the fixed cost of about 40 ops. The same block on 256 x 1024
elements (``compile_speedup_large``) is reported beside it, with no target: there the ops are doing
arithmetic, and the compiled loop nest can be slower than ATen's kernels (0.3-1.0x was seen here).
Eager and compiled loops alternate, ``--repeats`` times, in this one run; each ratio is of the best
loop of each side. Both run on ``--threads`` CPU threads (1 by default: on a shared 2-core machine
a kernel split across two threads waits for the busy core, which measures the neighbour). Also: the ops eager dispatches and the kernels inductor generates, the size
below which one elementwise op is overhead-bound, a transformer block's training-step MFU at a
small and a large batch (the peak measured in the same run), and on a GPU the speed-up of one
CUDA-graph replay over eager launches. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import torch

from gpulab.devices import default_device
from gpulab.launchbound.flops import TransformerBlock, count_flops
from gpulab.launchbound.fusion import (
    clipped_block,
    clipped_block_fused,
    compile_settings,
    count_ops,
    generated_code,
    kernels_in,
)
from gpulab.launchbound.mfu import measure_mfu, measure_peak, per_call_interleaved
from gpulab.launchbound.overhead import op_times, overhead_bound_below

TARGET = 1.5


def compile_ratio(shape: tuple[int, int], device: torch.device, repeats: int) -> dict[str, float]:
    x = torch.randn(*shape, device=device)
    torch._dynamo.reset()
    t0 = time.perf_counter()
    fused = torch.compile(clipped_block_fused, dynamic=False)
    fused(x)
    compile_s = time.perf_counter() - t0
    broken = torch.compile(clipped_block, dynamic=False)
    broken(x)
    calls = max(3, int(2e6 // (shape[0] * shape[1])))  # about the same work per loop at every size
    t = per_call_interleaved({"eager": lambda: clipped_block_fused(x), "compiled": lambda: fused(x),
                    "eager_breaks": lambda: clipped_block(x), "compiled_breaks": lambda: broken(x)}, device, calls, repeats)
    return {"speedup": t["eager"] / t["compiled"], "speedup_with_breaks": t["eager_breaks"] / t["compiled_breaks"],
            "eager_us": t["eager"] * 1e6, "compiled_us": t["compiled"] * 1e6, "compile_s": compile_s}


def mfu_at(batch_size: int, seq_len: int, device: torch.device, peak: Any) -> float:
    torch.manual_seed(0)
    block = TransformerBlock(128, 4, 512).to(device)
    x = torch.randn(batch_size, seq_len, 128, device=device)
    flops = count_flops(block, x, backward=True).total

    def step() -> None:
        block(x).sum().backward()

    return measure_mfu(step, flops, peak, device, repeats=5).mfu


def cuda_graph_ratio(device: torch.device, repeats: int) -> float:
    """Eager launches vs one replay of a captured CUDA graph of the same block (16 x 64)."""
    static_x = torch.randn(16, 64, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up on a side stream before capture, as torch's docs ask
            clipped_block_fused(static_x)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        clipped_block_fused(static_x)
    t = per_call_interleaved({"eager": lambda: clipped_block_fused(static_x), "graph": graph.replay}, device, 500, repeats)
    return t["eager"] / t["graph"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch's and inductor's CPU threads (1: a busy neighbour core stalls neither side)")
    args = parser.parse_args(argv)
    device = torch.device(args.device) if args.device else default_device()
    torch.set_num_threads(args.threads)
    compile_settings(args.threads)
    small = compile_ratio((16, 64), device, args.repeats)
    large = compile_ratio((256, 1024), device, args.repeats)
    x = torch.randn(16, 64, device=device)
    timings = op_times(device=device)
    peak = measure_peak(device)
    result: dict[str, Any] = {
        "benchmark": "launch_bound",
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "compile_speedup": round(small["speedup"], 2),
        "compile_speedup_large": round(large["speedup"], 2),
        "compile_speedup_with_graph_breaks": round(small["speedup_with_breaks"], 2),
        "eager_us_small": round(small["eager_us"], 1), "compiled_us_small": round(small["compiled_us"], 1),
        "eager_us_large": round(large["eager_us"], 1), "compiled_us_large": round(large["compiled_us"], 1),
        "compile_s": round(small["compile_s"], 2),
        "ops_before": sum(count_ops(clipped_block_fused, x).values()),
        "ops_after": len(kernels_in(generated_code(clipped_block_fused, x))),
        "overhead_bound_below_elements": overhead_bound_below(timings),
        "overhead_us_per_op": round(min(t.seconds for t in timings[:3]) * 1e6, 2),
        "peak_gflops": round(peak.flops_per_s / 1e9, 1),
        "mfu_small_batch": round(mfu_at(1, 16, device, peak), 4),
        "mfu_large_batch": round(mfu_at(32, 64, device, peak), 4),
        "target": TARGET,
    }
    if device.type == "cuda":
        result["cuda_graph_speedup"] = round(cuda_graph_ratio(device, args.repeats), 2)
    result["meets_target"] = result["compile_speedup"] >= TARGET
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
