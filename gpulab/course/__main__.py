"""``python -m gpulab.course <release|copy-work|check|grade|feedback|collect>``: what the make
targets run (see docs/instructor.md)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.course")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("release", "copy-work", "check", "grade", "feedback", "collect"):
        s = sub.add_parser(name)
        s.add_argument("--course", default="notebooks", help="the nbgrader course root")
        s.add_argument("--work", default="work", help="the student's work folder")
        s.add_argument("--lab", default=None, help="one lab only, e.g. 00_setup")
        if name == "grade":
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
        if name == "collect":
            s.add_argument("--archive", required=True, help="the LMS download (zip)")
            s.add_argument("--regexp", default=None, help="file-name pattern with (?P<student_id>) and (?P<file_id>)")
    return p


def grade_main(argv: list[str]) -> int:
    return main(["grade", *argv])


def _grade(args: argparse.Namespace) -> int:
    from gpulab.confine import isolation
    from gpulab.course.grade import default_jobs, default_memory_mb, grade, print_table
    from gpulab.course.sandbox import Limits

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
          "the reference run's, in its own process; speed-ups are timed by the grader on results it checks\n"
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
    print(f"wrote {Path(args.course) / 'grades.csv'}; nbgrader's log of each submission is in "
          f"{Path(args.course) / 'grading_logs'}")
    return 0


def _feedback(args: argparse.Namespace) -> int:
    from gpulab.course.feedback import feedback

    status = 0
    for lab, r in feedback(args.course, args.lab).items():
        print(f"feedback {lab}: {r['pages']} page(s) in {Path(args.course) / 'feedback'}, "
              f"{r['notes']} note page(s) for ungraded submissions" + (f"; {r['error']}" if r["error"] else ""))
        for student, why in r["failed"].items():
            print(f"  {student}: no notebook page ({why}); a page with this note was written instead", file=sys.stderr)
        if r["leaks"]:
            print(f"  {len(r['leaks'])} page(s) showed hidden tests and were WITHHELD (replaced by a note asking the "
                  "student to ask you); check HideHiddenTests is in c.GenerateFeedback.preprocessors "
                  "(docs/instructor.md)", file=sys.stderr)
            for page, lines in r["leaks"].items():
                print(f"    {page}: {lines[0]!r}", file=sys.stderr)
        if r["error"] and not r["pages"]:
            status = 1
    return status


def _collect(args: argparse.Namespace) -> int:
    from gpulab.course.collect import collect

    if not args.lab:
        print("error: say which lab the download is for: make collect LAB=00_setup ARCHIVE=...", file=sys.stderr)
        return 2
    try:
        report = collect(args.course, args.lab, args.archive, args.regexp)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from gpulab.course.students import alias, plain, shown

    print(f"collected {len(report.students)} submission(s) of {args.lab} into "
          f"{Path(args.course) / 'submitted'}: {', '.join(map(shown, report.students)) or 'none'}")
    odd = [s for s in report.students if not plain(s)]
    if odd:
        print(f"{len(odd)} student id(s) are not plain names (letters, digits and ._@+- only, not starting with - or "
              "=): make grade grades them under an alias and grades.csv escapes them; rename them in your LMS "
              "export if you can:", file=sys.stderr)
        for s in odd:
            print(f"  {shown(s)} -> graded as {alias(s)}", file=sys.stderr)
    if report.skipped:
        print(f"skipped {len(report.skipped)} file(s) whose name did not match the pattern:")
        for f in report.skipped:
            print(f"  {f}")
    return 0 if report.students else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "release":
        from gpulab.course.release import release

        release(args.course, args.lab)
    elif args.cmd == "copy-work":
        from gpulab.course.release import copy_work

        copy_work(args.course, args.work)
    elif args.cmd == "check":
        from gpulab.course.release import check_work

        return check_work(args.work, args.lab)
    elif args.cmd == "grade":
        return _grade(args)
    elif args.cmd == "feedback":
        return _feedback(args)
    elif args.cmd == "collect":
        return _collect(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
