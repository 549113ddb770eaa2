"""Data for the labs: synthetic datasets, loader tuning and transfer (lab 02), HDF5 storage (lab 03).

Lab 02's input-pipeline toolkit is re-exported here (``from gpulab.data import BatchEcho``); the
rest is imported from its submodule, e.g. ``from gpulab.data.hdf5 import H5Dataset``. The re-export
costs about 50 ms on top of ``import gpulab.data.hdf5`` (torch and h5py are the slow part).
"""

from gpulab.data.loading import (
    BatchEcho,
    InMemoryCache,
    LoaderConfig,
    LoaderWarning,
    SweepResult,
    TuneResult,
    make_loader,
    measure_loader,
    normalize_on_host,
    sweep_loader,
    to_device_normalize,
    tune_loader,
)
from gpulab.data.synthetic import SyntheticImages

__all__ = [
    "LoaderConfig", "LoaderWarning", "make_loader", "measure_loader", "sweep_loader", "tune_loader",
    "SweepResult", "TuneResult", "to_device_normalize", "normalize_on_host", "InMemoryCache", "BatchEcho",
    "SyntheticImages",
]
