"""Peak memory of a training step: float32 vs bf16 autocast vs activation checkpointing.

    python benchmarks/memory.py                     # on gpulab.devices.default_device()
    python benchmarks/memory.py --device cpu --repeats 3

Two workloads, the ones lab 08 grades (``gpulab.memory.fixes.savings.lab_workloads``): a small CNN (three conv blocks and
a head; checkpointing keeps the input of each conv block) and a stack of four pre-norm
TransformerEncoderLayers with a per-token classifier (checkpointing keeps the input of each
layer; the last block, the head or the classifier, runs plainly). Each
variant runs one forward + backward from zeroed gradients; its peak is the bytes of tensor
storage above the model's parameters, counted by a MemoryMeter (the activations saved for
backward, the gradients, the temporaries). Memory figures are exact and deterministic; the
ratios are variant / float32, lower is better. On a GPU the CUDA allocator's own peak
(``max_memory_allocated``, which also holds cuDNN/cuBLAS workspaces) is reported beside them.

Recorded on a 2-core CPU (benchmarks/results/memory-cpu.json): bf16 0.60 (CNN) and 0.63
(transformer), checkpointing 0.79 and 0.44. bf16 does not halve the peak because not everything
saved is a float activation: MaxPool2d saves int64 indices (1.75 of the CNN's 9.5 MiB), and the
transformer's residual stream (float32 input + bf16 branch -> float32) and the layer norms on it
stay float32; autocast's bf16 copies of the weights and the float32 gradients add a little. CUDA's
autocast also forces softmax and layer norm to float32, where CPU autocast keeps their input's
dtype; here the layer norms see the float32 residual stream anyway and attention runs in the fused
scaled-dot-product kernel, so a GPU should show similar meter ratios (not measured: no GPU was
available). Its allocator peak also holds kernel workspaces.

Step times (``time_ratio``, variant / float32, the best of ``--repeats`` interleaved runs without
the meter, the least disturbed by other work) say what the memory costs: checkpointing runs each
checkpointed forward twice (measured 1.6-1.9x here: with blocks this small, checkpoint's own
Python overhead weighs too). bf16 is
only fast on hardware with bf16 units (GPU tensor cores, CPUs with AMX / AVX512-BF16); elsewhere
it is emulated and slower. Prints one JSON line; lab 08's thresholds are set from it.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

import torch
from torch import nn

from gpulab.devices import default_device
from gpulab.memory.fixes.savings import bf16_step, checkpointed_step, fp32_step, lab_workloads, peak_memory


def _variants(model: nn.Module, blocks: list[nn.Module], x: torch.Tensor, y: torch.Tensor,
              loss_fn: Callable) -> dict[str, Callable[[], Any]]:
    return {"fp32": lambda: fp32_step(model, x, y, loss_fn),
            "bf16_autocast": lambda: bf16_step(model, x, y, loss_fn),
            "checkpoint": lambda: checkpointed_step(blocks, x, y, loss_fn)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(device: torch.device, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, w in lab_workloads(device).items():
        model, blocks, x, y, loss_fn = w.model, w.blocks, w.inputs, w.targets, w.loss_fn
        variants = _variants(model, blocks, x, y, loss_fn)
        peaks, cuda_peaks = {}, {}
        for v, fn in variants.items():
            fn()  # warm up (the first checkpoint call imports torch._dynamo: seconds)
            model.zero_grad(set_to_none=True)
            peaks[v] = peak_memory(fn, track=model)
            if device.type == "cuda":
                model.zero_grad(set_to_none=True)
                _sync(device)
                base = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                fn()
                _sync(device)
                cuda_peaks[v] = torch.cuda.max_memory_allocated(device) - base
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(repeats):  # interleaved: each variant sees the same machine load
            for v, fn in variants.items():
                model.zero_grad(set_to_none=True)
                _sync(device)
                t0 = time.perf_counter()
                fn()
                _sync(device)
                times[v].append(time.perf_counter() - t0)
        best = {v: min(ts) for v, ts in times.items()}
        row: dict[str, Any] = {
            "peak_bytes": peaks,
            "peak_ratio": {v: round(peaks[v] / peaks["fp32"], 4) for v in peaks},
            "step_s": {v: round(t, 5) for v, t in best.items()},
            "time_ratio": {v: round(best[v] / best["fp32"], 3) for v in best},
        }
        if cuda_peaks:
            row["cuda_allocator_peak_ratio"] = {v: round(cuda_peaks[v] / cuda_peaks["fp32"], 4) for v in cuda_peaks}
        out[name] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="default: the first GPU, else the CPU")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device) if args.device else default_device()
    result = {"benchmark": "memory", "device": str(device),
              "mode": "CUDA allocator + MemoryMeter" if device.type == "cuda" else "MemoryMeter on CPU",
              "torch": torch.__version__, **measure(device, args.repeats)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
