"""gpulab.i18n.messages: a check's what= and hint= come out in the student's language, from the
lab's checks catalogue; what was measured stays as it is."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from gpulab.grading import GradingError, check_equal
from gpulab.i18n import catalog, messages, templates
from gpulab.verdict import check as judge

CELL = '''from gpulab import grading
grading.check_equal(f(2), 4, what="f(2), the square", hint="multiply, do not add")
grading.check(f(3) == 9, "f(3)", "look at the sign")
grading.check_close(f(x), x * x, what=f"f({x}) against {x} squared", hint="multiply, do not add")
%timeit f(2)
'''


@pytest.fixture
def korean(tmp_path, monkeypatch):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL, id="t")])
    path = tmp_path / "lab.ipynb"
    nbformat.write(nb, str(path))
    po = tmp_path / "ko" / f"lab{messages.SUFFIX}.po"
    catalog.update(path, po, "ko", items=messages.cells)
    cat = catalog.read(po, "ko")
    ko = {"f(2), the square": "f(2), 제곱", "multiply, do not add": "더하지 말고 곱하세요", "f(3)": "f(3)",
          "f({0}) against {1} squared": "{1}의 제곱과 f({0}) 비교"}
    for m in catalog.entries(cat).values():
        m.string = ko.get(m.id, "")
    catalog.write(po, cat)
    monkeypatch.setattr(messages, "CATALOGUES", tmp_path)
    messages.table.cache_clear()
    messages.verdicts.cache_clear()  # no judge catalogue here: the judge's own words stay English
    yield path
    messages.table.cache_clear()
    messages.verdicts.cache_clear()


def test_extraction_takes_plain_strings_once_and_f_strings_as_templates(korean):
    found = messages.cells(korean)
    assert [(c.id, c.text) for c in found] == [
        ("t:0", "f(2), the square"), ("t:1", "multiply, do not add"), ("t:2", "f(3)"), ("t:3", "look at the sign"),
        ("t:f0", "f({0}) against {1} squared")]
    assert found[-1].flags == {"python-brace-format"} and "{0} = x; {1} = x" in found[-1].note
    assert all(not c.flags for c in found[:-1])


def test_an_f_string_message_is_translated_with_the_values_it_had(korean):
    spec = {"kind": "close", "what": "f(1.5) against 1.5 squared", "hint": "multiply, do not add"}
    assert messages.localize(spec, "ko")["what"] == "1.5의 제곱과 f(1.5) 비교", "the values move where Korean puts them"
    spec["what"] = "g(1.5) against 1.5 squared"
    assert messages.localize(spec, "ko")["what"] == spec["what"], "a text the template does not fit stays English"


def test_the_graders_message_is_translated_and_the_measurement_is_not(korean):
    spec = {"kind": "equal", "what": "f(2), the square", "hint": "multiply, do not add"}
    english = judge.verdict(spec, 5, 4)
    korean_msg = judge.verdict(messages.localize(spec, "ko"), 5, 4)
    assert english == "f(2), the square: expected 4, got 5\n  Hint: multiply, do not add"
    assert korean_msg == "f(2), 제곱: expected 4, got 5\n  힌트: 더하지 말고 곱하세요"
    assert messages.localize({"kind": "true", "what": "f(3)", "hint": "look at the sign"}, "ko")["hint"] == \
        "look at the sign", "an untranslated text stays English"
    assert messages.localize(spec, None) is spec and messages.localize(spec, "xx") is spec


def test_the_students_kernel_uses_gpulab_lang(korean, monkeypatch):
    monkeypatch.setenv("GPULAB_LANG", "ko")
    with pytest.raises(GradingError, match="힌트: 더하지 말고 곱하세요"):
        check_equal(5, 4, what="f(2), the square", hint="multiply, do not add")
    monkeypatch.delenv("GPULAB_LANG")
    with pytest.raises(GradingError, match="Hint: multiply, do not add"):
        check_equal(5, 4, what="f(2), the square", hint="multiply, do not add")


def test_a_fuzzy_or_broken_catalogue_leaves_english(korean, tmp_path):
    po = tmp_path / "ko" / f"lab{messages.SUFFIX}.po"
    cat = catalog.read(po, "ko")
    for m in catalog.entries(cat).values():
        m.flags.add(catalog.FUZZY)
    catalog.write(po, cat)
    messages.table.cache_clear()
    assert not messages.table("ko")
    assert messages.localize({"what": "f(3)", "hint": "look at the sign"}, "ko")["what"] == "f(3)"
    Path(po).write_text("not gettext at all\n", encoding="utf-8")
    messages.table.cache_clear()
    assert not messages.table("ko")


def test_the_judges_own_words_come_in_korean_from_the_kits_catalogue():
    """Every kind of failed check, judged for a Korean submission with the repository's
    notebooks/i18n/ko/gpulab.judge.po: the judge's words are Korean, the values are the ones measured,
    and the English verdict is unchanged."""
    import numpy as np

    messages.verdicts.cache_clear()
    vector = judge.Tensor("float32", (3,), "cpu", np.array([1.0, 2.0, 3.0], dtype=np.float32))
    other = judge.Tensor("float32", (3,), "cpu", np.array([1.0, 2.5, 3.0], dtype=np.float32))
    square = judge.Tensor("float32", (2, 2), "cpu", np.zeros((2, 2), dtype=np.float32))
    cases = [({"kind": "equal"}, [1, 5], [1, 4]), ({"kind": "equal"}, {"a": 1}, {"a": "1"}),
             ({"kind": "close"}, other, vector), ({"kind": "close"}, 1.5, 1.0), ({"kind": "close"}, [vector], [square]),
             ({"kind": "close"}, "x", vector), ({"kind": "shape"}, vector, (2, 2)), ({"kind": "true"}, False, None),
             ({"kind": "between", "lo": 0.5}, 0.25, None), ({"kind": "between", "hi": 0.5}, 0.75, None),
             ({"kind": "raises", "types": ["ValueError"]}, None, None)]
    english_words = re.compile(r"\b(expected|got|but|needs|below|above|values|shape|raised)\b")
    for spec, actual, expected in cases:
        spec = dict(spec, what="W", hint="H")
        english = judge.verdict(spec, actual, expected)
        korean = judge.verdict(dict(spec, lang="ko"), actual, expected)
        assert english and korean and english != korean, (spec, english)
        detail = korean.split("\n")[0].removeprefix("W: ")
        assert not english_words.search(detail), f"{spec['kind']}: English left in {korean!r}"
        numbers = sorted(re.findall(r"\d+(?:\.\d+)?", english.split("\n")[0]))
        assert sorted(re.findall(r"\d+(?:\.\d+)?", korean.split("\n")[0])) == numbers, (english, korean)
    assert judge.verdict({"kind": "equal", "what": "W"}, 5, 4) == "W: expected 4, got 5"


def test_the_judge_catalogue_is_the_table_of_verdict_texts():
    """gpulab.judge.po is read from verdict_texts.TEXTS, one entry per id in its order, and the repository's
    Korean catalogue has a current translation of each; a verdict written with the wrong number of values
    names the template's values."""
    from gpulab.i18n import verdict_texts

    cells = messages.judge_cells()
    assert [(c.id, c.text) for c in cells] == [(k, t.template) for k, t in verdict_texts.TEXTS.items()]
    assert all((templates.FLAG in c.flags) == bool(verdict_texts.TEXTS[c.id].values) for c in cells)
    po = catalog.entries(catalog.read(messages.judge_path(messages.CATALOGUES.parent, "ko"), "ko"))
    assert {k: m.id for k, m in po.items()} == {k: t.template for k, t in verdict_texts.TEXTS.items()}
    assert all(m.string.strip() and catalog.FUZZY not in m.flags for m in po.values())
    assert verdict_texts.text("close.unequal", "4", "5", "") == "expected 4, got 5"
    with pytest.raises(ValueError, match="takes 3 value"):
        verdict_texts.text("close.unequal", "4", "5")
