"""Read GPU utilisation, memory, temperature, power and clocks through NVML (nvidia-ml-py), or say why not.

NVML is the library ``nvidia-smi`` prints from. :class:`NvmlReader` never raises: with no driver,
no GPU, or a missing ``pynvml`` (see :func:`gpulab.devices.nvml.open_nvml`) it reads nothing and ``describe()`` says what happened, so the
monitor keeps sampling the CPU.

Besides utilisation, each sample reads what throttling looks like (NVML API reference, "Device
Queries" and "NvmlClocksEventReasons"): the SM clock (``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``,
MHz) and the bit mask of reasons the clocks are held down (``nvmlDeviceGetCurrentClocksEventReasons``;
``...ThrottleReasons`` on drivers older than R535). Once, at start, it reads each GPU's limits: the
enforced power limit, the maximum SM clock and the slowdown temperature
(:class:`GpuLimits`). :mod:`gpulab.monitor.throttle` decodes and summarises them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpulab.devices.nvml import close_nvml, open_nvml, visible_gpus

__all__ = ["GpuSample", "GpuLimits", "NvmlReader"]


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading; a field is None where this GPU or driver does not report it.

    Attributes:
        util: % of the last sample period with at least one kernel running (GPU-Util).
        mem_util: % of the period the memory controller was busy.
        mem_used, mem_total: bytes.
        temp: degrees Celsius. power: watts.
        sm_clock: the SM clock in MHz.
        clock_reasons: NVML's bit mask of why the clocks are below their maximum (0: none; decode it
            with :func:`gpulab.monitor.throttle.decode_reasons`).
    """

    index: int
    util: float | None
    mem_util: float | None
    mem_used: int | None
    mem_total: int | None
    temp: float | None
    power: float | None
    sm_clock: float | None = None
    clock_reasons: int | None = None


@dataclass(frozen=True)
class GpuLimits:
    """One GPU's limits, read once: None where the GPU or driver does not report them.

    Attributes:
        power_limit: the enforced power limit in watts (the SW power cap acts at it).
        max_sm_clock: the highest SM clock in MHz.
        slowdown_temp: the temperature (°C) at which the GPU slows its clocks down (HW slowdown).
    """

    index: int
    power_limit: float | None = None
    max_sm_clock: float | None = None
    slowdown_temp: float | None = None


def _read(nv: Any, name: str, *args: Any) -> Any:
    """``nv.<name>(*args)``, or None where NVML says the reading is not supported (or the binding lacks it)."""
    try:
        return getattr(nv, name)(*args)
    except Exception:  # NVMLError_NotSupported and friends: no reading, not a failure
        return None


def _temperature(nv: Any, h: Any) -> float | None:
    """The GPU's temperature in °C: ``nvmlDeviceGetTemperatureV`` (drivers R565 and later; the
    older ``nvmlDeviceGetTemperature`` is deprecated), else the older call."""
    sensor = getattr(nv, "NVML_TEMPERATURE_GPU", 0)
    value = _read(nv, "nvmlDeviceGetTemperatureV", h, sensor)  # None where the binding lacks it
    if value is None:
        value = _read(nv, "nvmlDeviceGetTemperature", h, sensor)
    return None if value is None else float(getattr(value, "temperature", value))


class NvmlReader:
    """Opens NVML once; ``sample()`` reads every GPU this process's CUDA sees, each under its cuda
    index (NVML's own numbering differs under ``CUDA_VISIBLE_DEVICES``, see
    :func:`gpulab.devices.nvml.visible_gpus`); ``close()`` shuts NVML down."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.limits: list[GpuLimits] = []
        self.error: str | None = None
        self._handles: list = []
        self._cuda: list[int] = []  # the cuda index of each handle
        self.nvml_indices: list[int] = []  # NVML's number of each handle (it differs under CUDA_VISIBLE_DEVICES)
        self.skipped: list[str] = []
        self._nvml = None
        opened = open_nvml()
        if opened.nvml is None:
            self.error = opened.error
            return
        pynvml = opened.nvml
        self._nvml = pynvml
        try:
            for cuda, index in visible_gpus(pynvml):
                if index is None:  # a MIG instance: no whole-GPU utilisation to read
                    self.skipped.append(f"cuda:{cuda} is a MIG instance (no NVML utilisation per instance)")
                    continue
                h = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = pynvml.nvmlDeviceGetName(h)
                self._handles.append(h)
                self._cuda.append(cuda)
                self.nvml_indices.append(index)
                self.names.append(name.decode() if isinstance(name, bytes) else str(name))
                self.limits.append(self._limits(cuda, h))
        except Exception as err:
            self.error = f"NVML started but listing GPUs failed ({err})"

    def _limits(self, index: int, h: Any) -> GpuLimits:
        nv = self._nvml
        power_mw = _read(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
        clock = _read(nv, "nvmlDeviceGetMaxClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
        slowdown = _read(nv, "nvmlDeviceGetTemperatureThreshold", h, getattr(nv, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
        return GpuLimits(index, None if power_mw is None else power_mw / 1000.0,
                         None if clock is None else float(clock), None if slowdown is None else float(slowdown))

    def _clock_reasons(self, h: Any) -> int | None:
        nv = self._nvml
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            mask = _read(nv, name, h)  # the first is R535's name for the second
            if mask is not None:
                return int(mask)
        return None

    @property
    def ok(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def describe(self) -> str:
        """One line for the monitor's status."""
        if self.error:
            return f"no GPU readings: {self.error}; sampling CPU only"
        if not self._handles:
            return "NVML found no GPU visible to CUDA here; sampling CPU only" + "".join(f"; {s}" for s in self.skipped)
        return f"NVML: {len(self._handles)} GPU(s): " + ", ".join(
            f"cuda:{c} = NVML GPU {i} {n}" for c, i, n in zip(self._cuda, self.nvml_indices, self.names))

    def sample(self) -> tuple[GpuSample, ...]:
        if not self.ok:
            return ()
        nv = self._nvml
        out = []
        for i, h in zip(self._cuda, self._handles):  # i: the GPU's cuda index, as torch names it
            util = mem_util = used = total = temp = power = None
            try:
                rates = nv.nvmlDeviceGetUtilizationRates(h)
                util, mem_util = float(rates.gpu), float(rates.memory)
            except Exception:  # not supported on this GPU (e.g. some MIG modes)
                pass
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                used, total = int(mem.used), int(mem.total)
            except Exception:
                pass
            temp = _temperature(nv, h)
            try:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
            except Exception:
                pass
            clock = _read(nv, "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1))
            out.append(GpuSample(i, util, mem_util, used, total, temp, power,
                                 None if clock is None else float(clock), self._clock_reasons(h)))
        return tuple(out)

    def close(self) -> None:
        close_nvml(self._nvml)
        self._nvml = None
