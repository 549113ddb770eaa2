"""``python -m gpulab.course <release|copy-work|check|feedback|collect>``: what the course's make
targets run (see docs/instructor.md); ``make grade`` runs ``python -m gpulab.autograde``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.course")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("release", "copy-work", "check", "feedback", "collect"):
        s = sub.add_parser(name)
        s.add_argument("--course", default="notebooks", help="the nbgrader course root")
        s.add_argument("--work", default="work", help="the student's work folder")
        s.add_argument("--lab", default=None, help="one lab only, e.g. 00_setup")
        if name == "collect":
            s.add_argument("--archive", required=True, help="the LMS download (zip)")
            s.add_argument("--regexp", default=None, help="file-name pattern with (?P<student_id>) and (?P<file_id>)")
    return p


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
    from gpulab.accounts.students import alias, plain, shown

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
    elif args.cmd == "feedback":
        return _feedback(args)
    elif args.cmd == "collect":
        return _collect(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
