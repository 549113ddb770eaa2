"""This process's share of a shared course server, for the doctor: what the hub gave it
(``GPULAB_SHARE``, set by ``make hub``'s spawner) and what the kernel really enforces (the memory
cap and CPU quota of this process's cgroup, v1 or v2), so a student sees both and a mismatch shows.
Outside a hub, on a laptop, there is no share and nothing is reported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

UNLIMITED = 2**62  # cgroup v1 reports "no limit" as a huge number


def _cgroup_paths() -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in (ctrls.split(",") if ctrls else [""]):
                out[c] = path
    except OSError:
        pass
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def enforced() -> dict[str, Any]:
    """The memory cap (bytes) and the CPU quota (cores) of this process's cgroup; None where none."""
    own = _cgroup_paths()
    root = Path("/sys/fs/cgroup")
    memory = cpus = None
    if "memory" in own:  # v1: the group's path is relative to the tree's mount, which may be nested
        for base in (root / "memory" / own["memory"].lstrip("/"), root / "memory"):
            raw = _read(base / "memory.limit_in_bytes")
            if raw is not None:
                memory = int(raw) if int(raw) < UNLIMITED else None
                break
    if "cpu" in own:
        quota = _read(root / "cpu" / own["cpu"].lstrip("/") / "cpu.cfs_quota_us")
        period = _read(root / "cpu" / own["cpu"].lstrip("/") / "cpu.cfs_period_us")
        if quota and period and int(quota) > 0:
            cpus = int(quota) / int(period)
    if "" in own and memory is None and cpus is None:  # v2
        base = root / own[""].lstrip("/")
        raw = _read(base / "memory.max")
        memory = int(raw) if raw and raw != "max" else None
        raw = _read(base / "cpu.max")
        if raw and not raw.startswith("max"):
            quota, period = raw.split()
            cpus = int(quota) / int(period)
    return {"memory_bytes": memory, "cpus": cpus}


def current() -> dict[str, Any] | None:
    """The hub's share of this process (``GPULAB_SHARE``) with what is enforced; None off a hub."""
    raw = os.environ.get("GPULAB_SHARE")
    if not raw:
        return None
    try:
        given = json.loads(raw)
    except ValueError:
        return {"error": f"GPULAB_SHARE is not JSON: {raw[:80]!r}"}
    return {"given": given, "enforced": enforced(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def describe(share: dict[str, Any]) -> list[str]:
    """The doctor's lines about a share (see :func:`current`)."""
    if "error" in share:
        return [f"share:       {share['error']}"]
    g, e = share["given"], share["enforced"]
    gpu = (f"GPU {','.join(map(str, g['gpus']))} (CUDA_VISIBLE_DEVICES={share['cuda_visible_devices']!r}; "
           f"{g['students_per_gpu']} student(s) on it)") if g.get("gpus") else "no GPU"
    mem = f"{e['memory_bytes'] / 2**20:.0f} MiB" if e["memory_bytes"] else "not enforced"
    cpu = f"{e['cpus']:g} core(s)" if e["cpus"] else "not enforced"
    return [f"share:       this course server gave {g.get('user', 'you')}: {gpu}, {g['cpus']:g} core(s), "
            f"{g['memory_mb']} MiB of memory",
            f"             enforced by the OS: memory cap {mem}, CPU quota {cpu}"]
