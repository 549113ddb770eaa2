"""gpulab.launchbound.mfu: MFU is achieved FLOP/s over the peak, the datasheet lookup by GPU name, and bad input."""

from __future__ import annotations

import pytest
import torch

from gpulab.launchbound.mfu import Mfu, Peak, datasheet_tflops, measure_mfu, measure_peak


def test_mfu_is_flops_over_time_over_peak() -> None:
    m = Mfu(flops=2_000_000, seconds=0.001, peak_flops_per_s=4e9)
    assert m.achieved == pytest.approx(2e9) and m.mfu == pytest.approx(0.5)


def test_measured_peak_is_a_matmul_on_this_device() -> None:
    peak = measure_peak(torch.device("cpu"), n=128, repeats=2)
    assert peak.n == 128 and peak.device == "cpu" and peak.flops_per_s > 0 and peak.datasheet_flops_per_s is None
    step = measure_mfu(lambda: torch.randn(128, 128) @ torch.randn(128, 128), 2 * 128**3, peak, torch.device("cpu"))
    assert 0 < step.mfu  # a step below the peak's size runs at some fraction of it


def test_datasheet_lookup_by_name() -> None:
    assert datasheet_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
    assert datasheet_tflops("NVIDIA A100-SXM4-80GB") == 19.5
    assert datasheet_tflops("some laptop GPU") is None


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        measure_mfu(lambda: None, 0, Peak(1e9, 8, "float32", "cpu"))
