"""gpulab.autograde.box.prepare: limits are checked with the fix, and the kernel's environment keeps every cache
in its box."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.autograde.limits import Limits


def test_limits_reject_bad_values_with_the_fix() -> None:
    with pytest.raises(ValueError, match="positive"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="at least 256 MiB"):
        Limits(memory_mb=100)
    with pytest.raises(ValueError, match="'data' or 'as'"):
        Limits(memory_rlimit="rss")
    assert Limits(memory_mb=0).memory_mb == 0  # 0 switches the cap off
    with pytest.raises(ValueError, match="at least 64 tasks"):
        Limits(pids_max=10)
    with pytest.raises(ValueError, match="at least 16 MiB"):
        Limits(shm_mb=1)
    assert Limits(memory_mb=1024, tmp_mb=100, shm_mb=200, disk_mb=300).cgroup_memory_mb() == 1024 + 100 + 200 + 600 + 1024
    with pytest.raises(ValueError, match="at least 64 MiB and 1000 files"):
        Limits(files_max=10)
    assert Limits(memory_mb=0).cgroup_memory_mb() == 0


def test_kernel_environment_is_an_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing the instructor exported reaches a kernel: tokens and credentials stay out."""
    from gpulab.autograde.box.run import sandbox_env

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-1")
    monkeypatch.setenv("GITHUB_TOKEN", "canary-2")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")  # where a GPU machine keeps libcuda
    env = sandbox_env(tmp_path, Limits(threads=2), seed=7)
    assert "canary-1" not in env.values() and "canary-2" not in env.values()
    assert env["LANG"] == "C.UTF-8" and env["GPULAB_SEED"] == "7" and env["GPULAB_GRADING"] == "graded"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env["HOME"].startswith(str(tmp_path)) and env["OMP_NUM_THREADS"] == "2"


def test_kernel_environment_keeps_every_cache_in_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch writes TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user> into os.environ the first time
    # the grader process imports torch._dynamo; a kernel that inherits it writes outside its box.
    import torch._dynamo  # noqa: F401

    from gpulab.autograde.box.run import sandbox_env
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_elsewhere")
    monkeypatch.setenv("TMPDIR", "/tmp")
    env = sandbox_env(tmp_path, Limits())
    for key in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert Path(env[key]).is_relative_to(tmp_path / "tmp"), (key, env[key])
    # with a mount namespace, TMPDIR is the submission's private, size-capped /tmp; caches stay in the box
    env = sandbox_env(tmp_path, Limits(), private_tmp=True)
    assert env["TMPDIR"] == "/tmp" and Path(env["MPLCONFIGDIR"]).is_relative_to(tmp_path / "tmp")


def test_on_a_gpu_machine_the_kernel_gets_cudas_variables_folders_and_no_data_rlimit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a CUDA process needs reaches the graded kernel (and the reference run, which builds its
    environment and memory caps the same way) when the machine has a GPU, and only then."""
    from gpulab.autograde.box import prepare
    from gpulab.autograde.box.run import sandbox_env
    from gpulab.confine import cuda_paths, isolation

    for name, value in {"NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas", "CUDA_VISIBLE_DEVICES": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    cpu = sandbox_env(tmp_path, Limits())
    assert cpu["NCCL_DEBUG"] == "INFO" and cpu["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "CUDA_DEVICE_ORDER" not in cpu and cpu["TRITON_CACHE_DIR"].startswith(str(tmp_path))  # the box's cache wins
    assert prepare.memory_args(Limits(memory_mb=2048))[:2] == ["--memory-mb", "2048"]

    gpu = cuda_paths.CudaBinds(devices=["/dev/nvidiactl", "/dev/nvidia0"], libraries=["/opt/nvidia/lib"],
                               toolkits=["/usr/local/cuda-13.0"], groups=[44])
    monkeypatch.setattr(cuda_paths, "machine", lambda: gpu)
    env = sandbox_env(tmp_path, Limits())
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert prepare.memory_args(Limits(memory_mb=2048))[:2] == ["--memory-mb", "0"]  # the cgroup caps it instead
    sub = isolation.Submission(isolation.Plan(root=True, namespaces=True), pids_max=128, memory_mb=0, tmp_mb=32,
                               shm_mb=32)
    box = tmp_path / "root" / "lab" / "alice"
    box.mkdir(parents=True)
    prepare._mounts(box, "alice", Limits(), sub, None)
    assert sub.see == ["/opt/nvidia/lib", "/usr/local/cuda-13.0"] and sub.groups == [44]
    cmd = sub.wrap(["true"])
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--see"][-2:] == ["/opt/nvidia/lib", "/usr/local/cuda-13.0"]


def test_the_reference_run_gets_the_kernels_environment_and_memory_caps(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference run's kernel sees what a student's sees: the same allow-listed environment (no
    instructor's secret, CUDA's variables kept) and the jail's memory and file-size caps."""
    import subprocess

    from gpulab.autograde import reference
    from gpulab.autograde.box.prepare import memory_args

    seen = {}

    def fake_run(cmd, env, **kw):
        seen.update(cmd=cmd, env=env)
        return subprocess.CompletedProcess(cmd, 1, "", "stopped here")

    monkeypatch.setattr(reference.subprocess, "run", fake_run)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    limits = Limits(memory_mb=2048, fsize_mb=512)
    with pytest.raises(reference.ReferenceError, match="whole log"):
        reference.run_reference(tmp_path / "course", "00_setup", tmp_path / "ref", 7, "s3cret", threads=2, limits=limits)
    env, cmd = seen["env"], seen["cmd"]
    assert "canary" not in env.values() and env["NCCL_SOCKET_IFNAME"] == "lo" and "GPULAB_GRADING" not in env
    assert env["GPULAB_SEED"] == "7" and env["OMP_NUM_THREADS"] == "2" and env["HOME"].startswith(str(tmp_path / "ref"))
    assert [a.split("=", 1)[1] for a in cmd if a.startswith("--jail-arg=")] == memory_args(limits)
    assert (tmp_path / "course" / "grading_logs" / "00_setup.reference.log").read_text() == "stopped here"
