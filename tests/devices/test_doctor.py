"""The doctor: facts from simulated machines give the right problems; probing never raises."""

from __future__ import annotations

import builtins
import json

import torch

from gpulab.devices import doctor
from gpulab.devices.doctor import Facts, GpuInfo


def codes(f: Facts) -> list[str]:
    return [p.code for p in doctor.diagnose(f)]


A100 = GpuInfo(0, "NVIDIA A100", 80 * 2**30, "8.0")


def test_cpu_only_laptop_is_healthy_and_says_so() -> None:
    f = Facts(torch_version="2.13.0+cpu", nvml="missing", cpu_count=4, ram_bytes=16 * 2**30)
    assert codes(f) == []
    rep = doctor.report(f)
    assert rep["mode"] == "cpu-only"
    text = doctor.format_report(rep)
    assert "CPU-only machine" in text and "No problems found" in text
    modes = {row["lab"]: row["mode"] for row in rep["labs"]}
    assert modes["00_setup"] == "real" and modes["04_dataparallel"] == "logical"


def test_cpu_build_on_gpu_machine_names_the_cuda_wheel() -> None:
    f = Facts(torch_version="2.13.0+cpu", nvml="ok", gpus=[A100, A100], driver_cuda_version="12.4")
    [p] = doctor.diagnose(f)
    assert p.code == "cpu-build-on-gpu-machine"
    assert "download.pytorch.org/whl/cu" in p.fix and "2.13.0" in p.fix


def test_cpu_build_with_nvidia_smi_but_no_nvml() -> None:
    assert codes(Facts(torch_cuda_build=None, nvml="missing", nvidia_smi=True)) == ["cpu-build-on-gpu-machine"]


def test_driver_older_than_build() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=False, nvml="ok", gpus=[A100],
              driver_version="470.82", driver_cuda_version="11.4")
    assert codes(f) == ["driver-too-old"]
    assert "12.8" in doctor.diagnose(f)[0].fix


def test_minor_version_behind_but_working_is_not_a_problem() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok", gpus=[A100],
              driver_cuda_version="12.4", cudnn_version=91000, cudnn_check="ok")
    assert codes(f) == []


def test_versions_compare_as_numbers() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok", gpus=[A100],
              driver_cuda_version="12.10", cudnn_version=91000, cudnn_check="ok")
    assert codes(f) == []


def test_gpus_hidden_by_cuda_visible_devices() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=False, nvml="ok", gpus=[A100],
              driver_cuda_version="12.8", cuda_visible_devices="")
    [p] = doctor.diagnose(f)
    assert p.code == "gpus-hidden" and "CUDA_VISIBLE_DEVICES" in p.fix


def test_cudnn_failure_is_explained() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok", gpus=[A100],
              driver_cuda_version="12.8", cudnn_version=91000, cudnn_check="CUDNN_STATUS_NOT_INITIALIZED")
    [p] = doctor.diagnose(f)
    assert p.code == "cudnn" and "LD_LIBRARY_PATH" in p.fix and "out of memory" in p.fix


def test_lab_modes_follow_the_gpu_count() -> None:
    two = Facts(cuda_available=True, torch_gpu_count=2)
    modes = {row["lab"]: row for row in doctor.lab_modes(two)}
    assert modes["06_ddp"]["mode"] == "real"
    assert modes["04_dataparallel"]["mode"] == "logical" and "cuda:0" in modes["04_dataparallel"]["where"]


def test_probe_without_nvml_module(monkeypatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    f = doctor.probe()
    assert f.nvml == "missing"
    assert f.torch_version == torch.__version__


def test_probe_reports_instead_of_raising(monkeypatch) -> None:
    def broken(*_a, **_k):
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", broken)
    monkeypatch.setattr(doctor, "_probe_host", broken)
    f = doctor.probe()
    assert any("driver exploded" in e for e in f.errors)
    text = doctor.format_report(doctor.report(f))
    assert "Probes that failed" in text


def test_probe_of_this_machine_matches_torch() -> None:
    f = doctor.probe()
    assert f.torch_cuda_build == torch.version.cuda
    assert f.gloo_available == torch.distributed.is_gloo_available()
    assert f.cpu_count and f.cpu_count >= 1


def test_cli_json_and_exit_status(capsys) -> None:
    assert doctor.main(["--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep) == {"mode", "facts", "problems", "labs"}
    assert doctor.main([]) == 0
    assert "gpulab doctor" in capsys.readouterr().out
