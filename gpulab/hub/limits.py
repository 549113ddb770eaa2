"""Each student's share enforced: one cgroup per user, which their server and every kernel it starts
inherit.

    <tree>/gpulab-hub/<user>/      memory cap (no swap past it), CPU quota (cores x period)

cgroup v1 (one tree per controller: ``memory`` and ``cpu``) and cgroup v2 (one tree, with the
``memory`` and ``cpu`` controllers handed down) are both handled; the groups are made beneath the
hub's own cgroup in each tree (v2: the top of the tree when the hub runs as root and its own cgroup
holds processes, as v2 hands controllers only to cgroups without any). The server joins its group
in the spawner's ``preexec_fn``, still as root, just before it becomes the student: nothing it
starts can leave. Where no cgroup can be written (not root, no controllers), :func:`detect` says
why and the hub runs without the caps, saying so (the shares are still set in the environment).

:func:`teardown` kills what is left in the groups and removes them, when the hub stops.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

TOP = "gpulab-hub"
PERIOD_US = 100_000


@dataclass
class Trees:
    """Where the per-user groups go, per controller (None: not available here)."""

    memory: Path | None = None
    cpu: Path | None = None
    version: int = 0
    why_not: list[str] = field(default_factory=list)

    def roots(self) -> list[Path]:
        return list(dict.fromkeys(p for p in (self.memory, self.cpu) if p is not None))

    def describe(self) -> str:
        have = [name for name, p in (("memory cap", self.memory), ("CPU quota", self.cpu)) if p is not None]
        if not have:
            return "no per-student caps (" + "; ".join(self.why_not or ["no writable cgroup"]) + ")"
        return f"{' and '.join(have)} per student on cgroup v{self.version}" + (
            f" (not: {'; '.join(self.why_not)})" if self.why_not else "")


def _own() -> dict[str, str]:
    """Controller -> this process's cgroup path (``""`` for the v2 tree)."""
    out = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for c in (ctrls.split(",") if ctrls else [""]):
            out[c] = path
    return out


def _mounts() -> list[tuple[Path, str, str, set[str]]]:
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        f, tail = left.split(), right.split()
        if tail and tail[0] in ("cgroup", "cgroup2"):
            out.append((Path(f[4]), f[3], tail[0], set(tail[2].split(",")) if len(tail) > 2 else set()))
    return out


def _under(mount: Path, root: str, own: str) -> Path:
    rel = os.path.relpath(own, root) if own.startswith(root) else own.lstrip("/")
    return (mount / rel).resolve() if rel != "." else mount


def _probe(base: Path, files: dict[str, str]) -> str | None:
    probe = base / f"{TOP}-probe-{os.getpid()}"
    try:
        probe.mkdir()
        for name, value in files.items():
            (probe / name).write_text(value)
        return None
    except OSError as err:
        return f"{base}: {err.strerror or err}"
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def detect() -> Trees:
    """Find, by trying, where this process can make memory- and CPU-capped groups."""
    t = Trees()
    if os.geteuid() != 0:
        t.why_not.append("the hub is not root")
        return t
    try:
        own, mounts = _own(), _mounts()
    except OSError as err:
        t.why_not.append(f"cannot read /proc: {err}")
        return t
    for mount, root, fstype, opts in mounts:
        if fstype != "cgroup":
            continue
        for ctrl, files in (("memory", {"memory.limit_in_bytes": str(2**30)}),
                            ("cpu", {"cpu.cfs_quota_us": str(PERIOD_US)})):
            if ctrl in opts and ctrl in own and getattr(t, ctrl) is None:
                base = _under(mount, root, own[ctrl])
                why = _probe(base, files)
                if why is None:
                    setattr(t, ctrl, base)
                    t.version = 1
                else:
                    t.why_not.append(why)
    if t.memory is None and t.cpu is None:
        for mount, root, fstype, _ in mounts:
            if fstype != "cgroup2" or "" not in own:
                continue
            for base in dict.fromkeys([_under(mount, root, own[""]), mount]):
                try:
                    wanted = {"memory", "cpu"} & set((base / "cgroup.controllers").read_text().split())
                    if wanted:
                        (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted)))
                except OSError as err:
                    t.why_not.append(f"{base}: {err.strerror or err}")
                    continue
                if "memory" in wanted and _probe(base, {}) is None:
                    t.memory = base
                if "cpu" in wanted and _probe(base, {}) is None:
                    t.cpu = base
                if t.memory or t.cpu:
                    t.version = 2
                    break
            break
    return t


def group(trees: Trees, user: str) -> list[Path]:
    """The user's group folder in each tree."""
    return [root / TOP / user for root in trees.roots()]


def prepare(trees: Trees, user: str, cpus: float | None, memory_mb: int | None) -> list[str]:
    """Create (or update) ``user``'s groups with the caps; return the files a process writes its pid
    into to join them (what the spawner's ``preexec_fn`` does)."""
    procs = []
    for root in trees.roots():
        top = root / TOP
        top.mkdir(exist_ok=True)
        if trees.version == 2:
            ctrls = [c for c, p in (("memory", trees.memory), ("cpu", trees.cpu)) if p == root]
            (top / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in ctrls))
        d = top / user
        d.mkdir(exist_ok=True)
        if root == trees.memory and memory_mb:
            limit = str(memory_mb * 2**20)
            if trees.version == 1:
                (d / "memory.limit_in_bytes").write_text(limit)
                _write(d / "memory.memsw.limit_in_bytes", limit)  # no swapping past the cap
            else:
                (d / "memory.max").write_text(limit)
                _write(d / "memory.swap.max", "0")
        if root == trees.cpu and cpus:
            quota = str(max(1000, int(cpus * PERIOD_US)))
            if trees.version == 1:
                (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(quota)
            else:
                (d / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        procs.append(str(d / "cgroup.procs"))
    return procs


def join(procs_files: list[str]) -> None:
    """Move the calling process into the groups (called in the child, before it drops root)."""
    pid = str(os.getpid())
    for f in procs_files:
        with open(f, "w") as fh:
            fh.write(pid)


def members(trees: Trees, user: str | None = None) -> set[int]:
    """Pids in ``user``'s groups (every user's, when None)."""
    dirs = group(trees, user) if user else [d for r in trees.roots() for d in (r / TOP).glob("*") if d.is_dir()]
    pids: set[int] = set()
    for d in dirs:
        try:
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        except OSError:
            continue
    return pids


def kill(trees: Trees, user: str | None = None, timeout_s: float = 10.0) -> int:
    """SIGKILL everything left in the groups; return how many processes there were."""
    found = members(trees, user)
    deadline = time.monotonic() + timeout_s
    while (left := members(trees, user)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.05)
    return len(found)


def teardown(trees: Trees) -> None:
    """Kill what is left in every user's group and remove the groups (the hub stopped)."""
    kill(trees)
    for root in trees.roots():
        top = root / TOP
        for d in [*top.glob("*"), top]:
            if d.is_dir():
                for _ in range(50):
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except (FileNotFoundError, PermissionError):
        pass
