"""``python -m gpulab.i18n {update,check,build} --lang ko`` (``make i18n-update``, ``make
i18n-check``, and the first step of ``make release LANG=ko`` / ``make lab LANG=ko``).

Each lab has up to three catalogues: ``<lab>.po`` (its markdown), ``<lab>.checks.po`` (its checks'
``what=``/``hint=`` texts, shown by the graders) and ``<lab>.output.po`` (what its demo cells print).
A lab without one is left in English. One more, ``gpulab.judge.po``, holds the judge's verdicts
(``expected {0}, got {1}``) that every check's message is made of."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpulab.i18n import LANGUAGES, build, catalog, checks, messages, output

REPO = Path(__file__).resolve().parents[2]
KINDS = ((catalog.catalogue_path, catalog.cells), (messages.checks_path, messages.cells),
         (output.output_path, output.cells))


def _notebooks(course: Path, lab: str | None) -> list[Path]:
    found = sorted((course / "source").glob("*.ipynb")) + sorted((course / "source").glob("*/*.ipynb"))
    if lab:
        found = [p for p in found if p.stem == lab or p.parent.name == lab]
        if not found:
            raise SystemExit(f"no lab {lab!r} in {course / 'source'}")
    return found


def _glossary(lang: str) -> Path:
    return REPO / "docs" / "i18n" / f"{lang}-glossary.md"


def _update(source: Path, po: Path, lang: str, items, course: Path) -> None:
    changes = catalog.update(source, po, lang, items=items)
    if changes:
        print(f"{po.relative_to(course)}: {len(changes.added)} new, {len(changes.changed)} changed "
              f"(flagged fuzzy), {len(changes.removed)} removed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.i18n", description=__doc__)
    parser.add_argument("command", choices=("update", "check", "build"))
    parser.add_argument("--lang", required=True, choices=sorted(LANGUAGES))
    parser.add_argument("--course", type=Path, default=REPO / "notebooks")
    parser.add_argument("--lab", help="one lab (update, check)")
    parser.add_argument("--new", action="store_true", help="update: also start catalogues for labs that have none")
    parser.add_argument("--out", type=Path, help="build: where the translated course root goes")
    args = parser.parse_args(argv)
    course = args.course.resolve()

    if args.command == "build":
        out = (args.out or REPO / "build" / "i18n" / args.lang).resolve()
        missing = build.build(course, args.lang, out)
        print(f"{LANGUAGES[args.lang].name} course root: {out}")
        if missing:
            print(f"not translated yet, left in English: {', '.join(missing)}")
        return 0

    if args.command == "update":
        for nb in _notebooks(course, args.lab):
            for where, items in KINDS:
                po = where(course, args.lang, nb.stem)
                if not po.exists() and (not (args.new or args.lab) or not items(nb)):
                    continue  # no catalogue asked for, or nothing to translate
                _update(nb, po, args.lang, items, course)
        if not args.lab:  # the kit's own texts: the judge's verdicts
            _update(messages.JUDGE, messages.judge_path(course, args.lang), args.lang, messages.judge_cells, course)
        print("translate the new entries and revise the fuzzy ones (their old English is in the #| lines), "
              "then make i18n-check")
        return 0

    terms = checks.glossary(_glossary(args.lang))
    problems, untranslated, done = [], [], 0
    for nb in _notebooks(course, args.lab):
        for where, items in KINDS:
            po = where(course, args.lang, nb.stem)
            if not po.exists():
                if items(nb):
                    untranslated.append(po.name.removesuffix(".po"))
                continue
            done += 1
            problems += checks.check_lab(nb, po, args.lang, terms, items=items)
    if not args.lab:
        po = messages.judge_path(course, args.lang)
        if po.exists():
            done += 1
            problems += checks.check_lab(messages.JUDGE, po, args.lang, terms, items=messages.judge_cells)
        else:
            untranslated.append(po.name.removesuffix(".po"))
    labs = {nb.stem for nb in _notebooks(course, None)} | {messages.KIT}
    stray = sorted(p.name for p in (course / "i18n" / args.lang).glob("*.po")
                   if p.name.removesuffix(".po").removesuffix(messages.SUFFIX).removesuffix(output.SUFFIX)
                   .removesuffix(messages.JUDGE_SUFFIX) not in labs)
    problems += [checks.Problem(s, "-", "orphaned", "a catalogue for a lab that does not exist") for s in stray]
    for p in problems:
        print(p)
    print(f"{LANGUAGES[args.lang].name}: {done} catalogue(s) checked, {len(problems)} problem(s)"
          + (f"; none yet (left in English): {', '.join(untranslated)}" if untranslated else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
