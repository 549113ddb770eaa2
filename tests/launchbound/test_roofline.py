"""gpulab.launchbound.roofline: the roof's formula, the balance point, and matmul intensity growing with the batch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import pytest

from gpulab.launchbound.roofline import (
    Kernel,
    arithmetic_intensity,
    attainable,
    machine_balance,
    matmul_kernel,
    measure_bandwidth,
    plot_roofline,
)


def test_the_roof() -> None:
    assert machine_balance(100e9, 10e9) == 10
    assert attainable(1.0, 100e9, 10e9) == 10e9  # memory roof
    assert attainable(50.0, 100e9, 10e9) == 100e9  # compute roof
    with pytest.raises(ValueError):
        arithmetic_intensity(1, 0)


def test_matmul_intensity_grows_with_the_batch() -> None:
    small, big = matmul_kernel(1, 64, repeats=1), matmul_kernel(64, 64, repeats=1)
    assert small.flops == 2 * 64 * 64 and small.bytes == 4 * (2 * 64 + 64 * 64)
    assert big.intensity > 20 * small.intensity


def test_measured_bandwidth_and_plot() -> None:
    assert measure_bandwidth(numel=2**16, repeats=1) > 0
    ax = plot_roofline([Kernel("k", 10.0, 5.0, 1e-6)], 1e9, 1e8)
    assert ax.get_xscale() == "log"
