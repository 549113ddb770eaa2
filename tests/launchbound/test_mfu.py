"""gpulab.launchbound.mfu: MFU is achieved FLOP/s over the peak, the datasheet lookup by the most specific GPU name,
the precision in force (TF32 or not) named, and bad input."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gpulab.launchbound import mfu as mfu_module
from gpulab.launchbound.mfu import Mfu, Peak, datasheet_part, datasheet_tflops, measure_mfu, measure_peak, tf32_matmul


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
    assert datasheet_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert datasheet_tflops("some laptop GPU") is None
    assert datasheet_tflops("NVIDIA H100 80GB HBM3", "float64") is None  # a dtype the table does not list


def test_the_most_specific_part_wins_and_words_match_whole() -> None:
    """An H100 PCIe gets the PCIe figures, never the SXM ones a bare substring "H100" would give."""
    assert datasheet_part("NVIDIA H100 PCIe") == "H100 PCIE"
    assert datasheet_tflops("NVIDIA H100 PCIe") == 51.0 != datasheet_tflops("NVIDIA H100 80GB HBM3")
    assert datasheet_part("NVIDIA H100 NVL") == "H100 NVL"
    assert datasheet_part("NVIDIA H200 NVL") == "H200 NVL" and datasheet_part("NVIDIA H200") == "H200"
    assert datasheet_part("Tesla V100-PCIE-32GB") == "V100 PCIE" and datasheet_part("Tesla V100-SXM2-16GB") == "V100"
    assert datasheet_part("NVIDIA A100 80GB PCIe") == "A100"  # A100's PCIe and SXM parts have one peak
    assert datasheet_part("NVIDIA GH200 480GB") is None  # "H200" is not a word of it
    assert datasheet_part("Tesla V100S-PCIE-32GB") is None


@pytest.mark.parametrize(("matmul", "backends", "expected"), [
    (SimpleNamespace(fp32_precision="tf32", allow_tf32=False), SimpleNamespace(fp32_precision="ieee"), True),
    (SimpleNamespace(fp32_precision="ieee", allow_tf32=True), SimpleNamespace(fp32_precision="tf32"), False),
    (SimpleNamespace(fp32_precision="none", allow_tf32=False), SimpleNamespace(fp32_precision="tf32"), True),
    (SimpleNamespace(fp32_precision="none", allow_tf32=True), SimpleNamespace(fp32_precision="none"), True),
    (SimpleNamespace(allow_tf32=False), SimpleNamespace(), False),  # an older torch: only the flag
])
def test_tf32_is_read_from_the_setting_in_force(monkeypatch: pytest.MonkeyPatch, matmul: SimpleNamespace,
                                                backends: SimpleNamespace, expected: bool) -> None:
    backends.cuda = SimpleNamespace(matmul=matmul)
    monkeypatch.setattr(mfu_module, "torch", SimpleNamespace(backends=backends))  # the flags tf32_matmul reads, faked
    assert tf32_matmul() is expected


def test_tf32_follows_torchs_own_switches() -> None:
    """The real flags, in a fresh interpreter (torch refuses to read them once the old and new APIs were mixed)."""
    code = ("import torch; from gpulab.launchbound.mfu import tf32_matmul; seen = [tf32_matmul()]; "
            "torch.backends.cuda.matmul.allow_tf32 = True; seen.append(tf32_matmul()); "
            "torch.set_float32_matmul_precision('highest'); seen.append(tf32_matmul()); "
            "torch.set_float32_matmul_precision('high'); seen.append(tf32_matmul()); print(seen)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[False, True, False, True]"  # torch's default is IEEE float32


def test_the_label_names_tf32_when_it_was_on() -> None:
    on = Peak(51e12, 8192, "float32", "NVIDIA H200", 494.7e12, tf32=True)
    off = Peak(51e12, 8192, "float32", "NVIDIA H200", 67e12)
    assert on.precision == "float32 with TF32" and "float32 with TF32 matmul" in str(on) and "dense TF32" in str(on)
    assert off.precision == "float32" and "TF32" not in str(off) and "dense float32" in str(off)
    assert not measure_peak(torch.device("cpu"), n=64, repeats=1).tf32  # a CPU's float32 matmul is never TF32 here


def test_bad_input_names_the_problem() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        measure_mfu(lambda: None, 0, Peak(1e9, 8, "float32", "cpu"))
