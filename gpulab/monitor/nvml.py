"""Read GPU utilisation, memory, temperature and power through NVML (nvidia-ml-py), or say why not.

NVML is the library ``nvidia-smi`` prints from. :class:`NvmlReader` never raises: with no driver,
no GPU, or a missing ``pynvml`` (see :func:`gpulab.devices.nvml.open_nvml`) it reads nothing and ``describe()`` says what happened, so the
monitor keeps sampling the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpulab.devices.nvml import close_nvml, open_nvml

__all__ = ["GpuSample", "NvmlReader"]


@dataclass(frozen=True)
class GpuSample:
    """One GPU's reading; a field is None where this GPU or driver does not report it.

    Attributes:
        util: % of the last sample period with at least one kernel running (GPU-Util).
        mem_util: % of the period the memory controller was busy.
        mem_used, mem_total: bytes.
        temp: degrees Celsius. power: watts.
    """

    index: int
    util: float | None
    mem_util: float | None
    mem_used: int | None
    mem_total: int | None
    temp: float | None
    power: float | None


class NvmlReader:
    """Opens NVML once; ``sample()`` reads every GPU; ``close()`` shuts NVML down."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.error: str | None = None
        self._handles: list = []
        self._nvml = None
        opened = open_nvml()
        if opened.nvml is None:
            self.error = opened.error
            return
        pynvml = opened.nvml
        self._nvml = pynvml
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(h)
                self._handles.append(h)
                self.names.append(name.decode() if isinstance(name, bytes) else str(name))
        except Exception as err:  # noqa: BLE001
            self.error = f"NVML started but listing GPUs failed ({err})"

    @property
    def ok(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def describe(self) -> str:
        """One line for the monitor's status."""
        if self.error:
            return f"no GPU readings: {self.error}; sampling CPU only"
        if not self._handles:
            return "NVML found no GPU; sampling CPU only"
        return f"NVML: {len(self._handles)} GPU(s): " + ", ".join(f"{i} {n}" for i, n in enumerate(self.names))

    def sample(self) -> tuple[GpuSample, ...]:
        if not self.ok:
            return ()
        nv = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            util = mem_util = used = total = temp = power = None
            try:
                rates = nv.nvmlDeviceGetUtilizationRates(h)
                util, mem_util = float(rates.gpu), float(rates.memory)
            except Exception:  # noqa: BLE001 - not supported on this GPU (e.g. some MIG modes)
                pass
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                used, total = int(mem.used), int(mem.total)
            except Exception:  # noqa: BLE001
                pass
            try:
                temp = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            except Exception:  # noqa: BLE001
                pass
            try:
                power = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
            except Exception:  # noqa: BLE001
                pass
            out.append(GpuSample(i, util, mem_util, used, total, temp, power))
        return tuple(out)

    def close(self) -> None:
        close_nvml(self._nvml)
        self._nvml = None
