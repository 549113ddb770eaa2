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
    from gpulab.autograde.box.run import _env

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "canary-1")
    monkeypatch.setenv("GITHUB_TOKEN", "canary-2")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")  # where a GPU machine keeps libcuda
    env = _env(tmp_path, Limits(threads=2), seed=7)
    assert "canary-1" not in env.values() and "canary-2" not in env.values()
    assert env["LANG"] == "C.UTF-8" and env["GPULAB_SEED"] == "7" and env["GPULAB_GRADING"] == "graded"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env["HOME"].startswith(str(tmp_path)) and env["OMP_NUM_THREADS"] == "2"


def test_kernel_environment_keeps_every_cache_in_the_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch writes TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor_<user> into os.environ the first time
    # the grader process imports torch._dynamo; a kernel that inherits it writes outside its box.
    import torch._dynamo  # noqa: F401

    from gpulab.autograde.box.run import _env
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_elsewhere")
    monkeypatch.setenv("TMPDIR", "/tmp")
    env = _env(tmp_path, Limits())
    for key in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "XDG_CACHE_HOME", "MPLCONFIGDIR"):
        assert Path(env[key]).is_relative_to(tmp_path / "tmp"), (key, env[key])
    # with a mount namespace, TMPDIR is the submission's private, size-capped /tmp; caches stay in the box
    env = _env(tmp_path, Limits(), private_tmp=True)
    assert env["TMPDIR"] == "/tmp" and Path(env["MPLCONFIGDIR"]).is_relative_to(tmp_path / "tmp")
