"""The reference run: a lab's source notebook, once per grading run, in a kernel that never ran a
student's code, on this run's seed. Its checks send the expected side: the solution's own value of
every check (the same hidden test, run against the solution), and the literals of the visible
tests. The solution is held to those literals and to its rules: a source notebook that fails its
own tests stops the grading of its lab (:meth:`Expected.problems`).

The kernel runs in a child process with the thread count and CPU set of a student's kernel, so the
measured checks' reference figures are measured on the same share of the machine, and with what
the machine gives a student's kernel: the same environment (:func:`gpulab.autograde.box.run.sandbox_env`:
the allow-list, CUDA's, NCCL's and Triton's variables, the caches in its own folder) and the same
memory and file-size caps (the jail's, :func:`gpulab.autograde.box.prepare.memory_args`: none per
process on a GPU machine). It is not in the students' namespaces: it sees the whole machine, so a
submission's kernel is given the device files and CUDA folders it sees (:mod:`gpulab.confine.cuda_paths`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from gpulab.autograde.box.prepare import font_cache, memory_args
from gpulab.autograde.box.run import die_with_grader, sandbox_env
from gpulab.autograde.expected import Expected
from gpulab.autograde.limits import Limits


class ReferenceError(RuntimeError):
    """The reference run could not be made; the lab cannot be graded (the message says why)."""


def kernel_env(seed: int, threads: int | None, mode: str = "reference") -> dict[str, str]:
    """What a grading kernel's environment adds: the mode, the seed, the thread counts."""
    env = {"GPULAB_GRADING": mode, "GPULAB_SEED": str(seed), "MPLBACKEND": "agg", "PYTHONDONTWRITEBYTECODE": "1"}
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_reference(course: Path, lab: str, work: Path, seed: int, secret: str, cell_timeout: int | None = None,
                  threads: int | None = None, timeout_s: float = 1800, measure_lock: str = "",
                  limits: Limits | None = None) -> Expected:
    """Run the reference kernel of ``lab`` in ``work`` and return its expected values (ReferenceError
    when the run fails, or the source notebook fails its own tests). ``limits``: the students' (their
    memory caps and environment are the reference kernel's too)."""
    limits = limits or Limits(threads=threads)
    work.mkdir(parents=True, exist_ok=True)
    for d in ("home", "matplotlib", "ipython", "runtime", "cache", "jupyter"):
        (work / "tmp" / d).mkdir(parents=True, exist_ok=True)
    for f in font_cache():
        shutil.copy(f, work / "tmp" / "matplotlib")
    out = work / "expected.json"
    cmd = [sys.executable, "-m", "gpulab.autograde.reference", "--course", str(course), "--lab", lab, "--out", str(out),
           "--seed", str(seed), "--secret", secret, "--work", str(work / "run")]
    if cell_timeout:
        cmd += ["--cell-timeout", str(cell_timeout)]
    cmd += [f"--jail-arg={a}" for a in memory_args(limits)]
    env = {**sandbox_env(work, replace(limits, threads=threads)), **kernel_env(seed, threads)}
    env.pop("GPULAB_GRADING")  # the runner itself is not a kernel; it sets the mode for its kernel
    if threads:
        cmd += ["--threads", str(threads)]
    if measure_lock:
        cmd += ["--measure-lock", measure_lock]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, start_new_session=True,
                              preexec_fn=die_with_grader)
    except subprocess.TimeoutExpired:
        raise ReferenceError(f"the reference run of {lab} took more than {timeout_s:g} s") from None
    (work / "reference.log").write_text(proc.stdout + proc.stderr)
    kept = course / "grading_logs" / f"{lab}.reference.log"  # the grading copies go; the log stays for the instructor
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise ReferenceError(f"the reference run of {lab} failed (exit {proc.returncode}; whole log: {kept}):\n{tail}")
    expected = Expected.load(out)
    expected.seconds = time.perf_counter() - t0
    problems = expected.problems()
    if problems:
        raise ReferenceError(f"{lab}'s source notebook fails its own tests in the reference run, so no submission "
                             f"can be graded against it; fix notebooks/source/{lab}:\n  " + "\n  ".join(problems[:8]))
    expected.save(out)
    return expected


def _child(args: argparse.Namespace) -> int:
    import nbformat
    from traitlets.config import Config

    from gpulab.autograde.execute.kernel import JailedKernelManager
    from gpulab.autograde.execute.preprocessor import GpulabExecute
    from gpulab.autograde.nbgrader import find_labs

    course = Path(args.course).resolve()
    if args.lab not in find_labs(course):
        print(f"no lab {args.lab!r} in {course / 'source'}", file=sys.stderr)
        return 2
    run = Path(args.work)
    shutil.copytree(course / "source" / args.lab, run, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
                    dirs_exist_ok=True)
    os.environ.update(kernel_env(args.seed, args.threads))  # inherited by the kernel this process starts
    raw = run / "reference-evidence.json"
    cells: dict[str, dict] = {}
    for path in sorted(run.glob("*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        # a trusted notebook: no file rules, but the students' memory caps (the jail's rlimits)
        jailed = Config({"JailedKernelManager": {"jail_args": args.jail_arg}})
        ep = GpulabExecute(config=jailed, mode="reference", reference_out=str(raw), timing_secret=args.secret,
                           measure_lock=args.measure_lock,
                           timeout=args.cell_timeout, interrupt_on_timeout=True, allow_errors=True)
        ep.kernel_manager_class = JailedKernelManager
        ep.preprocess(nb, {"metadata": {"path": str(run)}, "unique_key": path.stem})
        cells[path.stem] = json.loads(raw.read_text()).get(path.stem, {})
    Expected(args.lab, args.seed, len(os.sched_getaffinity(0)), cells).save(Path(args.out))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.autograde.reference", description=__doc__.splitlines()[0])
    p.add_argument("--course", required=True)
    p.add_argument("--lab", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--work", required=True, help="a new folder to run the notebook in")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--secret", required=True)
    p.add_argument("--cell-timeout", type=int, default=300)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--measure-lock", default="", help="the machine's lock for measured runs")
    p.add_argument("--jail-arg", action="append", default=[], help="an argument of gpulab.confine.jail for the kernel")
    return _child(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
