"""gpulab.confine.cuda_paths: on a faked GPU machine's layout (device files, the driver's libraries
in the distribution's folder, a toolkit under /usr/local, a cluster's folder named by
LD_LIBRARY_PATH, a driver folder under /opt reached through a link) it finds every device file,
every library folder and every CUDA variable, and on a CPU machine nothing; the kernel's command
line then shows those folders and keeps the devices' group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gpulab.confine import cuda_paths, isolation
from gpulab.confine.cuda_paths import cuda_binds


def _touch(path: Path, target: Path | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if target is not None:
        path.symlink_to(target)
    else:
        path.write_bytes(b"")
    return path


def _gpu_machine(root: Path, gpus: int = 2) -> dict[str, str]:
    for name in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", *[f"nvidia{i}" for i in range(gpus)]]:
        _touch(root / "dev" / name)
    (root / "dev" / "nvidia-caps").mkdir()
    _touch(root / "dev" / "null")  # not the driver's
    driver = _touch(root / "opt" / "nvidia" / "driver-570" / "libcuda.so.570.86.15")
    _touch(root / "usr/lib/x86_64-linux-gnu/libcuda.so.1", driver)  # the container toolkit's link
    _touch(root / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")
    _touch(root / "usr/local/cuda-13.0/lib64/libcudart.so.13")
    _touch(root / "usr/local/cuda-13.0/bin/ptxas")
    (root / "usr/local/cuda").symlink_to(root / "usr/local/cuda-13.0")
    _touch(root / "cluster/cuda/lib/libnvrtc.so.13")
    _touch(root / "cluster/empty/libz.so.1")  # on LD_LIBRARY_PATH, but no CUDA library in it
    return {"LD_LIBRARY_PATH": "/cluster/cuda/lib:/cluster/empty", "CUDA_HOME": "/usr/local/cuda",
            "CUDA_VISIBLE_DEVICES": "1,0", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1",
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
            "AWS_SECRET_ACCESS_KEY": "canary", "HOME": "/root"}


LDCONFIG = """1234 libs found in cache `/etc/ld.so.cache'
\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
\tlibz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1
"""


def test_a_gpu_machines_devices_library_folders_and_variables_are_found(tmp_path: Path) -> None:
    env = _gpu_machine(tmp_path)
    got = cuda_binds(str(tmp_path), env, LDCONFIG)
    assert got.present
    assert got.devices == sorted(str(tmp_path / "dev" / n) for n in
                                 ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia1", "nvidia-caps"))
    assert got.libraries == sorted(str(tmp_path / p) for p in (
        "usr/lib/x86_64-linux-gnu", "opt/nvidia/driver-570", "usr/local/cuda-13.0/lib64", "cluster/cuda/lib"))
    assert got.toolkits == [str(tmp_path / "usr/local/cuda-13.0")]
    assert got.folders == sorted(str(tmp_path / p) for p in (
        "usr/lib/x86_64-linux-gnu", "opt/nvidia/driver-570", "usr/local/cuda-13.0", "cluster/cuda/lib"))
    assert got.env == ["CUDA_HOME", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "NCCL_DEBUG", "NCCL_P2P_DISABLE",
                       "PYTORCH_CUDA_ALLOC_CONF", "TRITON_PTXAS_PATH"]
    passed = cuda_paths.cuda_env(env, got.present)
    assert passed["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's order is CUDA's
    assert "AWS_SECRET_ACCESS_KEY" not in passed and "HOME" not in passed
    assert cuda_paths.cuda_env({**env, "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, True)["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST"


def test_a_cpu_machine_gets_nothing_and_keeps_its_memory_cap(tmp_path: Path) -> None:
    _touch(tmp_path / "dev" / "null")
    _touch(tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.1")  # a driver package without a GPU
    got = cuda_binds(str(tmp_path), {"LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu"}, LDCONFIG)
    assert not got.present and got.devices == got.libraries == got.folders == got.groups == []
    assert got.env == ["LD_LIBRARY_PATH"] and "CUDA_DEVICE_ORDER" not in cuda_paths.cuda_env({}, False)
    assert cuda_paths.kernel_memory_mb(4096, present=False) == 4096
    assert cuda_paths.kernel_memory_mb(4096, present=True) == 0  # a CUDA context does not fit in RLIMIT_DATA


def test_device_files_closed_to_others_keep_their_group(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        import pytest

        pytest.skip("making character devices needs root")
    _gpu_machine(tmp_path, gpus=1)
    for name in ("nvidiactl", "nvidia0"):
        (tmp_path / "dev" / name).unlink()
        os.mknod(tmp_path / "dev" / name, 0o660 | 0o020000, os.makedev(1, 3))  # char device, like /dev/null
        os.chown(tmp_path / "dev" / name, 0, 44)  # group video
    assert cuda_binds(str(tmp_path), {}, "").groups == [44]
    assert "--groups=44" in isolation._kernel_prefix(1_900_000_001, [44])
    assert "--clear-groups" in isolation._kernel_prefix(1_900_000_001)


def test_the_namespaces_show_cuda_folders_outside_the_system(tmp_path: Path) -> None:
    plan = isolation.Plan(root=True, namespaces=True)
    sub = isolation.Submission(plan, pids_max=128, memory_mb=0, tmp_mb=32, shm_mb=32, visible=[str(tmp_path)],
                               see=["/opt/nvidia/driver-570", sys.prefix])
    cmd = sub.wrap(["true"])
    shown = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--see"]
    assert "/opt/nvidia/driver-570" in shown and shown.count(os.path.realpath(sys.prefix)) <= 1
