"""gpulab.devices.doctor: facts from simulated machines give the right problems; probing never raises;
the report's content (JSON keys and values, the printed lines) is what a known machine implies.

The "known machine" tests fake what the probes read (a pynvml module, torch.cuda, torch.distributed,
os, psutil), so every fact and the whole report are known in advance, on any machine.
"""

from __future__ import annotations

import builtins
import json
import os
import platform
import shutil
import sys
import types

import psutil
import pytest
import torch
import torch.distributed as dist

from gpulab.devices import doctor
from gpulab.devices.doctor import Facts, GpuInfo
from gpulab.labs import LABS


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


def notes(f: Facts) -> list[str]:
    return [n.code for n in doctor.compatibility_notes(f)]


def test_a_driver_of_an_older_major_version_is_too_old() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=False, nvml="ok", gpus=[A100],
              driver_version="470.82", driver_cuda_version="11.4")
    assert codes(f) == ["driver-too-old"] and notes(f) == []
    [p] = doctor.diagnose(f)
    assert "12.x family" in p.message and "525.60.13" in p.fix and "CUDA 11.x" in p.fix


@pytest.mark.parametrize("driver, cuda_available", [("12.4", True), ("12.0", True), ("12.4", False)])
def test_an_older_minor_version_is_a_note_not_a_problem(driver, cuda_available) -> None:
    """NVIDIA's minor-version compatibility: a 12.8 build runs on any 12.x driver, with two limits."""
    f = Facts(torch_cuda_build="12.8", cuda_available=cuda_available, torch_gpu_count=int(cuda_available), nvml="ok",
              gpus=[A100], driver_version="550.54", driver_cuda_version=driver, cudnn_version=91000,
              cudnn_check="ok" if cuda_available else None)
    assert "driver-too-old" not in codes(f)
    assert codes(f) == ([] if cuda_available else ["cuda-unavailable"])  # if CUDA fails, the driver's minor is not why
    assert notes(f) == ["minor-version-compat"]
    [n] = doctor.compatibility_notes(f)
    assert "cudaErrorUnsupportedPtxVersion" in n.fix and "cudaErrorCallRequiresNewerDriver" in n.fix


def test_a_newer_major_driver_runs_an_older_build_without_a_note() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok", gpus=[A100],
              driver_cuda_version="13.0", cudnn_version=91000, cudnn_check="ok")
    assert codes(f) == [] and notes(f) == []
    assert codes(Facts(torch_cuda_build="13.0", nvml="ok", gpus=[A100], driver_cuda_version="12.9")) == ["driver-too-old"]


def test_versions_compare_as_numbers() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok", gpus=[A100],
              driver_cuda_version="12.10", cudnn_version=91000, cudnn_check="ok")
    assert codes(f) == [] and notes(f) == []


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


def test_on_one_gpu_the_multi_process_labs_are_said_to_run_on_the_cpu() -> None:
    """With one GPU, labs 06 and 09 run gloo ranks on CPU tensors and lab 07 logical CPU devices; the
    doctor said they shared cuda:0."""
    modes = {row["lab"]: row for row in doctor.lab_modes(Facts(cuda_available=True, torch_gpu_count=1))}
    for lab in ("06_ddp", "07_model_parallel", "09_sharding"):
        assert modes[lab]["mode"] == "logical" and "on the CPU" in modes[lab]["where"] and "cuda" not in modes[lab]["where"]
    assert "cuda:0" in modes["01_bottleneck"]["where"] or modes["01_bottleneck"]["mode"] == "real"


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
    assert set(rep) == {"mode", "facts", "problems", "notes", "labs"}
    assert set(rep["facts"]) == FACT_KEYS
    assert rep["facts"]["torch_version"] == torch.__version__ and rep["facts"]["torch_cuda_build"] == torch.version.cuda
    assert all(set(p) == {"code", "message", "fix"} for p in rep["problems"] + rep["notes"])
    assert [row["lab"] for row in rep["labs"]] == [lab.id for lab in LABS]
    assert doctor.main([]) == 0
    assert "gpulab doctor" in capsys.readouterr().out


# --- a known machine, faked where the probes look ----------------------------------------------

# The JSON report's facts: a contract with scripts that read ``--json``, so written out by hand.
FACT_KEYS = {
    "python", "platform", "torch_version", "torch_cuda_build", "cuda_available", "torch_gpu_count",
    "cudnn_version", "cudnn_check", "nvml", "driver_version", "driver_cuda_version", "gpus", "nvidia_smi",
    "cuda_visible_devices", "nccl_available", "gloo_available", "cpu_count", "cpu_count_physical", "ram_bytes",
    "cxx_compiler", "errors",
}
A100_80 = {"name": "NVIDIA A100-SXM4-80GB", "memory_total_bytes": 80 * 2**30, "compute_capability": "8.0"}


def _fake_pynvml(driver_cuda: int, init_error: Exception | None = None) -> types.SimpleNamespace:
    def init() -> None:
        if init_error is not None:
            raise init_error

    return types.SimpleNamespace(
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlSystemGetCudaDriverVersion=lambda: driver_cuda,  # NVML's encoding: 1000 * major + 10 * minor
        nvmlDeviceGetCount=lambda: 2, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: A100_80["name"].encode(),
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 0),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=A100_80["memory_total_bytes"]),
    )


@pytest.fixture
def server(monkeypatch):
    """A server with 2 A100s and driver 550.54.15, torch's CUDA 12.8 build, and torch seeing no GPU.

    Returns a function that installs it, with the driver's CUDA version and CUDA_VISIBLE_DEVICES as knobs.
    """

    def install(driver_cuda: int = 12040, visible: str | None = None, nvml_init_error: Exception | None = None):
        monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(driver_cuda, nvml_init_error))
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91000)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
        monkeypatch.setattr(dist, "is_gloo_available", lambda: True)
        monkeypatch.setattr(os, "cpu_count", lambda: 16)
        monkeypatch.delenv("CXX", raising=False)
        monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 16 if logical else 8)
        monkeypatch.setattr(psutil, "virtual_memory", lambda: types.SimpleNamespace(total=64 * 2**30))
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: {"nvidia-smi": "/usr/bin/nvidia-smi", "g++": "/usr/bin/g++"}.get(name))
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    return install


def test_the_probe_of_a_known_machine_gives_every_fact(server) -> None:
    server()
    facts = doctor.report(doctor.probe())["facts"]
    assert facts == {
        "python": platform.python_version(), "platform": platform.platform(), "torch_version": torch.__version__,
        "torch_cuda_build": "12.8", "cuda_available": False, "torch_gpu_count": 0,
        "cudnn_version": 91000, "cudnn_check": None,
        "nvml": "ok", "driver_version": "550.54.15", "driver_cuda_version": "12.4",
        "gpus": [{"index": 0, **A100_80}, {"index": 1, **A100_80}],
        "nvidia_smi": True, "cuda_visible_devices": None, "nccl_available": True, "gloo_available": True,
        "cpu_count": 16, "cpu_count_physical": 8, "ram_bytes": 64 * 2**30, "cxx_compiler": "/usr/bin/g++", "errors": [],
    }


def test_the_json_report_of_a_known_machine(server, capsys) -> None:
    server()
    assert doctor.main(["--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["mode"] == "cpu-only"  # GPUs in the box, but torch cannot use them
    # a 12.4 driver runs a 12.8 build (minor-version compatibility): CUDA failing has another cause
    assert [p["code"] for p in rep["problems"]] == ["cuda-unavailable"]
    [n] = rep["notes"]
    assert n["code"] == "minor-version-compat"
    assert n["message"] == ("torch was built for CUDA 12.8 and the driver supports CUDA 12.4: the same major version, "
                            "so the build runs under CUDA's minor-version compatibility")
    rows = {row["lab"]: row for row in rep["labs"]}
    assert list(rows) == [lab.id for lab in LABS]
    assert all(set(row) == {"lab", "needs_gpus", "mode", "where"} for row in rows.values())
    assert rows["00_setup"] == {"lab": "00_setup", "needs_gpus": 0, "mode": "real", "where": "cpu"}
    assert rows["04_dataparallel"] == {"lab": "04_dataparallel", "needs_gpus": 4, "mode": "logical",
                                       "where": "4 logical devices sharing cpu (simulated)"}
    assert rows["06_ddp"] == {"lab": "06_ddp", "needs_gpus": 2, "mode": "logical", "where": "2 gloo processes on the CPU (gloo ranks keep CPU tensors, even beside a GPU)"}


def test_the_printed_report_of_a_known_machine(server, capsys) -> None:
    server()
    assert doctor.main([]) == 0
    text = capsys.readouterr().out
    for line in (
        "mode:        cpu-only",
        f"torch:       {torch.__version__} (CUDA 12.8 build)",
        "CUDA:        not available; driver 550.54.15 (supports CUDA 12.4); NVML ok",
        "cuDNN:       91000",
        "backends:    nccl yes, gloo yes",
        "CPU:         16 logical cores (8 physical), RAM 64.0 GiB",
        "GPU 0:       NVIDIA A100-SXM4-80GB, 80.0 GiB, compute capability 8.0",
        "GPU 1:       NVIDIA A100-SXM4-80GB, 80.0 GiB, compute capability 8.0",
        "  [cuda-unavailable] torch is a CUDA build and GPUs are present, yet torch.cuda.is_available() is False",
        "  note [minor-version-compat] torch was built for CUDA 12.8 and the driver supports CUDA 12.4: the same major "
        "version, so the build runs under CUDA's minor-version compatibility",
        "Labs on this machine:",
    ):
        assert line in text.splitlines(), f"missing line {line!r} in:\n{text}"
    assert "No problems found" not in text and "Probes that failed" not in text


@pytest.mark.parametrize("visible, code", [(None, "cuda-unavailable"), ("", "gpus-hidden")])
def test_a_recent_driver_with_invisible_gpus_names_the_cause(server, visible, code) -> None:
    server(driver_cuda=12080, visible=visible)
    rep = doctor.report(doctor.probe())
    assert rep["facts"]["driver_cuda_version"] == "12.8" and rep["facts"]["cuda_visible_devices"] == visible
    assert [p["code"] for p in rep["problems"]] == [code] and rep["notes"] == []


def test_a_driver_of_an_older_major_version_in_the_json_report(server, capsys) -> None:
    server(driver_cuda=11040)
    assert doctor.main(["--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [p["code"] for p in rep["problems"]] == ["driver-too-old"] and rep["notes"] == []
    [p] = rep["problems"]
    assert p["message"] == ("torch was built for CUDA 12.8 but the driver 550.54.15 supports CUDA 11.4 at most: "
                            "a CUDA 12.x build needs a driver of the 12.x family")
    assert p["fix"] == ("update the NVIDIA driver to one for CUDA 12.x (525.60.13 or newer on Linux), "
                        "or install a torch build for CUDA 11.x")


@pytest.mark.parametrize("error, nvml", [
    (type("NVMLError_LibraryNotFound", (Exception,), {})("NVML Shared Library Not Found"), "missing"),
    (RuntimeError("GPU is lost"), "error: "),
])
def test_nvml_that_cannot_start_is_reported_not_raised(server, error, nvml) -> None:
    server(nvml_init_error=error)
    facts = doctor.probe()
    assert facts.nvml.startswith(nvml) and facts.gpus == [] and facts.driver_version is None
    if nvml != "missing":
        assert "GPU is lost" in facts.nvml  # the driver's own words reach the report
    assert facts.torch_cuda_build == "12.8" and facts.cpu_count == 16  # the other probes still ran


def test_a_single_gpu_machine_runs_the_one_gpu_labs_for_real() -> None:
    f = Facts(torch_cuda_build="12.8", cuda_available=True, torch_gpu_count=1, nvml="ok",
              gpus=[A100], driver_cuda_version="12.8", cudnn_version=91000, cudnn_check="ok")
    rep = doctor.report(f)
    assert rep["mode"] == "single-gpu" and rep["problems"] == []
    rows = {row["lab"]: (row["mode"], row["where"]) for row in rep["labs"]}
    assert rows["00_setup"] == ("real", "cpu + cuda") and rows["01_bottleneck"] == ("real", "1 GPU(s)")
    assert rows["04_dataparallel"] == ("logical", "4 logical devices sharing cuda:0 (simulated)")
    assert rows["07_model_parallel"] == ("logical", "2 logical devices on the CPU, one thread each (simulated)")


def test_a_machine_without_a_cxx_compiler_is_told_how_to_get_one(server, monkeypatch, capsys) -> None:
    server()
    monkeypatch.setenv("CXX", "no-such-c++")  # inductor would run $CXX: it is not on PATH
    rep = doctor.report(doctor.probe())
    assert rep["facts"]["cxx_compiler"] == "missing"
    [problem] = [p for p in rep["problems"] if p["code"] == "no-cxx-compiler"]
    assert "`no-such-c++` is not on PATH" in problem["message"] and "apt-get install g++" in problem["fix"]
    assert doctor.toolchain_problems(Facts()) == []  # not checked is not missing
