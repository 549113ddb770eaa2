"""Each student's share of the server: a GPU each, then round robin; CPU and memory split evenly."""

from __future__ import annotations

import json

import pytest

from gpulab.hub.shares import assign

STUDENTS = ["s0", "s1", "s2", "s3", "s4"]


def test_one_gpu_each_when_there_are_enough() -> None:
    got = assign(STUDENTS[:3], gpus=4, cpus=32, memory_mb=256_000)
    assert [s.gpus for s in got.values()] == [(0,), (1,), (2,)]
    assert all(s.students_per_gpu == 1 for s in got.values())
    assert got["s1"].env()["CUDA_VISIBLE_DEVICES"] == "1"
    assert got["s1"].env()["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # NVML's index 1 is CUDA's index 1


def test_round_robin_when_there_are_fewer_gpus() -> None:
    got = assign(STUDENTS, gpus=2, cpus=16, memory_mb=100_000)
    assert [s.gpus[0] for s in got.values()] == [0, 1, 0, 1, 0]
    assert [s.students_per_gpu for s in got.values()] == [3, 2, 3, 2, 3]  # GPU 0 has s0, s2, s4


def test_cpu_only_gets_cpu_and_memory_shares_and_no_gpu() -> None:
    got = assign(STUDENTS[:4], gpus=0, cpus=8, memory_mb=40_000)
    s = got["s0"]
    assert s.gpus == () and s.students_per_gpu == 0
    assert s.cpus == 2 and s.memory_mb == int(40_000 * 0.8 / 4)
    env = s.env()
    assert "CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "2"
    assert json.loads(env["GPULAB_SHARE"])["memory_mb"] == s.memory_mb


def test_more_students_than_cores_get_half_a_core_at_least() -> None:
    got = assign(STUDENTS, gpus=0, cpus=2, memory_mb=64_000)
    assert {s.cpus for s in got.values()} == {0.5}
    assert got["s0"].env()["OMP_NUM_THREADS"] == "1"


def test_explicit_shares_and_their_bounds() -> None:
    got = assign(STUDENTS[:2], gpus=1, cpus=8, memory_mb=32_000, cpus_per_student=3, memory_mb_per_student=4096)
    assert got["s1"].cpus == 3 and got["s1"].memory_mb == 4096 and got["s1"].gpus == (0,)
    with pytest.raises(ValueError, match="this machine has 8 core"):
        assign(STUDENTS, 0, 8, 32_000, cpus_per_student=9)
    with pytest.raises(ValueError, match="MEM_PER_STUDENT"):
        assign(STUDENTS, 0, 8, 2_000)  # 320 MiB each: too little for a lab's kernel
    assert assign([], 0, 1, 1) == {}
