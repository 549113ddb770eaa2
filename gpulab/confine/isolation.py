"""OS isolation of each submission, from what Linux already has. Its ``nbgrader autograde``, and so
its kernel, runs:

- in **namespaces of its own** (util-linux ``unshare``, :mod:`gpulab.confine.nsinit` as PID 1): PID
  (its end kills every process left), IPC, network (a loopback of its own), UTS and mount (a
  private, size-capped ``/tmp`` and ``/dev/shm``, its own ``/dev/pts``, the rest of the machine
  hidden but the system, this Python and gpulab, gpulab's references masked);
- in a **cgroup of its own** (:mod:`gpulab.confine.cgroups`): tasks and memory capped, killed whole;
- with the **kernel under an identity of its own**: as root, an unused uid with no capabilities
  (``setpriv``); as a user, root of a new user namespace with no capability left;
- under **Landlock** and the audit hook (:mod:`gpulab.confine.jail`).

:func:`detect` tries each layer once per run; ``make grade`` refuses to grade without one unless
the instructor passes ``--allow-weaker-sandbox`` (``ALLOW_WEAKER_SANDBOX=1``).

Why not an established tool: bubblewrap would make the namespaces and mounts, but not the cgroup,
the capped folders copied back, nor the report of what was left running, and CI and many
instructors' machines lack it, so this code would stay as the fallback; ``systemd-run --scope -p``
needs systemd as PID 1 (not in containers or CI); nsjail has no Debian 12 package. util-linux's
``unshare`` and ``setpriv`` are on every Linux.
"""

from __future__ import annotations

import os
import platform
import pwd
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from gpulab.confine import cgroups
from gpulab.confine.jail import landlock_abi

UNSHARE_NS = ["--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation", "private",
              "--ipc", "--net", "--uts"]
# Kernel uids are picked at random here, away from the system's, the users' and the usual
# subordinate ranges (/etc/subuid starts at 100000 and grows by 65536 per user).
KERNEL_UIDS = range(1_900_000_000, 1_900_000_000 + 2**20)
ALLOW_FLAG = "--allow-weaker-sandbox"
MAKE_VAR = "ALLOW_WEAKER_SANDBOX=1"


@dataclass
class Layer:
    """One protection: whether it is in force on this machine, and how (or why not)."""

    name: str
    on: bool
    how: str


@dataclass
class Plan:
    """What this machine gives every submission (from :func:`detect`)."""

    root: bool = False
    namespaces: bool = False
    why_not_namespaces: str = ""
    kernel_uid: bool = False          # the kernel drops to a uid of its own (grader is root)
    why_not_kernel_uid: str = ""
    cgroups: cgroups.Support = field(default_factory=cgroups.Support)
    landlock: int = 0
    landlock_needed: bool = True      # some file rule is on (writes or reads confined)

    @property
    def userns(self) -> bool:
        """The namespaces sit in a new user namespace (the grader is not root)."""
        return self.namespaces and not self.root

    @property
    def layers(self) -> list[Layer]:
        """Every protection, in force or not, with how (or why not)."""
        if self.root:
            ident = Layer("kernel identity", self.kernel_uid, "a uid of its own with no capabilities (setpriv)"
                          if self.kernel_uid else self.why_not_kernel_uid or "not tried")
        else:
            ident = Layer("kernel identity", self.namespaces, "a user namespace (the grader's uid outside, no "
                          "capabilities)" if self.namespaces else self.why_not_namespaces)
        ns = ("PID, IPC, network, mount (private /tmp, /dev/shm, /dev/pts and capped folders, the rest of the machine "
              "hidden, gpulab's references masked) and UTS namespaces (unshare"
              + (", in a user namespace)" if self.userns else ")"))
        sup = self.cgroups
        kills = ([] if sup.kill is None else [f"cgroup v{sup.kill.version} "
                                              + ("cgroup.kill" if sup.kill.version == 2 else "freezer")])
        kills += ["the end of the PID namespace"] if self.namespaces else []
        return [
            ident,
            Layer("namespaces", self.namespaces, ns if self.namespaces else self.why_not_namespaces),
            Layer("cgroup limits", sup.pids is not None and sup.memory is not None, sup.describe()),
            Layer("whole-group kill", bool(kills), " and ".join(kills) or "no cgroup kill and no PID namespace"),
            Layer("Landlock file rules", self.landlock >= 1 or not self.landlock_needed,
                  f"Landlock ABI {self.landlock}" if self.landlock else "no Landlock on this kernel (Linux 5.13+)"),
            Layer("Landlock signal scope", self.landlock >= 6,
                  "Landlock ABI 6 scope" if self.landlock >= 6 else "needs Landlock ABI 6 (Linux 6.12)"),
        ]

    def off(self) -> list[Layer]:
        """The protections that are not in force."""
        return [layer for layer in self.layers if not layer.on]

    def note(self) -> str:
        """The note every row of ``grades.csv`` gets when a protection is off ('' when none is)."""
        off = self.off()
        return "" if not off else "graded with weaker isolation: " + "; ".join(f"{x.name} off ({x.how})" for x in off)

    def refusal(self) -> str:
        """Why ``make grade`` will not run here without the flag."""
        lines = [f"  - {x.name}: {x.how}" for x in self.off()]
        return ("this machine cannot give each submission the full sandbox; missing:\n" + "\n".join(lines) +
                f"\nGrade on Linux with user namespaces, cgroups and Landlock (docs/instructor.md, \"Threat model\"), "
                f"or accept the weaker sandbox with `make grade {MAKE_VAR}` (python -m gpulab.autograde "
                f"{ALLOW_FLAG}); each row of grades.csv then names what was off.")


def _unshare_flags(root: bool) -> list[str]:
    return UNSHARE_NS if root else ["--user", "--map-root-user", *UNSHARE_NS]


def kernel_paths() -> list[str]:
    """What a kernel must reach: this Python's installation and environment, the gpulab package and
    ``PYTHONPATH`` (resolved, outermost only)."""
    import gpulab

    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable)))}
    paths.add(str(Path(gpulab.__file__).resolve().parent))  # the package, not the checkout around it
    paths |= {os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    paths = {p for p in paths if os.path.isdir(p)}
    return sorted(p for p in paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in paths))


def kept_under_tmp() -> list[str]:
    """What of the machine's ``/tmp`` a private ``/tmp`` still shows, read-only: :func:`kernel_paths` there."""
    from gpulab.confine.nsinit import under_tmp

    return under_tmp(kernel_paths())


def _keep_args(paths: list[str]) -> list[str]:
    """nsinit's ``--keep`` for ``paths`` (:func:`kernel_paths`), which a private ``/tmp`` must not hide."""
    return [a for p in paths for a in ("--keep", p)]


def _kernel_prefix(uid: int, groups: list[int] | tuple[int, ...] = ()) -> list[str]:
    """``setpriv`` to ``uid`` with no capability; ``groups``: the only supplementary groups it keeps
    (those a GPU's device files are opened through, :attr:`cuda_paths.CudaBinds.groups`)."""
    keep = f"--groups={','.join(map(str, groups))}" if groups else "--clear-groups"
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", keep, "--inh-caps=-all", "--bounding-set=-all", "--"]


def _try(root: bool) -> tuple[str | None, str | None]:
    """Try the namespaces with the real init and, as root, a Python under an unused uid in them; why
    each does not work (None: it does)."""
    if platform.system() != "Linux":
        return f"Linux namespaces do not exist on {platform.system()}", "needs Linux namespaces"
    if shutil.which("unshare") is None:
        return "util-linux unshare is not installed", "needs util-linux unshare"
    paths = kernel_paths()
    init = [sys.executable, "-m", "gpulab.confine.nsinit", "--tmp-mb", "1", "--shm-mb", "1", *_keep_args(paths)]
    check = [sys.executable, "-c", "import sys, gpulab.confine.jail; print(sys.base_prefix)"]
    proc = _run(["unshare", *_unshare_flags(root), "--", *init, "--", *check])
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        hint = "" if root else " (user namespaces may be disabled: sysctl kernel.unprivileged_userns_clone, " \
                               "kernel.apparmor_restrict_unprivileged_userns)"
        return f"unshare failed: {why}{hint}", "needs the namespaces"
    if not root:
        return None, None
    if shutil.which("setpriv") is None:
        return None, "the grader is root and util-linux setpriv is missing"
    exposed = [a for p in paths for a in ("--expose", p)]
    proc = _run(["unshare", *_unshare_flags(root), "--", *init, *exposed, "--", *_kernel_prefix(pick_kernel_uid()),
                 *check])
    if proc.returncode != 0 or proc.stdout.strip() != sys.base_prefix:
        why = (proc.stderr.strip().splitlines() or [proc.stdout.strip() or "no message"])[-1]
        return None, f"this Python cannot run under an unprivileged uid ({why[-160:]})"
    return None, None


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return subprocess.CompletedProcess(cmd, 1, "", str(err))


def detect(confine_writes: bool = True, confine_reads: bool = True) -> Plan:
    """Try every layer on this machine (about 0.2 s) and say which are in force."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    why_ns, why_uid = _try(root)
    linux = platform.system() == "Linux"
    return Plan(root=root, namespaces=why_ns is None, why_not_namespaces=why_ns or "",
                kernel_uid=root and why_uid is None, why_not_kernel_uid=why_uid or "",
                cgroups=cgroups.detect() if linux else cgroups.Support(
                    why_not={"pids.max": "no cgroups on this system", "memory": "no cgroups on this system"}),
                landlock=landlock_abi(), landlock_needed=confine_writes or confine_reads)


def _uid_in_use(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    for proc in psutil.process_iter(["uids"]):
        uids = proc.info.get("uids")
        if uids is not None and uid in (uids.real, uids.effective, uids.saved):
            return True
    return False


def pick_kernel_uid(taken: set[int] = frozenset()) -> int:
    """An unused uid for one kernel: no account has it and no process runs under it."""
    rng = random.SystemRandom()
    for _ in range(100):
        uid = rng.choice(KERNEL_UIDS)
        if uid not in taken and not _uid_in_use(uid):
            return uid
    raise RuntimeError("no unused uid found for the kernel")


def _joiner(procs_files: list[str]) -> list[str]:
    """A ``sh`` prefix that joins each ``cgroup.procs`` and then execs the command, which is in the
    group from its first instruction."""
    if not procs_files:
        return []
    writes = " && ".join(f"echo 0 > '{p}'" for p in procs_files)
    return ["sh", "-c", f'{writes} && exec "$@"', "sh"]


def give(uid: int, *paths: str | Path) -> None:
    """``chown`` ``paths`` and everything beneath them to ``uid`` (links are changed, never followed)."""
    for path in map(str, paths):
        os.chown(path, uid, uid, follow_symlinks=False)
        if os.path.isdir(path) and not os.path.islink(path):
            for dirpath, dirnames, filenames in os.walk(path):
                for name in dirnames + filenames:
                    os.chown(os.path.join(dirpath, name), uid, uid, follow_symlinks=False)


@dataclass
class Submission:
    """The isolation of one submission: its cgroup, its kernel's uid, and what nsinit mounts."""

    plan: Plan
    pids_max: int
    memory_mb: int
    tmp_mb: int
    shm_mb: int
    group: cgroups.Group | None = None
    uid: int | None = None
    peaks: dict[str, int | None] = field(default_factory=dict)
    masks: list[str] = field(default_factory=list)  # what no kernel may read (nsinit --mask)
    binds: list[tuple[str, str]] = field(default_factory=list)  # masked references over the originals (nsinit --bind)
    visible: list[str] = field(default_factory=list)  # writable paths kept when the machine is hidden (the grading folder)
    quotas: list[str] = field(default_factory=list)  # FOLDER:MIB:FILES for nsinit --quota
    copy_back: list[str] = field(default_factory=list)  # the quota folders nbgrader's results are read from
    see: list[str] = field(default_factory=list)  # read-only folders kept when the machine is hidden (CUDA's)
    groups: list[int] = field(default_factory=list)  # the kernel uid's groups (a GPU's device files)

    def __post_init__(self) -> None:
        sup = self.plan.cgroups
        if sup.pids is not None or sup.memory is not None or sup.kill is not None:
            self.group = cgroups.Group(sup, self.pids_max, self.memory_mb * 2**20)
        if self.plan.kernel_uid:
            self.uid = pick_kernel_uid()

    def wrap(self, command: list[str], report: Path | None = None) -> list[str]:
        """``command`` (nbgrader) started in the submission's namespaces and cgroup."""
        if not self.plan.namespaces:
            return command
        paths = kernel_paths()
        shown = paths + [p for p in self.see if p not in paths]  # CUDA's folders: read-only, like this Python
        init = [sys.executable, "-m", "gpulab.confine.nsinit", "--tmp-mb", str(self.tmp_mb), "--shm-mb", str(self.shm_mb),
                *_keep_args(paths)]
        for procs in self.group.procs_files("grader") if self.group else []:
            init += ["--cgroup-procs", procs]
        if report is not None:
            init += ["--report", str(report)]
        init += [a for p in self.masks for a in ("--mask", p)]
        init += [a for src, dst in self.binds for a in ("--bind", f"{src}:{dst}")]
        init += [a for q in self.quotas for a in ("--quota", q)]
        init += [a for b in self.copy_back for a in ("--copy-back", b)]
        if self.visible:  # the rest of the machine (homes, other clones of the course) is not in the namespace
            init += ["--hide", *[a for p in shown for a in ("--see", p)], *[a for p in self.visible for a in ("--see-rw", p)]]
        if self.uid is not None:  # the kernel's uid must reach this Python, even under a closed home folder
            init += [a for p in shown for a in ("--expose", p)]
        return ["unshare", *_unshare_flags(self.plan.root), "--", *init, "--", *command]

    def join_command(self) -> list[str]:
        """Without namespaces, a ``sh`` prefix that puts the command in the cgroup before it runs."""
        if self.plan.namespaces or self.group is None:
            return []
        return _joiner(self.group.procs_files("grader"))

    def kernel_prefix(self) -> list[str]:
        """What goes before the kernel's command: join the cgroup's kernel leaf, then drop to the
        kernel's uid (root) or keep no capability (a user namespace's root)."""
        prefix = _joiner(self.group.procs_files("kernel")) if self.group is not None else []
        if self.uid is not None:
            return prefix + _kernel_prefix(self.uid, self.groups)
        if self.plan.userns and shutil.which("setpriv"):
            return prefix + ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
        return prefix

    def kernel_cgroup_dirs(self) -> list[str]:
        """The kernel leaf's folders: nbgrader (under Landlock) must be let to write there to move
        the kernel in."""
        return [str(Path(p).parent) for p in self.group.procs_files("kernel")] if self.group is not None else []

    def give(self, *paths: Path) -> None:
        """Hand ``paths`` (and what is beneath them) to the kernel's uid."""
        if self.uid is not None:
            give(self.uid, *paths)

    def finish(self) -> dict[str, int | None]:
        """Kill every process left in the group, remove it, and return its peaks."""
        if self.group is not None:
            self.group.kill()
            self.peaks = self.group.peaks()
            self.group.remove()
            self.group = None
        return self.peaks


# ---- without a PID namespace and a cgroup (a weaker sandbox): every process of a submission carries
# GPULAB_SANDBOX=<grading copy> in its environment, and is killed by tree and by that marker; one
# that drops the marker as well as leaving the tree escapes this ----

def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants."""
    try:
        root = psutil.Process(pid)
        procs = root.children(recursive=True) + [root]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def kill_marked(marker: str) -> int:
    """SIGKILL every process of this user whose environment carries ``GPULAB_SANDBOX=marker``
    (a student's process that outlived its kernel, even one that left the process tree)."""
    killed = 0
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get("GPULAB_SANDBOX") == marker:
                p.kill()
                killed += 1
        except (psutil.Error, OSError):
            continue
    return killed
