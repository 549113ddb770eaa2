"""``UtilizationMonitor`` (lab 01): ``nvidia-smi`` and ``htop`` as numbers, sampled in a thread.

- :mod:`~gpulab.monitor.utilization`: the monitor and its :class:`Sample`.
- :mod:`~gpulab.monitor.nvml`: GPU readings through NVML (nvidia-ml-py), the library behind nvidia-smi.
- :mod:`~gpulab.monitor.throttle`: temperature, power and SM clock over a run, NVML's throttle reasons decoded.
- :mod:`~gpulab.monitor.procstat`: CPU per core and per process tree, through psutil.
- :mod:`~gpulab.monitor.view`: the text, plot and live-widget views.
"""

from gpulab.monitor.nvml import GpuSample
from gpulab.monitor.utilization import Sample, UtilizationMonitor

__all__ = ["UtilizationMonitor", "Sample", "GpuSample"]
