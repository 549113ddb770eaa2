"""What a CUDA process needs of the machine, found on it: the ``/dev/nvidia*`` devices, the folders
that hold the driver's and CUDA's libraries (and the toolkit ``CUDA_HOME`` names), and the
environment variables CUDA, NCCL, Triton and torch read.

A graded kernel runs with the rest of the machine hidden (:func:`gpulab.confine.nsinit.hide_machine`),
an environment from an allow-list and a data rlimit; :func:`cuda_binds` says what of the machine
must stay in reach so that CUDA works there as it does outside. It only reads files under ``root``
(a faked GPU machine's layout in the tests), runs ``ldconfig -p`` only on the real machine, and
never initialises CUDA. On a machine without an NVIDIA device it finds nothing and nothing changes.
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping

# The device files of the NVIDIA driver: the control device, unified memory, one per GPU, the mode
# setter, and the capability files MIG instances are opened through.
DEVICE_GLOBS = ("dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools", "dev/nvidia-modeset",
                "dev/nvidia[0-9]*", "dev/nvidia-caps", "dev/nvidia-caps-imex-channels")
# A folder is a CUDA library folder when it holds one of these (the driver's, NVML's, the runtime's).
LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libcudart.so", "libnvidia-ptxjitcompiler.so", "libnvrtc.so")
# Where drivers and toolkits live: distributions, the NVIDIA container toolkit, clusters, WSL.
KNOWN_FOLDERS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
                 "lib/x86_64-linux-gnu", "lib64", "usr/local/nvidia/lib64", "usr/local/nvidia/lib",
                 "usr/lib/wsl/lib", "opt/nvidia/lib64", "usr/local/cuda/compat")
TOOLKIT_GLOBS = ("usr/local/cuda", "usr/local/cuda-*", "opt/cuda", "opt/cuda-*")
TOOLKIT_LIBS = ("lib64", "lib", "targets/*/lib", "compat")
# What CUDA, NCCL, Triton and torch's allocator read from the environment.
ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
             "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NVML_BASED_CUDA_CHECK",
             "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH")
ENV_PREFIXES = ("NCCL_", "TRITON_")
# NVML numbers GPUs by PCI bus id, CUDA by speed unless told: with this both name the same GPU.
DEVICE_ORDER = "PCI_BUS_ID"


@dataclass(frozen=True)
class CudaBinds:
    """What of the machine a CUDA process needs: ``devices`` (the driver's files), ``libraries`` (the
    folders of its libraries), ``toolkits`` (CUDA roots: ``bin/ptxas``, headers), ``env`` (the names
    of the set variables to pass on), ``groups`` (the groups a device file is opened through, when
    others may not open it)."""

    devices: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)
    toolkits: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)

    @property
    def present(self) -> bool:
        """An NVIDIA GPU's device files are here (the control device and at least one GPU)."""
        names = {os.path.basename(d) for d in self.devices}
        return "nvidiactl" in names and any(n[len("nvidia"):].isdigit() for n in names)

    @property
    def folders(self) -> list[str]:
        """The library and toolkit folders, outermost only: what a hidden machine must show, read-only."""
        every = sorted(set(self.libraries) | set(self.toolkits))
        return [p for p in every if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in every)]


def is_cuda_env(name: str) -> bool:
    """Whether a variable named ``name`` is one CUDA, NCCL, Triton or torch's allocator reads."""
    return name in ENV_NAMES or name.startswith(ENV_PREFIXES)


def cuda_env(environ: Mapping[str, str], present: bool) -> dict[str, str]:
    """Of ``environ``, the variables a CUDA process reads; on a GPU machine ``CUDA_DEVICE_ORDER``
    is ``PCI_BUS_ID`` unless set, so a ``CUDA_VISIBLE_DEVICES`` index means the GPU NVML means."""
    env = {k: v for k, v in environ.items() if is_cuda_env(k)}
    if present:
        env.setdefault("CUDA_DEVICE_ORDER", DEVICE_ORDER)
    return env


def _ldconfig() -> str:
    exe = shutil.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if exe is None:
        return ""
    try:
        return subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _holds_library(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(n.startswith(lib) for n in names for lib in LIBRARIES)


def _under(root: str, path: str) -> str:
    return os.path.normpath(os.path.join(root, path.lstrip("/")))


def cuda_binds(root: str = "/", environ: Mapping[str, str] | None = None, ldconfig: str | None = None) -> CudaBinds:
    """What a CUDA process needs on the machine under ``root`` (``environ``: os.environ; ``ldconfig``:
    the text of ``ldconfig -p``, run here when ``root`` is ``/``). Empty lists where there is no
    NVIDIA device, whatever libraries are installed: nothing then changes for a CPU-only kernel."""
    environ = os.environ if environ is None else environ
    devices = sorted({p for g in DEVICE_GLOBS for p in glob.glob(_under(root, g))})
    env = sorted(k for k in cuda_env(environ, bool(devices)) if k in environ)
    if not devices:
        return CudaBinds(env=env)
    candidates = [_under(root, f) for f in KNOWN_FOLDERS]
    text = ldconfig if ldconfig is not None else (_ldconfig() if os.path.realpath(root) == "/" else "")
    for line in text.splitlines():
        lib, _, path = line.strip().partition(" => ")
        if path and lib.startswith(LIBRARIES):
            candidates += [os.path.dirname(_under(root, path))]
    toolkits = [p for g in TOOLKIT_GLOBS for p in sorted(glob.glob(_under(root, g)))]
    toolkits += [_under(root, environ[k]) for k in ("CUDA_HOME", "CUDA_PATH") if environ.get(k)]
    toolkits = sorted({os.path.realpath(t) for t in toolkits if os.path.isdir(t)})
    candidates += [p for t in toolkits for sub in TOOLKIT_LIBS for p in glob.glob(os.path.join(t, sub))]
    candidates += [_under(root, p) for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    libraries: set[str] = set()
    for folder in candidates:
        if _holds_library(folder):
            libraries.add(os.path.normpath(folder))
            libraries.add(os.path.realpath(folder))  # a link's target is what the kernel must reach
            for name in os.listdir(folder):  # libcuda.so.1 -> a driver folder elsewhere (container toolkits)
                if name.startswith(LIBRARIES):
                    libraries.add(os.path.dirname(os.path.realpath(os.path.join(folder, name))))
    groups = sorted({st.st_gid for st in map(os.stat, devices)
                     if stat.S_ISCHR(st.st_mode) and (st.st_mode & 0o006) != 0o006 and st.st_gid != 0})
    return CudaBinds(devices=devices, libraries=sorted(libraries), toolkits=toolkits, env=env, groups=groups)


@lru_cache(maxsize=1)
def machine() -> CudaBinds:
    """:func:`cuda_binds` of this machine, found once per process."""
    return cuda_binds()


def kernel_memory_mb(memory_mb: int, present: bool) -> int:
    """The data rlimit (MiB, 0: none) a kernel gets for ``memory_mb``: none on a GPU machine, since a
    CUDA context maps far more than any per-process cap (its unified address space, pinned pools);
    there the submission's cgroup memory cap is the limit (where the machine has none, every row of
    grades.csv already says the cgroup limits are off)."""
    return 0 if present else memory_mb
