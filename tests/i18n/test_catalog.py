"""gpulab.i18n.catalog and checks: a catalogue follows its notebook; what changed is flagged, never lost."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from gpulab.i18n import catalog, checks

TERMS = {"gradient": "그래디언트", "all-reduce": "all-reduce"}


def _nb(path: Path, *texts: str, code: str = "x = 1") -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(t, id=f"m{i}") for i, t in enumerate(texts)]
    nb.cells.insert(1, nbformat.v4.new_code_cell(code, id="code"))
    nbformat.write(nb, str(path))
    return path


def _translate(po: Path, strings: dict[str, str]) -> None:
    cat = catalog.read(po, "ko")
    for cid, m in catalog.entries(cat).items():
        if cid in strings:
            m.string = strings[cid]
            m.flags.discard(catalog.FUZZY)
    catalog.write(po, cat)


def _kinds(nb: Path, po: Path) -> list[tuple[str, str]]:
    return [(p.cell, p.kind) for p in checks.check_lab(nb, po, "ko", TERMS)]


def test_a_new_catalogue_has_one_empty_entry_per_markdown_cell(tmp_path):
    nb = _nb(tmp_path / "lab.ipynb", "# Title", "Average the `grad` of every rank.", "   ")
    po = tmp_path / "ko" / "lab.po"
    changes = catalog.update(nb, po, "ko")
    assert changes.added == ["m0", "m1"] and not changes.changed and not changes.removed  # the blank cell is skipped
    assert {cid: m.id for cid, m in catalog.entries(catalog.read(po, "ko")).items()} == \
        {"m0": "# Title", "m1": "Average the `grad` of every rank."}
    assert _kinds(nb, po) == [("m0", "missing"), ("m1", "missing")]


def test_changed_english_keeps_the_translation_flagged_fuzzy_with_the_old_english(tmp_path):
    nb = _nb(tmp_path / "lab.ipynb", "# Title", "Sum the gradient over 2 ranks.")
    po = tmp_path / "lab.po"
    catalog.update(nb, po, "ko")
    _translate(po, {"m0": "# 제목", "m1": "2개 랭크의 그래디언트를 더합니다."})
    assert _kinds(nb, po) == []
    _nb(nb, "# Title", "Average the gradient over 2 ranks.")  # the English changes
    assert _kinds(nb, po) == [("m1", "stale")], "an edit not yet merged is stale"
    changes = catalog.update(nb, po, "ko")
    assert changes.changed == ["m1"]
    m = catalog.entries(catalog.read(po, "ko"))["m1"]
    assert catalog.FUZZY in m.flags and m.string == "2개 랭크의 그래디언트를 더합니다."
    assert m.previous_id[0] == "Sum the gradient over 2 ranks."
    _nb(nb, "# Title", "Average the gradient over 4 ranks.")  # changed again before anyone revised it
    catalog.update(nb, po, "ko")
    m = catalog.entries(catalog.read(po, "ko"))["m1"]
    assert m.previous_id[0] == "Sum the gradient over 2 ranks.", "the English the translation was made from stays"
    assert '#| msgid "Sum the gradient over 2 ranks."' in po.read_text(encoding="utf-8"), "as msgmerge writes it"
    assert _kinds(nb, po) == [("m1", "stale"), ("m1", "kept as is")]  # fuzzy, and 4 is not in the old text
    _translate(po, {"m1": "4개 랭크의 그래디언트를 평균합니다."})
    assert _kinds(nb, po) == []
    assert "Sum the gradient" not in po.read_text(encoding="utf-8"), "a revised entry keeps no old English"


def test_the_old_english_of_a_long_cell_survives_exactly(tmp_path):
    """Babel rewraps its own "#|" comments and loses spaces: a long multi-line cell must come back whole."""
    long = ("A line longer than seventy-six characters, with `code`, \"quotes\" and a backslash \\ in it,\n"
            "then a second line   with  odd  spacing and a tab\there.\n\n- a list item")
    nb = _nb(tmp_path / "lab.ipynb", long)
    po = tmp_path / "lab.po"
    catalog.update(nb, po, "ko")
    _translate(po, {"m0": "번역"})
    _nb(nb, long + " More.")
    catalog.update(nb, po, "ko")
    m = catalog.entries(catalog.read(po, "ko"))["m0"]
    assert m.previous_id[0] == long and m.string == "번역" and catalog.FUZZY in m.flags


def test_a_removed_cell_is_orphaned_until_the_update_drops_it(tmp_path):
    nb = _nb(tmp_path / "lab.ipynb", "# Title", "Gone soon.")
    po = tmp_path / "lab.po"
    catalog.update(nb, po, "ko")
    _translate(po, {"m0": "# 제목", "m1": "곧 사라집니다."})
    _nb(nb, "# Title")
    assert _kinds(nb, po) == [("m1", "orphaned")]
    assert catalog.update(nb, po, "ko").removed == ["m1"]
    assert _kinds(nb, po) == []


@pytest.mark.parametrize(("english", "korean", "lost"), [
    ("Call `dist.all_reduce(t)` once.", "한 번 호출합니다.", "code/math span"),
    ("The bubble is $(S-1)/(M+S-1)$.", "버블은 (S-1)/(M+S-1)입니다.", "code/math span"),
    ("It takes 512 MiB.", "수백 MiB가 필요합니다.", "the number 512"),
    ("See [the docs](https://pytorch.org/docs).", "[문서](https://pytorch.org)를 보세요.", "the link"),
    ("<details><summary>Hint</summary>\nx\n</details>", "힌트: x", "<details>"),
    ("Average the gradients.", "기울기를 평균합니다.", "'gradient' must be translated as '그래디언트'"),
])
def test_what_must_stay_as_it_is(tmp_path, english, korean, lost):
    nb = _nb(tmp_path / "lab.ipynb", english)
    po = tmp_path / "lab.po"
    catalog.update(nb, po, "ko")
    _translate(po, {"m0": korean})
    found = checks.check_lab(nb, po, "ko", TERMS)
    assert found and all(p.kind in ("kept as is", "glossary") for p in found), found
    assert any(lost in p.detail for p in found), found


def test_a_bold_bare_address_must_be_kept_but_not_the_bold_around_it():
    assert checks.kept("Open **https://ui.perfetto.dev**: drop the trace.", "**https://ui.perfetto.dev**에서 여세요.") == []
    assert checks.kept("Open **https://ui.perfetto.dev**: drop the trace.", "Perfetto에서 여세요.") == \
        ["the link 'https://ui.perfetto.dev'"]


def test_a_terms_spelling_variants_count_and_a_call_of_the_same_name_does_not():
    terms = {"mixed precision": "혼합 정밀도", "bubble": "버블"}
    assert checks.term_misses("Train in mixed-precision.", "그냥 학습합니다.", terms) == \
        ["'mixed precision' must be translated as '혼합 정밀도' (docs/i18n glossary)"]
    assert checks.term_misses("Two bubbles.", "버블 두 개.", terms) == []
    assert checks.term_misses("bubble(2, 1): the naive split", "단순 분할", terms) == []  # a function's name
    assert checks.term_misses("move it to devices[1] or device=x", "devices[1] 또는 device=x로", {"device": "장치"}) == []
    assert checks.term_misses("move it to the device", "devices[1]로", {"device": "장치"})  # prose still counts
    assert checks.term_misses("Successive halving", "successive halving", {"successive halving": "Successive Halving"}) == []


def test_numbers_glued_to_korean_and_terms_inside_code_pass(tmp_path):
    nb = _nb(tmp_path / "lab.ipynb", "A 3x speed-up on 2 cores; `gradient` is a name here.")
    po = tmp_path / "lab.po"
    catalog.update(nb, po, "ko")
    _translate(po, {"m0": "코어 2개에서 3배 빨라집니다. 여기서 `gradient`는 이름입니다."})
    assert checks.check_lab(nb, po, "ko", TERMS) == []


def test_a_corrupt_catalogue_names_the_fix(tmp_path):
    nb = _nb(tmp_path / "lab.ipynb", "# Title")
    po = tmp_path / "lab.po"
    po.write_text('msgctxt "m0"\nmsgid "# Title"\nmsgstr "x"\nthis is not gettext\n', encoding="utf-8")
    with pytest.raises(ValueError, match="git checkout"):
        checks.check_lab(nb, po, "ko", TERMS)
    assert po.read_text(encoding="utf-8").startswith('msgctxt "m0"'), "the broken file is left for the translator"


def test_the_glossary_is_read_from_its_table(tmp_path):
    md = tmp_path / "g.md"
    md.write_text("| English | 한국어 | note |\n| --- | --- | --- |\n| data parallelism | 데이터 병렬 | x |\n", encoding="utf-8")
    assert checks.glossary(md) == {"data parallelism": "데이터 병렬"}
