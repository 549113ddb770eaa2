"""How much slower a training step runs inside a MemoryMeter (target: at most 3x).

    python benchmarks/meter_overhead.py                 # on gpulab.devices.default_device()
    python benchmarks/meter_overhead.py --device cpu --repeats 7

The meter is Python code that runs after every aten op (its dispatch mode looks at the outputs,
attributes new storages, and registers a weak reference for each), so its cost is per op, not
per byte. A small CNN on small batches has many cheap ops: close to the worst case a lab meets.

Plain and metered blocks of ``--steps`` training steps alternate, ``--repeats`` times, in this one
run. ``slowdown`` is the ratio of the best (least disturbed) block times of each side;
``slowdown_median_pair`` is the median of the per-pair ratios, a check on it. On a machine busy
with other work the pair ratios scatter (see ``slowdown_min_max``); the best times do not.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from gpulab.devices import MemoryMeter, default_device
from gpulab.models import SmallCNN

TARGET = 3.0


class _OpCounter(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the steps are asynchronous on a GPU: wait before reading the clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="torch device (default: the first GPU, else cpu)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=9, help="plain/metered block pairs")
    args = parser.parse_args()
    device = torch.device(args.device) if args.device else default_device()

    torch.manual_seed(0)
    model = SmallCNN().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    inputs = torch.randn(args.batch_size, 3, 32, 32, device=device)
    targets = torch.randint(0, 10, (args.batch_size,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(inputs), targets).backward()
        opt.step()

    def block(metered: bool) -> tuple[float, int]:
        _sync(device)
        t0 = time.perf_counter()
        if metered:
            with MemoryMeter() as meter:
                for _ in range(args.steps):
                    step()
                _sync(device)
            peak = max(meter.peak(d) for d in meter.devices)
        else:
            for _ in range(args.steps):
                step()
            _sync(device)
            peak = 0
        return (time.perf_counter() - t0) / args.steps, peak

    block(False)
    block(True)  # warm-up: first-use costs (allocator, optimizer state, op caches) on both sides
    counter = _OpCounter()
    with counter:
        step()
    plain, metered, ratios = [], [], []
    peak = 0
    for _ in range(args.repeats):
        p, _ = block(False)
        m, peak = block(True)
        plain.append(p)
        metered.append(m)
        ratios.append(m / p)
    slowdown = min(metered) / min(plain)
    print(json.dumps({
        "benchmark": "meter_overhead",
        "device": str(device),
        "torch": torch.__version__,
        "batch_size": args.batch_size,
        "ops_per_step": counter.ops,
        "step_ms_unmetered": round(min(plain) * 1e3, 3),
        "step_ms_metered": round(min(metered) * 1e3, 3),
        "overhead_us_per_op": round((min(metered) - min(plain)) / counter.ops * 1e6, 2),
        "slowdown": round(slowdown, 3),
        "slowdown_median_pair": round(statistics.median(ratios), 3),
        "slowdown_min_max": [round(min(ratios), 3), round(max(ratios), 3)],
        "metered_peak_bytes": peak,
        "target_max": TARGET,
        "ok": slowdown <= TARGET,
    }))


if __name__ == "__main__":
    main()
