"""``python -m gpulab.autograde``: what ``make grade`` runs (docs/instructor.md, "Grade")."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    s = argparse.ArgumentParser(prog="python -m gpulab.autograde", description="autograde every submission, sandboxed")
    s.add_argument("--course", default="notebooks", help="the nbgrader course root")
    s.add_argument("--lab", default=None, help="one lab only, e.g. 00_setup")
    s.add_argument("--jobs", type=int, default=None, help="parallel autogrades (default: number of cores)")
    s.add_argument("--wall-timeout", type=float, default=900.0,
                   help="seconds for the whole autograde of one submission (default 900)")
    s.add_argument("--cell-timeout", type=int, default=None,
                   help="seconds per cell (default: c.Execute.timeout of nbgrader_config.py)")
    s.add_argument("--memory-mb", type=int, default=None,
                   help="memory cap per kernel in MiB, 0 for none (default: 4096, less if jobs x 4 GiB "
                        "exceeds 80%% of RAM)")
    s.add_argument("--memory-rlimit", choices=("data", "as"), default="data",
                   help="RLIMIT_DATA (what code allocates, default) or RLIMIT_AS (address space)")
    s.add_argument("--no-confine-writes", action="store_true",
                   help="let notebooks write outside their folder (not recommended)")
    s.add_argument("--no-confine-reads", action="store_true",
                   help="let notebooks read the course folder: solutions, hidden tests (not recommended)")
    s.add_argument("--pids-max", type=int, default=1024,
                   help="processes and threads one submission may hold at once (default 1024)")
    s.add_argument("--allow-weaker-sandbox", action="store_true",
                   help="grade even where an OS protection (namespaces, cgroups, kernel uid, Landlock) "
                        "is missing; each row of grades.csv names what was off")
    s.add_argument("--keep-sandboxes", action="store_true", help="keep each submission's grading copy")
    s.add_argument("--ray-address", default=None,
                   help="grade each submission as a task on this Ray cluster (head:6379), each node in its "
                        "own sandbox (default: worker threads on this machine)")
    s.add_argument("--fresh", action="store_true",
                   help="grade everything again, even after a run that was stopped (by default such a run's "
                        "finished, unchanged submissions are kept)")
    s.add_argument("--seed", type=int, default=None,
                   help="the hidden tests' inputs (default: fresh for every run; grades.csv's run printed it)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    return s


def _grade(args: argparse.Namespace) -> int:
    from gpulab.autograde.limits import Limits
    from gpulab.autograde.plan import default_jobs, default_memory_mb
    from gpulab.autograde.record import print_table
    from gpulab.autograde.run import grade
    from gpulab.confine import isolation

    jobs = args.jobs if args.jobs is not None else default_jobs()
    try:
        limits = Limits(wall_s=args.wall_timeout, cell_timeout_s=args.cell_timeout,
                        memory_mb=default_memory_mb(jobs) if args.memory_mb is None else args.memory_mb,
                        memory_rlimit=args.memory_rlimit, confine_writes=not args.no_confine_writes,
                        confine_reads=not args.no_confine_reads, pids_max=args.pids_max,
                        allow_weaker=args.allow_weaker_sandbox)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plan = isolation.detect(limits.confine_writes, limits.confine_reads)
    writes, reads = ("on" if on else "OFF (flag)" for on in (limits.confine_writes, limits.confine_reads))
    cell = f"{limits.cell_timeout_s} s" if limits.cell_timeout_s else "nbgrader_config.py's"
    where = f"on the Ray cluster at {args.ray_address}" if args.ray_address else f"with {jobs} worker(s)"
    print(f"grading {where}: wall clock {limits.wall_s:g} s, cell timeout {cell}, "
          f"memory {limits.memory_mb or 'unlimited'} MiB per process (RLIMIT_{limits.memory_rlimit.upper()}) and "
          f"{limits.cgroup_memory_mb() or 'unlimited'} MiB per submission, {limits.pids_max} tasks, private /tmp "
          f"{limits.tmp_mb} MiB and /dev/shm {limits.shm_mb} MiB; writes confined: {writes}, course unreadable: "
          f"{reads}; verdicts decided by the grader against a reference run, references masked")
    print("protections:")
    for layer in plan.layers:
        print(f"  {'on ' if layer.on else 'OFF'}  {layer.name}: {layer.how}")
    print("verdicts:\n"
          "  by construction: the grader compares each value the student's code produced, on this run's inputs, with "
          "the reference run's, in its own process; a measured check's cost (modelled device time, the OS's counters) is "
          "measured by the grader, outside the kernel, on results it checks\n"
          "  only detected (a note): pasted references or classmates' answers, evidence sent by hand, code that "
          "patches gpulab's instruments (their in-kernel figures are only evidence)\n"
          "  left to you: written answers, and the notes in grades.csv (docs/instructor.md, \"Threat model\")")
    if plan.off():
        print(("grading anyway (--allow-weaker-sandbox): grades.csv notes what was off" if limits.allow_weaker
               else "refusing to grade without them"), file=sys.stderr)
    t0 = time.perf_counter()
    try:
        rows = grade(args.course, args.lab, jobs=jobs, limits=limits, progress=not args.quiet,
                     keep_sandboxes=args.keep_sandboxes, plan=plan, ray_address=args.ray_address, fresh=args.fresh,
                     seed=args.seed)
    except (ValueError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_table(rows, time.perf_counter() - t0)
    from gpulab.accounts.private import settle

    settle(args.course)  # a hub's closed course: what grading wrote is the instructors', not root's or anyone's
    print(f"wrote {Path(args.course) / 'grades.csv'}; nbgrader's log of each submission is in "
          f"{Path(args.course) / 'grading_logs'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return _grade(args)


if __name__ == "__main__":
    sys.exit(main())
