"""``python -m gpulab doctor``: what this machine has, what is wrong with it, and what will run.

The report is built in three steps, each testable on its own:

1. :func:`probe` collects :class:`Facts` (versions, GPUs through NVML and torch, backends, CPU,
   RAM). It never raises: a probe that fails is recorded in ``facts.errors``.
2. :func:`diagnose` turns facts into :class:`Problem`s, each with the fix spelled out: a CPU build
   of torch on a GPU machine, a driver of an older CUDA major version than the build (NVIDIA's rule:
   the comment below the imports), cuDNN trouble, GPUs hidden by ``CUDA_VISIBLE_DEVICES``.
   :func:`compatibility_notes` adds what is worth knowing but not wrong: a driver of the same major
   version but an older minor one.
3. :func:`lab_modes` says, for every lab, whether it runs on real devices or on logical ones.

``--json`` prints the same report for machines; the exit status is 0 whenever a report was printed,
including on a CPU-only machine. Tests: ``.venv/bin/python -m pytest tests/devices/test_doctor.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

from gpulab import MaskedReference
from gpulab.devices.compiler import cxx_compiler_name, find_cxx_compiler, missing_compiler_fix
from gpulab.devices.doctor_text import format_report
from gpulab.devices.nvml import close_nvml, open_nvml
from gpulab.devices.physical import cuda_device_count
from gpulab.devices.share import current as current_share
from gpulab.labs import LABS

# The driver rule is NVIDIA's (the "CUDA Compatibility" guide, docs.nvidia.com/deploy/cuda-compatibility,
# section "Minor Version Compatibility"): from CUDA 11 on, a program built with any CUDA x.y toolkit
# runs on any driver of the same major family (12.x: driver >= 525; 13.x: >= 580; 11.x: >= 450),
# with a limited feature set: an API that needs a newer driver returns
# ``cudaErrorCallRequiresNewerDriver``, and PTX built by the newer toolkit cannot be JIT-compiled by
# the older driver (``cudaErrorUnsupportedPtxVersion``). A driver of an older *major* version cannot
# run the build at all (short of the forward-compatibility package, on data-centre GPUs).

__all__ = ["Facts", "GpuInfo", "Problem", "probe", "diagnose", "compatibility_notes", "toolchain_problems", "lab_modes", "report",
           "format_report", "main"]

CUDA_WHEEL_HINT = "pip install --force-reinstall torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
# The oldest driver of each CUDA major family (NVIDIA's CUDA Compatibility guide, Linux x86-64).
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580"}


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_total_bytes: int | None = None
    compute_capability: str | None = None


@dataclass
class Facts:
    """Everything the doctor looked at. Every field has a safe default so tests can build one."""

    python: str = platform.python_version()
    platform: str = platform.platform()
    torch_version: str | None = None
    torch_cuda_build: str | None = None  # torch.version.cuda, None on a CPU build
    cuda_available: bool = False
    torch_gpu_count: int = 0
    cudnn_version: int | None = None
    cudnn_check: str | None = None  # "ok", or the error a tiny cuDNN convolution raised
    nvml: str = "not tried"  # "ok", "missing" (no library), or "error: ..."
    driver_version: str | None = None
    driver_cuda_version: str | None = None  # newest CUDA the driver supports, e.g. "12.4"
    gpus: list[GpuInfo] = field(default_factory=list)  # from NVML, else from torch
    nvidia_smi: bool = False
    cuda_visible_devices: str | None = None
    nccl_available: bool = False
    gloo_available: bool = False
    cpu_count: int | None = None
    cpu_count_physical: int | None = None
    ram_bytes: int | None = None
    cxx_compiler: str | None = None  # the path of torch.compile's C++ compiler (CPU); "missing"; None: not checked
    errors: list[str] = field(default_factory=list)


@dataclass
class Problem:
    """A finding: what is wrong (or, from :func:`compatibility_notes`, worth knowing) and what to do."""

    code: str
    message: str
    fix: str


def _probe_torch(f: Facts) -> None:
    import torch

    f.torch_version = torch.__version__
    f.torch_cuda_build = torch.version.cuda
    try:
        # The doctor asks torch.cuda.is_available() on purpose (it initialises CUDA, as the cuDNN check
        # below does anyway): a CUDA build that NVML says has GPUs but that cannot start is a finding.
        f.cuda_available = bool(torch.cuda.is_available())
        f.torch_gpu_count = cuda_device_count() if f.cuda_available else 0
    except Exception as err:
        f.errors.append(f"torch.cuda: {err}")
    try:
        f.cudnn_version = torch.backends.cudnn.version() if f.torch_cuda_build else None
    except Exception as err:
        f.errors.append(f"cudnn version: {err}")
    if f.cuda_available:
        try:  # the smallest convolution that goes through cuDNN
            x = torch.ones(1, 1, 3, 3, device="cuda")
            torch.nn.functional.conv2d(x, torch.ones(1, 1, 2, 2, device="cuda"))
            torch.cuda.synchronize()
            f.cudnn_check = "ok"
        except Exception as err:
            f.cudnn_check = str(err).splitlines()[0][:200]
        if not f.gpus:
            for i in range(f.torch_gpu_count):
                try:
                    p = torch.cuda.get_device_properties(i)
                    f.gpus.append(GpuInfo(i, p.name, p.total_memory, f"{p.major}.{p.minor}"))
                except Exception as err:
                    f.errors.append(f"gpu {i}: {err}")
    try:
        import torch.distributed as dist

        f.nccl_available = bool(dist.is_available() and dist.is_nccl_available())
        f.gloo_available = bool(dist.is_available() and dist.is_gloo_available())
    except Exception as err:
        f.errors.append(f"torch.distributed: {err}")


def _probe_nvml(f: Facts) -> None:
    opened = open_nvml()
    if opened.nvml is None:
        f.nvml = "missing" if opened.missing else f"error: {opened.error}"
        return
    pynvml = opened.nvml
    try:
        f.nvml = "ok"
        drv = pynvml.nvmlSystemGetDriverVersion()
        f.driver_version = drv.decode() if isinstance(drv, bytes) else str(drv)
        v = pynvml.nvmlSystemGetCudaDriverVersion()
        f.driver_cuda_version = f"{v // 1000}.{(v % 1000) // 10}"
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            f.gpus.append(GpuInfo(i, name.decode() if isinstance(name, bytes) else str(name),
                                  int(pynvml.nvmlDeviceGetMemoryInfo(h).total), f"{cc[0]}.{cc[1]}"))
    except Exception as err:
        f.errors.append(f"nvml: {err}")
    finally:
        close_nvml(pynvml)


def _probe_host(f: Facts) -> None:
    f.cpu_count = os.cpu_count()
    f.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    f.nvidia_smi = shutil.which("nvidia-smi") is not None
    f.cxx_compiler = find_cxx_compiler() or "missing"
    try:
        import psutil

        f.cpu_count_physical = psutil.cpu_count(logical=False)
        f.ram_bytes = int(psutil.virtual_memory().total)
    except Exception as err:
        f.errors.append(f"psutil: {err}")


def probe() -> Facts:
    """Collect the facts about this machine. Never raises."""
    f = Facts()
    for step in (_probe_host, _probe_nvml, _probe_torch):
        try:
            step(f)
        except Exception as err:  # the doctor reports, it does not crash
            f.errors.append(f"{step.__name__[7:]}: {type(err).__name__}: {err}")
    return f


def _version_tuple(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in str(v).split(".")[:2])
    except ValueError:
        return ()


def diagnose(f: Facts) -> list[Problem]:
    """The problems visible in ``f``, each with its fix. Empty on a healthy machine."""
    out: list[Problem] = []
    hw_gpus = len(f.gpus) if f.nvml == "ok" else (1 if f.nvidia_smi else 0)
    if f.torch_cuda_build is None and hw_gpus:
        out.append(Problem(
            "cpu-build-on-gpu-machine",
            f"this machine has {hw_gpus} NVIDIA GPU(s) but torch {f.torch_version} is a CPU build, so it cannot use them",
            f"install the CUDA build of the same version: {CUDA_WHEEL_HINT} (or: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128)",
        ))
    build, drv = _version_tuple(f.torch_cuda_build), _version_tuple(f.driver_cuda_version)
    if build and drv and drv[0] < build[0]:  # another major family: minor-version compatibility does not reach
        need = MIN_DRIVER.get(build[0])
        out.append(Problem(
            "driver-too-old",
            f"torch was built for CUDA {f.torch_cuda_build} but the driver {f.driver_version} supports CUDA {f.driver_cuda_version} "
            f"at most: a CUDA {build[0]}.x build needs a driver of the {build[0]}.x family",
            f"update the NVIDIA driver to one for CUDA {build[0]}.x" + (f" ({need} or newer on Linux)" if need else "")
            + f", or install a torch build for CUDA {drv[0]}.x",
        ))
    cvd = f.cuda_visible_devices
    if f.torch_cuda_build and hw_gpus and f.torch_gpu_count == 0 and cvd is not None:
        out.append(Problem(
            "gpus-hidden",
            f"NVML sees {hw_gpus} GPU(s) but torch sees none: CUDA_VISIBLE_DEVICES={cvd!r} hides them",
            "unset CUDA_VISIBLE_DEVICES (or set it to the GPU indices you want, e.g. CUDA_VISIBLE_DEVICES=0,1) before starting Python",
        ))
    if f.torch_cuda_build and hw_gpus and not f.cuda_available and cvd is None and not out:
        out.append(Problem(
            "cuda-unavailable",
            "torch is a CUDA build and GPUs are present, yet torch.cuda.is_available() is False",
            "run nvidia-smi; if it fails, reinstall the driver; if it works, reinstall torch and check that nothing sets LD_LIBRARY_PATH to another CUDA",
        ))
    if f.cuda_available and (f.cudnn_version is None or (f.cudnn_check not in (None, "ok"))):
        detail = f.cudnn_check if f.cudnn_check not in (None, "ok") else "cuDNN is not available"
        out.append(Problem(
            "cudnn",
            f"cuDNN does not work: {detail}",
            "torch wheels bundle their own cuDNN: remove other cuDNN/CUDA folders from LD_LIBRARY_PATH and reinstall torch. "
            "CUDNN_STATUS_NOT_INITIALIZED or _ALLOC_FAILED often means the GPU is out of memory: check nvidia-smi",
        ))
    return out


def compatibility_notes(f: Facts) -> list[Problem]:
    """What is worth knowing but not wrong: a driver of the build's CUDA major version whose minor
    version is older runs the build under minor-version compatibility, with its two exceptions."""
    build, drv = _version_tuple(f.torch_cuda_build), _version_tuple(f.driver_cuda_version)
    if not (build and drv and drv[0] == build[0] and drv < build):
        return []
    return [Problem(
        "minor-version-compat",
        f"torch was built for CUDA {f.torch_cuda_build} and the driver supports CUDA {f.driver_cuda_version}: the same "
        f"major version, so the build runs under CUDA's minor-version compatibility",
        "nothing to do unless you hit one of its limits: an API that needs a newer driver "
        "(cudaErrorCallRequiresNewerDriver), or PTX from a newer toolkit that this driver cannot JIT-compile "
        f"(cudaErrorUnsupportedPtxVersion); then update the driver to one for CUDA {f.torch_cuda_build} or newer",
    )]


def toolchain_problems(f: Facts) -> list[Problem]:
    """A missing C++ compiler: torch.compile cannot build its CPU kernels (lab 12). Kept out of
    :func:`diagnose`, lab 00's exercise, which triages installs of torch and CUDA."""
    if f.cxx_compiler != "missing":
        return []
    return [Problem("no-cxx-compiler", f"torch.compile on a CPU needs a C++ compiler, and `{cxx_compiler_name()}` "
                    "is not on PATH (lab 12's compiled cells cannot run)", missing_compiler_fix())]


def lab_modes(f: Facts) -> list[dict[str, Any]]:
    """For each lab: ``real`` if this machine has the GPUs it needs, else ``logical``."""
    gpus = f.torch_gpu_count if f.cuda_available else 0
    rows = []
    for lab in LABS:
        if lab.devices == 0:
            mode, where = "real", "cpu" if gpus == 0 else "cpu + cuda"
        elif gpus >= lab.devices:
            mode, where = "real", f"{lab.devices} GPU(s)"
        else:
            mode, where = "logical", lab.fallback.format(physical="cuda:0" if gpus else "cpu")
        rows.append({"lab": lab.id, "needs_gpus": lab.devices, "mode": mode, "where": where})
    return rows


def summary_mode(f: Facts) -> str:
    gpus = f.torch_gpu_count if f.cuda_available else 0
    return "cpu-only" if gpus == 0 else ("single-gpu" if gpus == 1 else f"multi-gpu ({gpus})")


def report(f: Facts | None = None) -> dict[str, Any]:
    """The whole report as a JSON-able dict.

    While lab 00 is graded, the diagnosis is the student's exercise and is masked
    (:mod:`gpulab.autograde.box.mask`): the report then has the facts and no findings, and says so.
    """
    f = f or probe()
    try:
        problems, notes, masked = diagnose(f), compatibility_notes(f), None
    except MaskedReference as err:
        problems, notes, masked = [], [], f"no findings: {err}"
    problems += toolchain_problems(f)
    out = {
        "mode": summary_mode(f),
        "facts": dataclasses.asdict(f),
        "problems": [dataclasses.asdict(p) for p in problems],
        "notes": [dataclasses.asdict(n) for n in notes],
        "labs": lab_modes(f),
    }
    if masked:
        out["masked"] = masked
    share = current_share()  # on a course hub (make hub): what this student's server was given
    if share is not None:
        out["share"] = share
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    rep = report()
    print(json.dumps(rep, indent=2) if args.json else format_report(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
