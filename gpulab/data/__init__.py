"""Data for the labs: synthetic datasets, loader tuning and transfer (lab 02), HDF5 storage (lab 03).

Import from the submodules, e.g. ``from gpulab.data.hdf5 import H5Dataset``.
"""

# Lab 02's input-pipeline toolkit, re-exported lazily (``from gpulab.data import BatchEcho`` works
# without making ``import gpulab.data.hdf5`` pay for DataLoader, tqdm and psutil).
_LAB02 = ("LoaderConfig", "LoaderWarning", "make_loader", "measure_loader", "sweep_loader", "tune_loader",
          "SweepResult", "TuneResult", "to_device_normalize", "normalize_on_host", "InMemoryCache", "BatchEcho")


def __getattr__(name: str):  # noqa: ANN202 - module-level lazy attribute (PEP 562)
    if name in _LAB02:
        from gpulab.data import loading

        return getattr(loading, name)
    if name == "SyntheticImages":
        from gpulab.data.synthetic import SyntheticImages

        return SyntheticImages
    raise AttributeError(f"module 'gpulab.data' has no attribute {name!r}")
