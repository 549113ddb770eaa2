"""gpulab.accounts.students: any id is graded under a name nbgrader cannot misread, and a spreadsheet
shows it instead of running it."""

from __future__ import annotations

from gpulab.accounts import students


def test_plain_ids_stay_and_the_rest_get_a_stable_alias() -> None:
    assert students.alias("ana.lee-2@uni") == "ana.lee-2@uni"
    for odd in ("-rf", "star*", "[abc]", "new\nline", "=SUM(1+1)", "..", "a/../b", "é"):
        a = students.alias(odd)
        assert students.plain(a) and a.startswith("student-") and a == students.alias(odd)
    assert students.alias("-rf") != students.alias("-rg")


def test_csv_cells_that_a_spreadsheet_would_run_are_escaped() -> None:
    for formula in ("=SUM(1+1)", "+1", "-rf", "@cmd", "\tx"):
        assert students.csv_cell(formula) == "'" + formula
    assert students.csv_cell("ana") == "ana" and students.shown("new\nline") == "'new\\nline'"
