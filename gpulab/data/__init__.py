"""Data for the labs: synthetic datasets, loader tuning and transfer (lab 02), HDF5 storage (lab 03).

Import from the submodules, e.g. ``from gpulab.data.hdf5 import H5Dataset``.
"""
