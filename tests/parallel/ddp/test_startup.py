"""gpulab.parallel.ddp.startup: threads per rank, the backend rule, and the start method (fork unless CUDA
is initialised or the platform has none)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from gpulab.parallel import resolve_backend, threads_per_rank
from gpulab.parallel.ddp import startup


def test_threads_per_rank_divides_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert threads_per_rank(1) == cores
    assert threads_per_rank(2) == max(1, cores // 2)
    assert threads_per_rank(10 * cores) == 1


def _port(rank, world_size):
    return int(os.environ["MASTER_PORT"])


def test_resolve_backend(monkeypatch):
    assert resolve_backend("gloo", 4) == "gloo"
    monkeypatch.setattr(startup, "_usable_gpus", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert resolve_backend("auto", 2) == "nccl"
    assert resolve_backend("auto", 3) == "gloo", "3 ranks on 2 GPUs would share a GPU, which NCCL refuses"
    monkeypatch.setattr(startup, "_usable_gpus", lambda: 0)
    assert resolve_backend("auto", 1) == "gloo"


def test_cuda_initialised_in_the_caller_means_spawn_for_nccl(monkeypatch):
    monkeypatch.setattr(startup, "_fork_poisoned", lambda: True)
    assert startup._choose_start_method(_port, (), "nccl", None) == "spawn"
    assert startup._choose_start_method(_port, (), "gloo", None) == "fork", "gloo ranks on the CPU can still fork"
    with pytest.raises(ValueError, match="CUDA is already initialised"):
        startup._choose_start_method(lambda r, w: r, (), "nccl", None)
    with pytest.raises(ValueError, match="restart the kernel"):
        startup._choose_start_method(_port, (), "nccl", "fork")


def test_a_cpu_build_never_poisons_fork():
    if torch.cuda._is_compiled():
        pytest.skip("CUDA build: covered by the gpu tests")
    assert startup._fork_poisoned() is False
