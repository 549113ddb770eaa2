"""What does watching cost? CPU used by UtilizationMonitor's sampling thread at 10 Hz.

    .venv/bin/python benchmarks/monitor_overhead.py [--seconds 5] [--interval 0.1]

Target: under 1 % of one core at 10 Hz (interval 0.1 s), so the monitor can stay on during the
labs' measurements. The sampling thread's own CPU time is read from the kernel's per-thread
counters (psutil ``Process.threads()``), so other load on the machine does not inflate it.
The kernel counts thread time in 10 ms ticks, so the script also times ``_take()`` (one sample)
directly with ``time.thread_time()`` (median of 5 x 40 samples), and reports ``percent_of_one_core_direct`` =
that cost x the sampling rate. Two configurations run side by side: the default (this process + child processes, with two
idle children present, as DataLoader workers would be) and ``include_children=False``. NVML is
sampled when it is present (the JSON says whether it was). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpulab.accel import SimAccelerator
from gpulab.monitor import UtilizationMonitor
from gpulab.monitor.nvml import NvmlReader


def _thread_cpu(native_id: int) -> float:
    for t in psutil.Process(os.getpid()).threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    return 0.0


def measure(seconds: float, interval: float, include_children: bool) -> dict:
    acc = SimAccelerator()
    acc.compute(seconds * 2)  # a simulated device to sample as well
    mon = UtilizationMonitor(interval=interval, accelerators=[acc], include_children=include_children)
    mon.start()
    native = mon._thread.native_id  # the benchmark reads the thread's own counters
    cpu0, t0 = _thread_cpu(native), time.perf_counter()
    time.sleep(seconds)
    cpu1, t1 = _thread_cpu(native), time.perf_counter()
    n = len(mon.samples)
    mon.stop()
    cpu = cpu1 - cpu0
    # the same work, timed precisely in this thread: 200 samples
    mon._prime()
    mon._nvml = NvmlReader() if mon.status.startswith("NVML") else None
    chunks = []
    for _ in range(5):  # median of 5 x 40 samples: a garbage collection pass lands in one chunk only
        c0 = time.thread_time()
        for _ in range(40):
            mon._take()
        chunks.append((time.thread_time() - c0) / 40)
    per_sample = statistics.median(chunks)
    if mon._nvml is not None:
        mon._nvml.close()
    return {"percent_of_one_core": 100 * cpu / (t1 - t0), "ms_per_sample": 1e3 * per_sample,
            "percent_direct": 100 * per_sample / interval,
            "samples": n, "nvml": mon.status.startswith("NVML"), "status": mon.status}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=0.1)
    args = p.parse_args()
    ctx = mp.get_context("fork")
    children = [ctx.Process(target=time.sleep, args=(args.seconds * 3,)) for _ in range(2)]
    for c in children:
        c.start()
    try:
        with_children = measure(args.seconds, args.interval, include_children=True)
        without = measure(args.seconds, args.interval, include_children=False)
    finally:
        for c in children:
            c.terminate()
            c.join()
    print(json.dumps({
        "benchmark": "monitor_overhead",
        "interval_s": args.interval,
        "seconds": args.seconds,
        "percent_of_one_core": round(with_children["percent_of_one_core"], 3),
        "percent_of_one_core_no_children": round(without["percent_of_one_core"], 3),
        "percent_of_one_core_direct": round(with_children["percent_direct"], 3),
        "percent_of_one_core_direct_no_children": round(without["percent_direct"], 3),
        "ms_per_sample": round(with_children["ms_per_sample"], 3),
        "samples": with_children["samples"],
        "target_percent": 1.0,
        "meets_target": max(with_children["percent_of_one_core"], with_children["percent_direct"]) < 1.0,
        "nvml": with_children["nvml"],
        "cpu_count": psutil.cpu_count(),
    }))


if __name__ == "__main__":
    main()
