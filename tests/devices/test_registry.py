"""gpulab.devices.registry: which logical device each storage lives on, through transfers, views and frees."""

from __future__ import annotations

import gc

import pytest
import torch

from gpulab.devices import logical_devices, placement
from gpulab.devices import registry as registry
from gpulab.parallel import comm


def test_placement_follows_transfers_views_and_frees() -> None:
    devs = logical_devices(3, physical=["cpu"])
    x = torch.randn(8, 4)
    assert placement(x) == devs[0]  # never moved: device 0 of its physical device
    y = comm.to(x, devs[2])
    assert placement(y) == devs[2]
    assert placement(y[1:].t()) == devs[2]  # a view lives where its storage does
    key = y.untyped_storage()._cdata
    assert key in registry.ENTRIES
    del y
    gc.collect()
    assert key not in registry.ENTRIES  # the registry forgets a freed storage
    with pytest.raises(TypeError, match="takes a tensor"):
        placement([1, 2])
