"""``UtilizationMonitor``: ``nvidia-smi`` and ``htop`` as numbers, sampled in a background thread.

The source posts find a slow training job by staring at ``watch nvidia-smi`` (GPU-Util low) and
``htop`` (one core at 82-99 %). The monitor records the same readings so they can be plotted,
compared and graded::

    with UtilizationMonitor(interval=0.1) as mon:   # a sampling thread, stopped on exit
        mon.live()                                  # optional: a live view in the notebook
        train()
    mon.plot(); print(mon.summary())
    a = mon.arrays()                                # numpy: a["t"], a["cpu"] (N, cores), a["gpu_util"] ...

Per GPU, through NVML (nvidia-ml-py, the library behind nvidia-smi): utilisation %, memory
used/total, temperature, power, the SM clock and the reasons it is held down (throttling; see
:mod:`gpulab.monitor.throttle`), plus each GPU's limits in ``gpu_limits``. Per CPU core, and for this process plus its children
(DataLoader workers), through psutil. ``accelerators=`` adds simulated accelerators
(:mod:`gpulab.accel.clock`) as extra "GPUs", labelled simulated.

Warning:
    GPU-Util is the share of the last sample period in which *at least one kernel* was running.
    One tiny kernel on one SM reads 100 %; it says nothing about SM occupancy or FLOP/s.

Without a GPU, or when NVML cannot load, the monitor samples the CPU only and says so in
``status``. NVML numbers GPUs in PCI order, which may differ from CUDA's unless
``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import psutil

from gpulab.monitor.nvml import GpuSample, NvmlReader
from gpulab.monitor.procstat import ProcessTreeCpu, cpu_split
from gpulab.monitor.view import attach_live_view, format_summary, plot_monitor

__all__ = ["UtilizationMonitor", "Sample", "GpuSample"]


@dataclass(frozen=True)
class Sample:
    """One reading. ``t`` is seconds since ``start()``; CPU figures are % over the last period.

    Attributes:
        cpu: % busy per core (0-100 each), like htop's bars.
        process: this process plus its children, in % of one core (can exceed 100).
        rss: resident memory of this process, bytes.
        gpus: one :class:`GpuSample` per NVML GPU.
        sim: busy % of each simulated accelerator over the last period.
    """

    t: float
    cpu: tuple[float, ...]
    process: float
    rss: int
    gpus: tuple[GpuSample, ...] = ()
    sim: tuple[float, ...] = ()


class UtilizationMonitor:
    """Sample GPUs (NVML), CPU cores and this process (psutil) every ``interval`` seconds.

    Args:
        interval: seconds between samples (0.1 = 10 Hz; ``benchmarks/monitor_overhead.py``
            measures the cost).
        accelerators: accelerators to sample as well: simulated ones (a
            :class:`gpulab.accel.SimAccelerator`, or anything with ``.name`` and
            ``.utilization(start, end)``) are read here; others are skipped (NVML covers GPUs).
        include_children: add the CPU of child processes (DataLoader workers); the list of
            children is refreshed every 2 s (new workers show up within 2 s).
        nvml: set False to skip NVML even if it is present.
        max_samples: keep at most this many samples (the oldest are dropped).

    Raises:
        ValueError: for a non-positive interval.
    """

    def __init__(self, interval: float = 0.1, accelerators: Sequence[Any] = (), *, include_children: bool = True,
                 nvml: bool = True, max_samples: int = 100_000) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        self.interval = float(interval)
        # simulated clocks are sampled here; a CUDA accelerator is already covered by NVML
        self.accelerators = [getattr(a, "sim", a) for a in accelerators
                             if hasattr(a, "sim") or hasattr(a, "utilization")]
        self.include_children = include_children
        self._use_nvml = nvml
        self._samples: deque[Sample] = deque(maxlen=max_samples)
        self._marks: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._callbacks: list[Callable[["UtilizationMonitor", Sample], None]] = []
        self._proc = psutil.Process(os.getpid())
        self._nvml: NvmlReader | None = None
        self.errors: list[str] = []
        self.gpu_limits: list = []  # one GpuLimits per NVML GPU (power limit, max SM clock, slowdown temperature)
        self.t0 = 0.0
        self.status = "not started"

    # -- life cycle ---------------------------------------------------------------------------

    def start(self) -> "UtilizationMonitor":
        """Start the sampling thread (clears earlier samples).

        Raises:
            RuntimeError: if it is already running.
        """
        if self.running:
            raise RuntimeError("this monitor is already running; call stop() first or use a new one")
        self._nvml = NvmlReader() if self._use_nvml else None
        self.gpu_limits = list(self._nvml.limits) if self._nvml else []
        gpus = self._nvml.describe() if self._nvml else "NVML not used (nvml=False)"
        sims = f"; {len(self.accelerators)} simulated accelerator(s)" if self.accelerators else ""
        self.status = f"{gpus}; {psutil.cpu_count()} CPU cores via psutil{sims}"
        with self._lock:
            self._samples.clear()
            self._marks.clear()
        self.errors = []
        self._stop.clear()
        self._prime()
        self._thread = threading.Thread(target=self._run, name="gpulab-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "UtilizationMonitor":
        """Stop and join the sampling thread, and release NVML. Safe to call twice."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(5.0, 10 * self.interval))
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        for cb in list(self._callbacks):
            try:
                cb(self, None)  # type: ignore[arg-type]  # None = "stopped": let views finish
            except Exception as err:  # a view must not break stop()
                self.errors.append(f"view: {err!r}")
        self._callbacks.clear()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "UtilizationMonitor":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()  # also after an exception: never leave the thread behind

    def mark(self, label: str) -> None:
        """Record an event (e.g. "workers=2 starts") to annotate the plot."""
        self._marks.append((time.perf_counter() - self.t0, label))

    def on_sample(self, callback: Callable[["UtilizationMonitor", Sample | None], None]) -> None:
        """Call ``callback(monitor, sample)`` from the sampling thread after each sample, and
        ``callback(monitor, None)`` once when the monitor stops."""
        self._callbacks.append(callback)

    # -- sampling -----------------------------------------------------------------------------

    def _prime(self) -> None:
        self.t0 = self._last_t = time.perf_counter()
        self._last_cores = [cpu_split(c) for c in psutil.cpu_times(percpu=True)]
        self._tree = ProcessTreeCpu(include_children=self.include_children)
        self._last_cpu = self._tree.seconds()

    def _take(self) -> Sample:
        now = time.perf_counter()
        cores = [cpu_split(c) for c in psutil.cpu_times(percpu=True)]
        cpu = tuple(
            100.0 * min(1.0, max(0.0, (b1 - b0) / (t1 - t0))) if t1 > t0 else 0.0
            for (b0, t0), (b1, t1) in zip(self._last_cores, cores)
        )
        used = self._tree.seconds()
        wall = max(now - self._last_t, 1e-9)
        process = 100.0 * max(0.0, used - self._last_cpu) / wall
        gpus = self._nvml.sample() if self._nvml else ()
        sims = tuple(100.0 * a.utilization(self._last_t, now) for a in self.accelerators)
        self._last_cores, self._last_cpu, self._last_t = cores, used, now
        return Sample(now - self.t0, cpu, process, self._proc.memory_info().rss, gpus, sims)

    def _run(self) -> None:
        next_t = time.perf_counter() + self.interval
        failures = 0
        while not self._stop.wait(max(0.0, next_t - time.perf_counter())):
            next_t += self.interval
            if next_t < time.perf_counter():  # fell behind (a busy machine): do not burst
                next_t = time.perf_counter() + self.interval
            try:
                sample = self._take()
                failures = 0
            except Exception as err:  # recorded, and the thread gives up if it persists
                failures += 1
                self.errors.append(f"sample: {err!r}")
                if failures >= 10:
                    break
                continue
            with self._lock:
                self._samples.append(sample)
            for cb in list(self._callbacks):
                try:
                    cb(self, sample)
                except Exception as err:
                    self.errors.append(f"view: {err!r}")
                    self._callbacks.remove(cb)

    # -- results ------------------------------------------------------------------------------

    @property
    def samples(self) -> list[Sample]:
        """A copy of the samples so far (safe to read while running)."""
        with self._lock:
            return list(self._samples)

    @property
    def marks(self) -> list[tuple[float, str]]:
        return list(self._marks)

    def arrays(self) -> dict[str, np.ndarray]:
        """The samples as arrays: ``t`` (N,), ``cpu`` (N, cores), ``process`` (N,), ``rss`` (N,),
        ``gpu_util``, ``gpu_mem_used``, ``gpu_mem_total``, ``gpu_temp``, ``gpu_power``,
        ``gpu_sm_clock``, ``gpu_clock_reasons`` (N, G; NaN where NVML has no reading; the reasons
        are bit masks, exact as floats), ``sim_util`` (N, S). G and S may be 0."""
        s = self.samples
        n, g = len(s), len(s[0].gpus) if s else 0
        out = {
            "t": np.array([x.t for x in s], dtype=float),
            "cpu": np.array([x.cpu for x in s], dtype=float).reshape(n, -1) if n else np.zeros((0, psutil.cpu_count() or 1)),
            "process": np.array([x.process for x in s], dtype=float),
            "rss": np.array([x.rss for x in s], dtype=float),
            "sim_util": np.array([x.sim for x in s], dtype=float).reshape(n, len(self.accelerators)),
        }
        for key in ("util", "mem_used", "mem_total", "temp", "power", "sm_clock", "clock_reasons"):
            vals = [[np.nan if getattr(gs, key) is None else getattr(gs, key) for gs in x.gpus] for x in s]
            out[f"gpu_{key}"] = np.array(vals, dtype=float).reshape(n, g)
        return out

    @property
    def t(self) -> np.ndarray:
        return self.arrays()["t"]

    @property
    def cpu(self) -> np.ndarray:
        return self.arrays()["cpu"]

    @property
    def gpu_util(self) -> np.ndarray:
        return self.arrays()["gpu_util"]

    def summary(self) -> str:
        """nvidia-smi and htop in text: the latest reading, and mean/max over the run."""
        return format_summary(self)

    def plot(self) -> Any:
        """A matplotlib timeline: device utilisation above, CPU cores and this process below."""
        return plot_monitor(self)

    def live(self, refresh: float = 0.5) -> Any:
        """Show a view that updates while the notebook runs training in the same cell.

        Returns the ipywidgets widget, or None where there is no Jupyter kernel or no ipywidgets
        (then the summary is printed when the monitor stops).
        """
        return attach_live_view(self, refresh)

    def __repr__(self) -> str:
        return f"UtilizationMonitor(interval={self.interval}, samples={len(self._samples)}, running={self.running})"
