"""gpulab.parallel.launcher.startup: threads per rank, the backend rule, and the start method (fork unless CUDA
is initialised or the platform has none)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from gpulab.devices import MachineSpec
from gpulab.parallel import rank_device, resolve_backend, threads_per_rank
from gpulab.parallel.launcher import startup


def test_threads_per_rank_divides_the_cores():
    cores = len(os.sched_getaffinity(0))
    assert threads_per_rank(1) == cores
    assert threads_per_rank(2) == max(1, cores // 2)
    assert threads_per_rank(10 * cores) == 1


def _port(rank, world_size):
    return int(os.environ["MASTER_PORT"])


def test_resolve_backend(monkeypatch):
    """resolve_backend is lab 00's choose_backend applied to MachineSpec.this_machine()."""
    assert resolve_backend("gloo", 4) == "gloo"

    def this_machine(num_gpus, nccl=True):
        monkeypatch.setattr(MachineSpec, "this_machine", classmethod(lambda cls: MachineSpec(num_gpus, True, nccl)))

    this_machine(2)
    assert resolve_backend("auto", 2) == "nccl"
    assert resolve_backend("auto", 3) == "gloo", "3 ranks on 2 GPUs would share a GPU, which NCCL refuses"
    assert resolve_backend("nccl", 2) == "nccl"
    with pytest.raises(ValueError, match="2 usable GPU"):
        resolve_backend("nccl", 3)
    this_machine(4, nccl=False)
    with pytest.raises(ValueError, match="no NCCL"):
        resolve_backend("nccl", 2)
    this_machine(0)
    assert resolve_backend("auto", 1) == "gloo"
    with pytest.raises(ValueError, match="world_size"):
        resolve_backend("auto", 0)


def test_rank_device_follows_place_ranks_under_nccl_and_stays_on_the_cpu_under_gloo(monkeypatch):
    """Inside a process group: place_ranks' GPU under nccl, the CPU under gloo (even with GPUs)."""
    monkeypatch.setattr(MachineSpec, "this_machine", classmethod(lambda cls: MachineSpec(2, True, True)))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 4)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    assert [rank_device(r) for r in range(4)] == [torch.device(d) for d in ("cuda:0", "cuda:1", "cuda:0", "cuda:1")]
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    assert rank_device() == torch.device("cuda:1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert rank_device() == torch.device("cuda:0"), "torchrun's LOCAL_RANK wins over the global rank"
    monkeypatch.setattr(dist, "get_backend", lambda: "gloo")
    assert rank_device(1) == torch.device("cpu")


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
