"""Translate a lab's catalogue without a PO editor: export it to JSON, fill in ``"ko"``, import it.

    .venv/bin/python tools/po_json.py export 03_hdf5 --lang ko > /tmp/03.json
    .venv/bin/python tools/po_json.py import 03_hdf5 --lang ko /tmp/03.json
    .venv/bin/python tools/po_json.py export 03_hdf5 --checks > /tmp/03c.json   # the graders' texts
    .venv/bin/python tools/po_json.py export 03_hdf5 --output > /tmp/03o.json   # what the demo cells print
    .venv/bin/python tools/po_json.py export gpulab --judge > /tmp/judge.json   # the judge's verdicts

A template (an f-string, a printed line) has ``{0}``, ``{1}``... where its values go; ``note`` says
what each one is. Keep every one, in the order Korean needs.

Each JSON entry: ``id`` (the cell id), ``note``, ``en`` (the English now), ``was`` (the English the
current translation was made from, when it changed since: the entry is fuzzy), ``ko``. Import sets
each entry's translation to its ``"ko"`` and clears the fuzzy flag (you revised it); an entry not in
the file, or whose ``"en"`` is not the catalogue's English any more, is left alone and reported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.i18n import catalog, messages, output  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("export", "import"))
    parser.add_argument("lab")
    parser.add_argument("json", nargs="?", type=Path)
    parser.add_argument("--lang", default="ko")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument("--checks", action="store_true", help="the lab's checks catalogue (what=/hint= texts)")
    kind.add_argument("--output", action="store_true", help="the lab's printed-output catalogue (demo cells' print)")
    kind.add_argument("--judge", action="store_true", help="the kit's verdicts catalogue (give gpulab as the lab)")
    args = parser.parse_intermixed_args()  # the JSON file may come after --lang
    where = (messages.checks_path if args.checks else output.output_path if args.output
             else messages.judge_path if args.judge else catalog.catalogue_path)
    po = where(REPO / "notebooks", args.lang, args.lab)
    if not po.exists():
        raise SystemExit(f"no catalogue {po}: make i18n-update LANG={args.lang} LAB={args.lab} starts one")
    cat = catalog.read(po, args.lang)
    if args.command == "export":
        rows = [{"id": m.context, "note": " ".join(m.auto_comments), "en": m.id,
                 **({"was": m.previous_id[0]} if catalog.FUZZY in m.flags and m.previous_id else {}), "ko": m.string}
                for m in cat if m.id and m.context]
        json.dump(rows, sys.stdout, ensure_ascii=False, indent=1)
        print()
        return 0
    rows = json.loads(args.json.read_text(encoding="utf-8"))
    by_id = catalog.entries(cat)
    skipped = []
    for row in rows:
        m = by_id.get(row["id"])
        if m is None or m.id != row["en"]:
            skipped.append(row["id"])
            continue
        m.string = row["ko"]
        m.flags.discard(catalog.FUZZY)
        m.previous_id = ()
    catalog.write(po, cat)
    print(f"{po.relative_to(REPO)}: {len(rows) - len(skipped)} entries set" +
          (f"; left alone (gone, or its English changed: export again): {', '.join(skipped)}" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
