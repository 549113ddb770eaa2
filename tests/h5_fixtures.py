"""Fixtures shared by the HDF5 tests: a small photo-like image set and a gzip-chunked copy of it.

A test module imports them by name (``from h5_fixtures import N, data, gzip_file``); pytest then
uses them as that module's own fixtures, so each module still writes its file once.
"""
import pytest

from gpulab.data.hdf5 import make_images, write_h5

N = 96


@pytest.fixture(scope="module")
def data():
    return make_images(N, (3, 16, 16), seed=3)


@pytest.fixture(scope="module")
def gzip_file(tmp_path_factory, data):
    return write_h5(tmp_path_factory.mktemp("h5") / "gz.h5", *data, layout="chunked", chunks=(8, 3, 16, 16),
                    compression="gzip", disable=True)
