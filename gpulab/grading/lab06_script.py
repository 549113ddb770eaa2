"""Lab 06's grader for the spawn-based script: run the student's ``.py`` file as a program, as a
user would, and read back what rank 0 saved.

The script (written from the notebook with ``%%writefile``) takes
``--seed S --epochs E --world-size N --out PATH``, trains :func:`gpulab.parallel.workloads.spawn_job.make_job`
``(S)`` under torch DDP in N processes it starts with ``torch.multiprocessing.spawn``, and rank 0
saves ``{"params": {name: tensor}, "world_size": N}`` to ``PATH`` with ``torch.save``.

- :func:`run_script` / :func:`run_scripts` (the student's values): one job, or several started at
  the same moment (two jobs on one machine must not fight over a port), each in its own process
  session, killed whole after ``timeout``; a failure raises :class:`ScriptError` with the reason
  and the end of the script's output.
- :func:`~gpulab.parallel.workloads.spawn_job.single_process_training` (the expected value, computed
  only in the reference kernel, masked in the student's): the same job in one process on whole
  global batches, in the order the ranks' samplers read it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from gpulab.parallel.workloads.spawn_job import single_process_training

__all__ = ["SCRIPT", "ScriptError", "require_script", "run_script", "run_scripts", "single_process_training"]

SCRIPT = "ddp_spawn.py"  # written next to the notebook by the exercise's %%writefile cell
_NATIVE = re.compile(r"terminated with signal SIG(ABRT|SEGV)|terminate called|Fatal Python error")
_PORT_TAKEN = ("EADDRINUSE", "address already in use", "Address already in use")


class ScriptError(RuntimeError):
    """The script did not produce a result: it failed, hung, or saved nothing."""


def require_script(path: str | os.PathLike = SCRIPT) -> Path:
    """The script's path, once it is written and answered.

    Raises:
        NotImplementedError: the file is missing (its cell was not run) or still holds the
            ``raise NotImplementedError()`` of the released lab.
    """
    path = Path(path)
    if not path.is_file():
        raise NotImplementedError(f"{path} does not exist: run the exercise's %%writefile cell above (it writes "
                                  "the script next to this notebook), then this test cell again")
    if "NotImplementedError" in path.read_text():
        raise NotImplementedError(f"exercise `{path.name}` is not answered yet: write the script in its cell above, "
                                  "delete the `raise NotImplementedError()` line, run that cell, then this one")
    return path


def _command(path: Path, seed: int, epochs: int, world_size: int, out: Path) -> list[str]:
    return [sys.executable, str(path.resolve()), "--seed", str(seed), "--epochs", str(epochs),
            "--world-size", str(world_size), "--out", str(out)]


def _env(world_size: int) -> dict[str, str]:
    env = dict(os.environ)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // world_size)))  # as torchrun: ranks share the cores
    return env


def _explain(proc: subprocess.Popen, output: str, out: Path, timeout: float, timed_out: bool) -> str:
    tail = "\n".join(output.strip().splitlines()[-25:])
    if timed_out:
        why = (f"did not finish within {timeout:g} s and was stopped with all its processes. A rank that waits in a "
               "collective the others never reach hangs for ever; so does a rank that joined another job's "
               "process group on the same port")
    elif proc.returncode:
        why = f"exited with code {proc.returncode}"
        if any(s in output for s in _PORT_TAKEN):
            why += (": the port it listens on was taken (another job on this machine). Each job needs a meeting "
                    "place that no other job can take: see the init_method of init_process_group")
        elif _NATIVE.search(output):
            why += (": a rank was killed by a signal, twice in a row (its native code crashed; the last lines "
                    "below say which rank and which signal)")
        elif "ProcessRaisedException" in output:
            why += ": a rank raised (its traceback is below)"
    else:
        why = f"exited normally, but rank 0 saved nothing at {out} (the --out argument)"
    return f"`python {' '.join(proc.args[1:])}` {why}.\n--- the script's output (last lines) ---\n{tail}"


def run_scripts(path: str | os.PathLike, seeds: Sequence[int], *, epochs: int = 2, world_size: int = 2,
                timeout: float = 120) -> list[dict[str, Any]]:
    """Start one job per seed at the same moment and wait for all of them.

    A job whose rank died of a signal in native code (gloo's C++ aborting at teardown, say: no Python
    traceback, nothing the script did wrong) is run once more on its own before it counts as failed.

    Args:
        path: the script.
        seeds: one job each (jobs share the machine, as two users' jobs would).
        epochs, world_size: passed as ``--epochs`` and ``--world-size``.
        timeout: seconds for all the jobs together; a job still running then is killed whole.

    Returns:
        Per seed, what rank 0 saved: ``{"params": {name: tensor}, "world_size": int}``.

    Raises:
        ScriptError: a job that failed, hung or saved nothing (the message says which, and why).
    """
    path = require_script(path)
    with tempfile.TemporaryDirectory(prefix="gpulab-spawn-") as tmp:
        jobs = _run_jobs(path, seeds, Path(tmp), "", epochs, world_size, timeout)
        for i, (seed, job) in enumerate(zip(seeds, jobs)):
            if _native_crash(job):
                jobs[i] = _run_jobs(path, [seed], Path(tmp), "again-", epochs, world_size, timeout)[0]
        results = []
        for proc, output, out, late in jobs:
            if late or proc.returncode or not out.is_file():
                raise ScriptError(_explain(proc, output, out, timeout, late))
            saved = torch.load(out, weights_only=True)
            if not isinstance(saved, dict) or not isinstance(saved.get("params"), dict):
                raise ScriptError(f"rank 0 saved {type(saved).__name__}, not a dict with a 'params' entry holding "
                                  "{name: tensor} (model.module.state_dict() or named_parameters())")
            results.append({"params": {k: v.detach().cpu() for k, v in saved["params"].items()},
                            "world_size": int(saved.get("world_size", -1))})
        return results


def _run_jobs(path: Path, seeds: Sequence[int], tmp: Path, prefix: str, epochs: int, world_size: int,
              timeout: float) -> list[tuple[subprocess.Popen, str, Path, bool]]:
    """Start the jobs together; per job ``(process, its output, the --out path, timed out?)``."""
    outs = [tmp / f"{prefix}result-{i}.pt" for i in range(len(seeds))]
    logs = [open(tmp / f"{prefix}log-{i}.txt", "w+") for i in range(len(seeds))]
    procs = [subprocess.Popen(_command(path, s, epochs, world_size, out), cwd=path.resolve().parent,
                              env=_env(world_size), stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)  # its own group: killed whole
             for s, out, log in zip(seeds, outs, logs)]
    deadline = time.monotonic() + timeout
    jobs = []
    for proc, out, log in zip(procs, outs, logs):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            late = False
        except subprocess.TimeoutExpired:
            late = True
        finally:
            _kill_group(proc)  # spawned ranks left behind by a parent that failed
        log.seek(0)
        jobs.append((proc, log.read(), out, late))
        log.close()
    return jobs


def _native_crash(job: tuple[subprocess.Popen, str, Path, bool]) -> bool:
    """A rank killed by SIGABRT or SIGSEGV (whatever its peers then raised: a peer's death makes them fail)."""
    proc, output, _, late = job
    return not late and bool(proc.returncode) and bool(_NATIVE.search(output))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_script(path: str | os.PathLike, seed: int, *, epochs: int = 2, world_size: int = 2,
               timeout: float = 120) -> dict[str, Any]:
    """:func:`run_scripts` for one job."""
    return run_scripts(path, [seed], epochs=epochs, world_size=world_size, timeout=timeout)[0]
