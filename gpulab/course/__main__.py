"""``python -m gpulab.course <release|copy-work|check|grade|feedback>``: what the make targets run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulab.course.nbgrader_cli import find_labs, nbgrader


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gpulab.course")
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("release", "copy-work", "check", "grade", "feedback"):
        s = sub.add_parser(name)
        s.add_argument("--course", default="notebooks", help="the nbgrader course root")
        s.add_argument("--work", default="work", help="the student's work folder")
        s.add_argument("--lab", default=None, help="one lab only, e.g. 00_setup")
        if name == "grade":
            s.add_argument("--jobs", type=int, default=None, help="parallel graders (default: number of cores)")
    return p


def grade_main(argv: list[str]) -> int:
    return main(["grade", *argv])


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
        from gpulab.course.grade import grade, print_table

        rows = grade(args.course, args.lab)
        print_table(rows)
        print(f"wrote {Path(args.course) / 'grades.csv'}")
    elif args.cmd == "feedback":
        labs = [args.lab] if args.lab else find_labs(args.course)
        for lab in labs:
            proc = nbgrader(args.course, "generate_feedback", lab, "--force")
            print(f"feedback {lab}: {'ok' if proc.returncode == 0 else 'FAILED'}")
            if proc.returncode != 0:
                print(proc.stderr[-2000:], file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
