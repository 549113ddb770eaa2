"""What each student's server is given: a GPU (or none), CPU cores and memory.

- **GPU server.** Students get GPUs in roster order, one each while there are enough, then round
  robin (student ``i`` gets GPU ``i mod n``): ``CUDA_VISIBLE_DEVICES`` names it, so inside the
  server it is ``cuda:0``. A GPU's memory is not split by the OS; the share says how many students
  have it, and the doctor shows that.
- **CPU and memory.** Every student gets the same share: the cores (a CFS quota, so a busy student
  cannot take more than that) and the memory (a hard cap of their server and all its kernels)
  after a reserve for the system and the instructors. Both can be set by hand.

Instructors are not limited: they grade, and grading has limits of its own (``make grade``).
The shares are computed here, with no side effect; :mod:`gpulab.hub.limits` enforces them.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

MiB = 2**20
RESERVED_FRACTION = 0.2      # of the machine's memory kept for the system, the hub and the instructors
MIN_MEMORY_MB = 512          # below this a lab's kernel does not start; refuse rather than hand it out


@dataclass(frozen=True)
class Share:
    """One student's part of the machine."""

    user: str
    gpus: tuple[int, ...]       # physical GPU indices (empty: none, a CPU-only server)
    students_per_gpu: int       # how many students share that GPU (0 without one)
    cpus: float                 # cores (CFS quota)
    memory_mb: int              # hard cap of the server and its kernels

    def env(self) -> dict[str, str]:
        """The environment of the student's server: the GPU it sees, threads for its cores, and the
        share itself (``GPULAB_SHARE``, which the doctor reports)."""
        env = {"GPULAB_SHARE": json.dumps(asdict(self), sort_keys=True),
               "OMP_NUM_THREADS": str(max(1, int(self.cpus))),
               "MEM_LIMIT": str(self.memory_mb * MiB), "CPU_LIMIT": f"{self.cpus:g}"}
        if self.gpus:  # NVML's indices: CUDA counts in the same (PCI bus) order only when told to
            env.update(CUDA_VISIBLE_DEVICES=",".join(map(str, self.gpus)), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        return env


def assign(students: list[str], gpus: int, cpus: int, memory_mb: int, cpus_per_student: float | None = None,
           memory_mb_per_student: int | None = None) -> dict[str, Share]:
    """Each student's share of a machine with ``gpus`` GPUs, ``cpus`` cores and ``memory_mb`` MiB.

    Args:
        students: in roster order (the order GPUs are handed out in).
        gpus: physical GPUs (0: CPU-only).
        cpus: the machine's cores.
        memory_mb: the machine's memory.
        cpus_per_student: cores each (default: the machine's, split evenly, at least 0.5 each;
            at most all of them).
        memory_mb_per_student: MiB each (default: 80 % of the machine, split evenly).

    Raises:
        ValueError: a share too small to run a lab, or larger than the machine, naming the fix.
    """
    if not students:
        return {}
    if gpus < 0 or cpus < 1 or memory_mb < 1:
        raise ValueError(f"a machine with {gpus} GPU(s), {cpus} core(s) and {memory_mb} MiB cannot be shared")
    n = len(students)
    cpu = cpus_per_student if cpus_per_student is not None else max(0.5, round(cpus / n, 2))
    if not 0 < cpu <= cpus:
        raise ValueError(f"CPUS_PER_STUDENT={cpu:g} but this machine has {cpus} core(s); use 0.1 to {cpus}")
    mem = memory_mb_per_student if memory_mb_per_student is not None else int(memory_mb * (1 - RESERVED_FRACTION) / n)
    if mem < MIN_MEMORY_MB:
        raise ValueError(f"{n} students on {memory_mb} MiB leaves {mem} MiB each, below the {MIN_MEMORY_MB} MiB a lab's "
                         f"kernel needs: host fewer students, or set MEM_PER_STUDENT (MiB) explicitly")
    if mem > memory_mb:
        raise ValueError(f"MEM_PER_STUDENT={mem} MiB but this machine has {memory_mb} MiB; use at most that")
    out = {}
    for i, user in enumerate(students):
        gpu = (i % gpus,) if gpus else ()
        sharing = len(range(i % gpus, n, gpus)) if gpus else 0
        out[user] = Share(user, gpu, sharing, cpu, mem)
    return out


def machine() -> tuple[int, int, int]:
    """(GPUs, cores, MiB of memory) of this machine. GPUs are counted without initialising CUDA
    (``nvidia-smi -L``), as the hub must not hold a CUDA context of its own."""
    import shutil
    import subprocess

    gpus = 0
    smi = shutil.which("nvidia-smi")
    if smi:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False, timeout=30)
        gpus = sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.returncode == 0 else 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return gpus, cores, pages * size // MiB
