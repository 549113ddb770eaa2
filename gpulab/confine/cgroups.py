"""A cgroup per submission: a cap on tasks (``pids.max``), a cap on memory, and a kill of every
process in it at the end, so that nothing a submission started outlives it.

cgroup v2 (``<the grader's cgroup>/gpulab-grade-<pid>-<n>``) needs the ``pids`` and ``memory``
controllers delegated to the grader's cgroup (root on a host, a container with its own cgroup
namespace, ``systemd-run --scope -p Delegate=yes``); ``cgroup.kill`` (Linux 5.14) kills the group
in one write. On cgroup v1 the same files live in one tree per controller, and the kill freezes the
group (``freezer``), SIGKILLs every member and thaws it. A hybrid machine (v1 controllers and an
empty cgroup2 at ``/sys/fs/cgroup/unified``, as the development VM and CI) gets v1 limits and the
v2 kill. :func:`detect` tries each tree for real, beneath the grader's own cgroup, so whatever
limits the grader runs under still hold.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "gpulab-grade-"
_COUNTER = itertools.count()


@dataclass(frozen=True)
class Tree:
    """One cgroup hierarchy the grader may create groups in."""

    version: int          # 1 or 2
    base: Path            # the grader's own cgroup in this tree: groups are created beneath it
    name: str             # "pids", "memory", "freezer" (v1) or "unified" (v2)


@dataclass
class Support:
    """Which tree gives each protection (None: this machine does not), and why not."""

    pids: Tree | None = None
    memory: Tree | None = None
    kill: Tree | None = None       # v2 (cgroup.kill) or v1 freezer
    why_not: dict[str, str] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Process cap, memory cap and a whole-group kill are all available."""
        return None not in (self.pids, self.memory, self.kill)

    def describe(self) -> str:
        """E.g. ``pids.max and memory on cgroup v1, kill by cgroup v2 cgroup.kill``."""
        def where(tree: Tree | None, what: str) -> str:
            if tree is None:
                return f"no {what} ({self.why_not.get(what, 'unavailable')})"
            return f"{what} on cgroup v{tree.version}"
        kill = ("no kill of the whole group" if self.kill is None else
                "kill by cgroup v2 cgroup.kill" if self.kill.version == 2 else "kill by cgroup v1 freezer")
        return f"{where(self.pids, 'pids.max')}, {where(self.memory, 'memory')}, {kill}"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root within the hierarchy, fstype, options) of every cgroup mount."""
    out = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((fields[4], fields[3], tail[0], set(tail[2].split(",")) | set(fields[5].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """The grader's cgroup in each hierarchy: ``{"": v2 path, "pids": v1 path, ...}``."""
    out = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in parts[1].split(",") if parts[1] else [""]:
            out[ctrl] = parts[2]
    return out


def _base(mount: str, root: str, own: str) -> Path | None:
    if not (own == root or own.startswith(root.rstrip("/") + "/")):
        return None  # the grader's cgroup is outside what this mount shows
    return Path(mount) / own[len(root.rstrip("/")):].lstrip("/")


def _try_group(tree: Tree, files: dict[str, str], needs: tuple[str, ...] = ()) -> str | None:
    """Create a probe group beneath ``tree.base``, check its ``needs`` files, write ``files``, remove it;
    why not, or None."""
    probe = tree.base / f"{PREFIX}probe-{os.getpid()}-{next(_COUNTER)}"
    try:
        probe.mkdir()
    except OSError as err:
        return f"cannot create a group in {tree.base}: {err.strerror}"
    try:
        for name in needs:
            if not (probe / name).exists():
                return f"no {name} in {tree.base} (Linux 5.14 or later has it)"
        for name, value in files.items():
            (probe / name).write_text(value)
        return None
    except OSError as err:
        return f"cannot set {name} in {tree.base}: {err.strerror}"
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


def _enable_v2(base: Path, wanted: set[str]) -> str | None:
    """Make ``wanted`` controllers available to groups beneath ``base``; None when done."""
    try:
        have = set((base / "cgroup.controllers").read_text().split())
        missing = wanted - have
        if missing:
            return f"the {' and '.join(sorted(missing))} controller(s) are not delegated to {base}"
        enabled = set((base / "cgroup.subtree_control").read_text().split())
        if wanted - enabled:
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(wanted - enabled)))
        return None
    except OSError as err:
        return f"cannot enable pids and memory in {base}/cgroup.subtree_control: {err.strerror}"


def detect() -> Support:
    """Find, by trying them, the cgroup trees this process can limit and kill submissions in."""
    sup = Support()
    own = _own_paths()
    v2, v2_top = None, None
    v1_trees: dict[str, Tree] = {}
    for mount, root, fstype, opts in _mounts():
        if fstype == "cgroup2" and "" in own and v2 is None:
            base = _base(mount, root, own[""])
            v2 = Tree(2, base, "unified") if base is not None and base.is_dir() else None
            v2_top = Path(mount)
        elif fstype == "cgroup":
            for ctrl in ("pids", "memory", "freezer"):
                if ctrl in opts and ctrl in own and ctrl not in v1_trees:
                    base = _base(mount, root, own[ctrl])
                    if base is not None and base.is_dir():
                        v1_trees[ctrl] = Tree(1, base, ctrl)
    if v2 is not None:
        # the grader's own cgroup first; as root, the top of the tree when the own one holds
        # processes (cgroup v2 hands controllers down only from a cgroup without any, the root
        # excepted): a root grader in a systemd session scope
        candidates = [v2] + ([Tree(2, v2_top, "unified")] if v2_top != v2.base and os.geteuid() == 0 else [])
        for tree in candidates:
            why = _enable_v2(tree.base, {"pids", "memory"})
            if why is None and _try_group(tree, {"pids.max": "64", "memory.max": str(2**30)}) is None:
                sup.pids = sup.memory = v2 = tree
                sup.why_not.pop("pids.max", None)
                sup.why_not.pop("memory", None)
                break
            sup.why_not.setdefault("pids.max", why or "cannot write pids.max and memory.max")
            sup.why_not.setdefault("memory", sup.why_not["pids.max"])
        if _try_group(v2, {}, needs=("cgroup.kill",)) is None:
            sup.kill = v2
    for ctrl, limit_file, value in (("pids", "pids.max", "64"), ("memory", "memory.limit_in_bytes", str(2**30))):
        tree = v1_trees.get(ctrl)
        if getattr(sup, ctrl) is None and tree is not None:
            why = _try_group(tree, {limit_file: value})
            if why is None:
                setattr(sup, ctrl, tree)
                sup.why_not.pop("pids.max" if ctrl == "pids" else "memory", None)
            else:
                sup.why_not["pids.max" if ctrl == "pids" else "memory"] = why
    if sup.kill is None and "freezer" in v1_trees and _try_group(v1_trees["freezer"], {"freezer.state": "THAWED"}) is None:
        sup.kill = v1_trees["freezer"]
    if not _mounts():
        sup.why_not.update({"pids.max": "no cgroup file system", "memory": "no cgroup file system"})
    elif v2 is None and not v1_trees:
        sup.why_not.setdefault("pids.max", "the grader's cgroup is not visible")
        sup.why_not.setdefault("memory", "the grader's cgroup is not visible")
    return sup


class Group:
    """One submission's cgroup, a folder in each tree :class:`Support` uses: the memory cap of the whole
    submission (tmpfs pages included) and ``pids_max`` + ``grader_pids`` on it, with two leaves (v2
    lets only leaves hold processes): ``grader`` (nbgrader) and ``kernel``, whose own ``pids.max``
    keeps a fork bomb from starving nbgrader. 0 means no cap."""

    LEAVES = ("grader", "kernel")

    def __init__(self, support: Support, pids_max: int, memory_bytes: int, grader_pids: int = 256) -> None:
        self.support = support
        self.name = f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"
        self.dirs: dict[Tree, Path] = {}
        try:
            for tree in dict.fromkeys(t for t in (support.pids, support.memory, support.kill) if t is not None):
                path = tree.base / self.name
                path.mkdir()
                self.dirs[tree] = path
                if tree.version == 2:  # hand the controllers down to the leaves
                    wanted = [c for c, t in (("pids", support.pids), ("memory", support.memory)) if t is tree]
                    if wanted:
                        (path / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
                for leaf in self.LEAVES:
                    (path / leaf).mkdir()
            if support.pids is not None and pids_max:
                top = self.dirs[support.pids]
                (top / "pids.max").write_text(str(pids_max + grader_pids))
                (top / "kernel" / "pids.max").write_text(str(pids_max))
            if support.memory is not None and memory_bytes:
                top = self.dirs[support.memory]
                if support.memory.version == 2:
                    (top / "memory.max").write_text(str(memory_bytes))
                    _write_if_exists(top / "memory.swap.max", "0")  # a cap that swaps is no cap
                else:
                    (top / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    _write_if_exists(top / "memory.memsw.limit_in_bytes", str(memory_bytes))
        except OSError:
            self.remove()
            raise

    def procs_files(self, leaf: str) -> list[str]:
        """The ``cgroup.procs`` files a process writes ``0`` into to join ``leaf`` (in every tree)."""
        return [str(d / leaf / "cgroup.procs") for d in self.dirs.values()]

    def members(self) -> set[int]:
        """Pids of the processes in the group (as this process's pid namespace names them)."""
        pids: set[int] = set()
        for d in self.dirs.values():
            for folder in (d, *(d / leaf for leaf in self.LEAVES)):
                try:
                    pids |= {int(p) for p in (folder / "cgroup.procs").read_text().split()}
                except OSError:
                    continue
        return pids

    def kill(self, timeout_s: float = 10.0) -> int:
        """SIGKILL every process in the group and wait until it is empty; return how many were
        found at the start."""
        found = len(self.members())
        kill = self.support.kill
        if kill is not None and kill.version == 2:
            _write_if_exists(self.dirs[kill] / "cgroup.kill", "1")
        elif kill is not None:  # v1: freeze so nothing forks while the members are killed
            state = self.dirs[kill] / "freezer.state"
            _write_if_exists(state, "FROZEN")
            self._kill_each()
            _write_if_exists(state, "THAWED")  # SIGKILL is delivered once the tasks run again
        deadline = time.monotonic() + timeout_s
        while self.members() and time.monotonic() < deadline:
            self._kill_each()  # also the no-freezer case, and a member that slipped in meanwhile
            time.sleep(0.02)
        return found

    def _kill_each(self) -> None:
        for pid in self.members():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                continue

    def peaks(self) -> dict[str, int | None]:
        """The most tasks the kernel's leaf and bytes the group held (None where the tree does not
        record it), and how often the caps refused a fork or were reached."""
        out: dict[str, int | None] = {"pids_peak": None, "pids_refused": None, "memory_peak": None, "oom_kills": None}
        if self.support.pids is not None:
            d = self.dirs[self.support.pids] / "kernel"
            out["pids_peak"] = _read_int(d / "pids.peak")
            out["pids_refused"] = _read_key(d / "pids.events", "max")
        if self.support.memory is not None:
            d = self.dirs[self.support.memory]
            if self.support.memory.version == 2:  # memory.events counts the whole subtree
                out["memory_peak"] = _read_int(d / "memory.peak")
                out["oom_kills"] = _read_key(d / "memory.events", "oom_kill")
            else:  # v1 counts an OOM kill in the group the victim was in
                out["memory_peak"] = _read_int(d / "memory.max_usage_in_bytes")
                kills = [_read_key(f / "memory.oom_control", "oom_kill") for f in (d, *(d / leaf for leaf in self.LEAVES))]
                out["oom_kills"] = sum(k or 0 for k in kills)
        return out

    def remove(self) -> None:
        """Remove the group's folders (a cgroup with members cannot be removed: :meth:`kill` first)."""
        for d in self.dirs.values():
            for folder in (*(d / leaf for leaf in self.LEAVES), d):
                for _ in range(50):
                    try:
                        folder.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.02)  # the last members are still being reaped


def _write_if_exists(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except FileNotFoundError:
        pass


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _read_key(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None
