"""Run nbgrader's own ``autograde`` of one submission in its box, in its namespaces and cgroup, with
an environment from an allow-list; every process of the submission is gone on return, and also
when the grader itself is killed (:func:`die_with_grader`: the box's first process gets SIGKILL
when its grader's thread dies; it is ``unshare --kill-child``, so the whole PID namespace goes)."""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpulab.autograde.limits import Limits
from gpulab.autograde.nbgrader import nbgrader_command, nbgrader_env
from gpulab.confine import cuda_paths, isolation

# and every variable CUDA, NCCL, Triton and torch's allocator read (cuda_paths.is_cuda_env)
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "LC_MESSAGES", "TZ", "TERM",
               "PYTHONPATH", "VIRTUAL_ENV", "KINETO_LOG_LEVEL")


_PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)  # loaded before any fork
except OSError:  # not Linux: no parent-death signal
    _LIBC = None


def die_with_grader() -> None:
    """``preexec_fn`` of every process the grader starts for a submission or a reference run: it gets
    SIGKILL when the grader's thread that started it dies (a ``make grade`` killed by any signal, a
    closed terminal), so nothing of the class outlives its grader. Only an async-signal-safe call
    runs between fork and exec (libc is loaded beforehand)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def sandbox_env(box: Path, limits: Limits, private_tmp: bool = False, seed: int | None = None) -> dict[str, str]:
    """nbgrader's and the kernel's environment (the reference run's too): :data:`ENV_ALLOWED`, CUDA's,
    NCCL's, Triton's and the allocator's variables (:func:`cuda_paths.cuda_env`), and every cache and
    ``HOME`` in the grading copy (``TMPDIR``: the private ``/tmp``, else ``box/tmp``)."""
    tmp = box / "tmp"
    extra = {"GPULAB_SANDBOX": str(box), "HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp" if private_tmp else str(tmp),
             "MPLCONFIGDIR": str(tmp / "matplotlib"),
             "IPYTHONDIR": str(tmp / "ipython"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
             # the grader's home may be hidden in the submission's namespace (nsinit.expose): the
             # course's nbgrader_config.py is the configuration, not ~/.jupyter
             "JUPYTER_CONFIG_DIR": str(tmp / "jupyter"), "JUPYTER_DATA_DIR": str(tmp / "jupyter" / "data"),
             "XDG_CACHE_HOME": str(tmp / "cache"), "TRITON_CACHE_DIR": str(tmp / "cache" / "triton"),
             # torch writes its own choice back into os.environ on first use of torch._dynamo, so a
             # grader process that used it would hand /tmp/torchinductor_<user> to every kernel.
             "TORCHINDUCTOR_CACHE_DIR": str(tmp / "cache" / "torchinductor"),
             "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "agg",
             # the kernel sends evidence, not verdicts, on inputs from this run's seed (gpulab.evidence.codec)
             "GPULAB_GRADING": "graded"}
    if seed is not None:
        extra["GPULAB_SEED"] = str(seed)
    if limits.threads:
        extra.update(OMP_NUM_THREADS=str(limits.threads), MKL_NUM_THREADS=str(limits.threads))
    outside = nbgrader_env()
    env = {k: v for k, v in outside.items() if k in ENV_ALLOWED}
    env.update(cuda_paths.cuda_env(outside, cuda_paths.machine().present))
    env.update(extra)
    return env



def run_autograde(box: Path, lab: str, student: str, limits: Limits,
                  cancel: threading.Event | None = None,
                  sub: isolation.Submission | None = None, seed: int | None = None) -> tuple[int | None, bool]:
    """``nbgrader autograde`` in ``box`` under the wall-clock limit, in ``sub``'s namespaces and cgroup;
    every process of the submission is gone on return. (exit status or None if killed, timed out)"""
    private_tmp = sub is not None and sub.plan.namespaces
    cmd = nbgrader_command() + ["autograde", lab, f"--student={student}", "--force"]
    if limits.confine_writes:
        # nbgrader itself writes only in the grading copy: a link the kernel left cannot carry its
        # writes into the course (Landlock; without it, links.remove_unsafe is the only guard)
        extra = (["/tmp"] if private_tmp else []) + (sub.kernel_cgroup_dirs() if sub is not None else [])
        cmd = [sys.executable, "-m", "gpulab.confine.jail", "--write", str(box),
               *[a for d in extra for a in ("--write", d)], "--", *cmd]
    if sub is not None:
        cmd = sub.join_command() + sub.wrap(cmd, report=box / "namespace.json")
    t0 = time.monotonic()
    with open(box / "nbgrader.log", "wb") as log:
        # A session of its own, no terminal: a student's process group signals cannot reach the grader.
        proc = subprocess.Popen(cmd, cwd=box, env=sandbox_env(box, limits, private_tmp, seed), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_grader)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5), False
                except subprocess.TimeoutExpired:
                    if time.monotonic() - t0 > limits.wall_s or (cancel is not None and cancel.is_set()):
                        isolation.kill_tree(proc.pid)
                        proc.wait()
                        return None, time.monotonic() - t0 > limits.wall_s
        finally:
            if sub is not None:
                sub.finish()
            if sub is None or not (sub.plan.namespaces or sub.group is not None):
                isolation.kill_marked(str(box))  # no PID namespace, no cgroup: the environment marker is all there is


