"""Grading a whole class of lab-00 submissions: good, partly right, broken in every way the grader
must survive, the attacks of issue 15's red-team (the OS), of the verdicts issue (every layer of
the kernel rewritten, evidence forged, objects that lie, masked references called or pasted) and
of the pipeline issue (disks and files filled, the environment read, a clone of the course hunted,
the hidden tests leaked through IPython's history, the audit trail erased, ids a tool misreads),
graded in parallel; then the gradebook, ``nbgrader export``, feedback without hidden tests, the
wall-clock limit, and zip collection. Two small classes beside it (issue 48,
tests/grading_timed_class.py): lab 01's honest copy graded beside a classmate that spins every core,
and an honest lab 06 that must get no note.

The class is graded once (module fixture, 2 workers, a 20 s cell timeout so that the infinite
loops cost seconds, not minutes), with a canary in the grader's environment and a world-readable
clone of the course elsewhere on the machine; the tests then read what it produced.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import sqlite3
import stat
import zipfile
from dataclasses import replace
from pathlib import Path

import nbformat
import psutil
import pytest
from grading_class import (
    FULL_SCORE,
    LAB,
    MAX_SCORE,
    TO_DEVICE,
    TRIAGE,
    Case,
    attack_cases,
    cases,
    evidence_cases,
    make_course,
    pipeline_cases,
    student_notebook,
    submit_class,
)

from gpulab.autograde import gradebook
from gpulab.autograde.box import integrity
from gpulab.autograde.limits import Limits
from gpulab.autograde.nbgrader import nbgrader
from gpulab.autograde.run import grade
from gpulab.confine import isolation
from gpulab.confine.jail import landlock_abi
from gpulab.course import feedback as fb
from gpulab.course.collect import collect

pytestmark = [pytest.mark.notebook]
CLASS_LIMITS = Limits(wall_s=300, cell_timeout_s=20, memory_mb=1536, interrupt_grace_s=5, pids_max=256,
                      tmp_mb=256, shm_mb=256, disk_mb=128, files_max=5000)
PLAN = isolation.detect()
ISOLATED = not PLAN.off()
TAG = str(100000 + os.getpid() % 100000)  # what the attacks leave carries it: a file name, `sleep <TAG>`
CANARY = f"gpulab-canary-{TAG}-do-not-show"   # in the grader's environment: no student may see it
HONEST = ("good_ana", "good_ben", "good_cho", "partial", "hidden_fail")


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): a hash of a regular file, else its kind."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
            elif not stat.S_ISDIR(st.st_mode):
                out[str(path.relative_to(root))] = stat.filemode(st.st_mode)
    return out


@pytest.fixture(scope="module")
def terminal():
    """A terminal held by the grader: grading runs with it as its standard input (as `make grade` in
    a shell does), and its path is given to the TIOCSTI attack."""
    master, slave = os.openpty()
    saved = os.dup(0)
    os.dup2(slave, 0)
    try:
        yield master, slave, os.ttyname(slave)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, master, slave):
            os.close(fd)


def _clone_parent() -> Path:
    """Where a second, world-readable clone of the course is put for the hunt: /opt if the grader
    may write there, else its home."""
    for parent in (Path("/opt"), Path.home()):
        if os.access(parent, os.W_OK):
            return parent / f"gpulab-clone-{TAG}"
    pytest.skip("nowhere to put a second clone")


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory, terminal):
    course = make_course(tmp_path_factory.mktemp("class"))
    clone = _clone_parent()
    fixture = {**cases(course), **attack_cases(course, terminal[2], TAG), **evidence_cases(),
               **pipeline_cases(str(clone.parent))}
    submit_class(course, fixture)
    shutil.copytree(course / "source", clone / "notebooks" / "source")  # another clone, readable by anyone
    for path in [clone, *clone.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    before = {name: tree(course / name) for name in ("source", "release", "submitted")}
    before["config"] = hashlib.sha256((course / "nbgrader_config.py").read_bytes()).hexdigest()
    limits = CLASS_LIMITS if ISOLATED else replace(CLASS_LIMITS, allow_weaker=True)
    os.environ["GPULAB_TEST_CANARY"] = CANARY
    try:
        rows = grade(course, LAB, jobs=2, limits=limits, progress=False, plan=PLAN)
        yield course, fixture, {r.student: r for r in rows}, before
    finally:  # a grader without a private /dev/shm and /tmp keeps what the filler wrote (up to 2 GiB of memory)
        os.environ.pop("GPULAB_TEST_CANARY", None)
        shutil.rmtree(clone, ignore_errors=True)
        for folder in ("/dev/shm", "/tmp"):
            Path(f"{folder}/gpulab-fill-{TAG}").unlink(missing_ok=True)


@pytest.mark.timeout(900)
def test_every_student_gets_the_expected_score_and_note(graded) -> None:
    course, fixture, rows, _ = graded
    assert len(fixture) >= 12 and set(rows) == set(fixture)
    # without the OS layers (a grader with no cgroup delegation) an OS attack may also cost its own
    # marks (a fork bomb with no pids.max runs into the cell time limit): at most, not exactly
    wrong = {s: (rows[s].score, case.score, rows[s].notes) for s, case in fixture.items()
             if rows[s].score != case.score and (ISOLATED and s != "fork_bomb" or s not in ATTACKS
                                                 or rows[s].score > case.score)}
    assert not wrong, f"student: (got, expected, notes) {wrong}"
    for student, case in fixture.items():
        assert rows[student].max_score == MAX_SCORE
        if case.note and (ISOLATED or student not in ATTACKS):
            assert re.search(case.note, rows[student].notes), f"{student}: {rows[student].notes!r}"
    for student in HONEST:  # only the machine's own note: no false note, no copy among honest students
        assert rows[student].notes == PLAN.note(), f"{student} has a note it should not: {rows[student].notes}"
    peeker = course / "autograded" / "peeker" / LAB
    assert not (peeker / "copied.ipynb").exists(), "a stray notebook was kept beside the lab's own"
    if landlock_abi():  # Landlock stops what bypasses Python's file API (a shell's cat); the audit hook alone does not
        cell = next(c for c in nbformat.read(peeker / f"{LAB}.ipynb", as_version=4).cells
                    if c.metadata.get("nbgrader", {}).get("grade_id") == "choose_backend_impl")
        shown = json.dumps(cell.get("outputs", []))
        assert "refused: PermissionError" in shown and "BEGIN HIDDEN TESTS" not in shown, shown[:500]
    from gpulab.accounts.students import from_csv

    with open(course / "grades.csv", newline="") as fh:
        table = {from_csv(r["student"]): r for r in csv.DictReader(fh)}  # '=SUM(1+1) is escaped there
    assert set(table) == set(fixture)
    assert all(float(table[s]["score"]) == rows[s].score for s in fixture)


ATTACKS = ("fork_bomb", "shm_filler", "sparse", "flood", "detached", "tiocsti", "snoop")


def test_attacks_earn_nothing_and_leave_classmates_and_the_course_alone(graded) -> None:
    course, fixture, rows, before = graded
    attacks = [s for s in fixture if s.startswith(("tamper_", "relinker", "planted", "killer", "leaker", *ATTACKS))]
    attacks += list(evidence_cases()) + [s for s in pipeline_cases("/") if s not in HONEST]
    assert len(attacks) >= 40
    for student in attacks:  # each scored at most what the same notebook scores without the attack
        assert rows[student].score <= fixture[student].score, (student, rows[student].notes)
        if fixture[student].note:  # noted wherever the grader can see the attack
            assert rows[student].notes, f"{student} got no note"
    for name in ("source", "release", "submitted"):
        assert tree(course / name) == before[name], f"grading changed the course's {name}/"
    assert hashlib.sha256((course / "nbgrader_config.py").read_bytes()).hexdigest() == before["config"]
    db = sqlite3.connect(course / "gradebook.db")
    assert db.execute("pragma integrity_check").fetchone() == ("ok",)
    db.close()
    assert list((course / "gradebook_backups").glob("gradebook-*.db")), "no backup of the gradebook before merging"
    for path in (course / "autograded").rglob("*"):  # nothing planted came back, links least of all
        assert path.is_dir() and not path.is_symlink() or path.suffix == ".ipynb" and stat.S_ISREG(path.lstat().st_mode), path
    assert sorted(p.name for p in (course / "autograded" / "relinker" / LAB).iterdir()) == [f"{LAB}.ipynb"]


def test_the_verdict_is_the_graders_whatever_the_kernel_claims(graded) -> None:
    """A kernel that reports every cell as a success, hides its errors or decides in its own
    interpreter still gets the grader's verdict in every test cell: a GradingError first, no value
    shown as an Out[] (which nbgrader would read as a score)."""
    course, fixture, rows, _ = graded
    for student in ("forge_replies", "tamper_success_patch", "tamper_displayhook", "silence_checks", "lying_objects"):
        nb = nbformat.read(str(course / "autograded" / student / LAB / f"{LAB}.ipynb"), as_version=4)
        tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade") and c.cell_type == "code"]
        assert len(tests) == 4 and all(c.outputs and c.outputs[0].output_type == "error"
                                       and c.outputs[0].ename == "GradingError" for c in tests), student
        assert not any(o.output_type == "execute_result" for c in tests for o in c.outputs), student
    assert rows["paste_reference"].score == FULL_SCORE  # pasting works, and only a human can judge it


def test_honest_answers_are_right_and_nobody_elses(graded) -> None:
    """The honest students' own code (four ways to write each long exercise) is right by the
    references, and the similarity check finds none of them a copy."""
    import dataclasses
    import itertools
    import random

    import torch

    from gpulab.devices.doctor import Facts, GpuInfo
    from gpulab.evidence import codec as evidence
    from gpulab.grading import lab00

    gpu = GpuInfo(0, "L4", 1, "8.9")
    for source in TRIAGE:
        ns: dict = {}
        exec(source, ns)
        for b, d, n in itertools.product((None, "11.8", "12.8", "13.0"), (None, "11.4", "12.4", "12.10"), (0, 2)):
            f = Facts(torch_cuda_build=b, driver_cuda_version=d, nvml="ok", gpus=[gpu] * n, cuda_visible_devices="")
            assert ns["triage"](dataclasses.asdict(f)) == lab00.doctor_says(f)
    meta = torch.device("meta")
    for source in TO_DEVICE:
        ns = {"torch": torch}
        exec(source, ns)
        for i in range(5):
            batch = lab00.random_batch(random.Random(i))
            assert evidence.encode(ns["to_device"](batch, meta)) == \
                evidence.encode(lab00.tree_map(lambda t: t.to(meta), batch))


def test_no_kernel_saw_the_graders_environment_or_another_clone(graded) -> None:
    course, fixture, rows, _ = graded
    seen = [p for p in (course / "autograded").rglob("*.ipynb") if CANARY in p.read_text(errors="replace")]
    seen += [p for p in (course / "grading_logs").rglob("*") if p.is_file() and CANARY in p.read_text(errors="replace")]
    assert not seen and CANARY not in (course / "grades.csv").read_text(), seen
    env = _cell_text(course, "env_snoop")
    assert "GPULAB_SEED" in env and "GPULAB_TEST_CANARY" not in env  # it did print the environment it had
    hunt = _cell_text(course, "clone_hunter")
    if ISOLATED:
        assert "no clone found" in hunt and "LEAK" not in hunt, hunt[:500]
    assert rows["audit_eraser"].score == FULL_SCORE


def test_odd_student_ids_are_graded_and_escaped(graded) -> None:
    course, fixture, rows, _ = graded
    for student in ("-rf", "=SUM(1+1)", "star*", "new\nline"):
        assert rows[student].score == FULL_SCORE, (student, rows[student].notes)
    with open(course / "grades.csv", newline="") as fh:
        ids = [r["student"] for r in csv.DictReader(fh)]
    assert "'=SUM(1+1)" in ids and "'-rf" in ids and "=SUM(1+1)" not in ids


def test_the_gradebook_stays_nbgraders_source_of_truth(graded) -> None:
    from nbgrader.api import Gradebook

    course, fixture, rows, _ = graded
    from gpulab.accounts.students import alias

    rows = {alias(s): r for s, r in rows.items()}  # nbgrader knows an odd id by its alias
    with Gradebook(gradebook.db_url(course), course_id="gpulab") as gb:
        subs = {s.student.id: s for s in gb.assignment_submissions(LAB)}
        assert set(subs) == {alias(s) for s in fixture}
        for student, sub in subs.items():
            assert float(sub.score) == rows[student].score, student
            for nb in sub.notebooks:
                assert all(g.auto_score is not None for g in nb.grades), f"{student}: a cell was left ungraded"
    assert (course / "autograded" / "good_ana" / LAB / f"{LAB}.ipynb").exists()
    assert not (course / "autograded" / "not_json" / LAB).exists()
    proc = nbgrader(course, "export", "--to", str(course / "export.csv"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    with open(course / "export.csv") as fh:
        exported = {r["student_id"]: float(r["raw_score"]) for r in csv.DictReader(fh) if r["assignment"] == LAB}
    assert exported == {s: r.score for s, r in rows.items()}


def test_restored_tests_ran_in_the_autograded_notebooks(graded) -> None:
    course = graded[0]
    nb = nbformat.read(str(course / "autograded" / "deleted_tests" / LAB / f"{LAB}.ipynb"), as_version=4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    at = ids.index("placement_for_machines")
    assert ids[at - 1] == "backend_for_machines", "the restored test cell goes after the cell before it in the source"
    # the student deleted the exercise too: the restored test names it (require) instead of a NameError
    assert any(o.output_type == "error" and "NotImplementedError: exercise `place_ranks` is not answered" in o.evalue
               for o in nb.cells[at].outputs), [o.get("evalue") for o in nb.cells[at].outputs]
    edited = nbformat.read(str(course / "autograded" / "edited_test" / LAB / f"{LAB}.ipynb"), as_version=4)
    cell = next(c for c in edited.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "backend_for_machines")
    assert "trust me" not in cell.source and "BEGIN HIDDEN TESTS" in cell.source


def test_writes_outside_the_folder_never_reach_the_course(graded) -> None:
    course = graded[0]
    if not landlock_abi():
        pytest.skip("no Landlock on this kernel: only Python-level writes are refused")
    from grading_class import REPO
    assert not (course / "ESCAPED.txt").exists(), "the audit hook / Landlock let a Python write through"
    assert not Path(REPO, "ESCAPED.txt").exists(), "the audit hook / Landlock let a write into the checkout through"
    assert not (course / "ESCAPED_SHELL.txt").exists(), "Landlock let a shell write through"


def test_no_grading_process_outlives_the_run(graded) -> None:
    leftovers = []
    for p in psutil.process_iter():
        try:
            box = p.environ().get("GPULAB_SANDBOX", "")
            # a finished run's grading copies are gone; a live one (another run on this machine) has its own
            if "gpulab-grade-" in box and not Path(box).exists():
                leftovers.append((p.pid, p.name()))
        except psutil.Error:
            continue
    assert not leftovers, f"processes from the grading sandboxes still run: {leftovers}"
    # ... nor any process that dropped the marker: by their cgroup (named after this grader's pid), and
    # the sleeps the detached attack started with the marker dropped
    mine = f"gpulab-grade-{os.getpid()}-"
    for p in psutil.process_iter(["pid", "name", "cmdline"]):
        try:
            in_group = mine in Path(f"/proc/{p.pid}/cgroup").read_text()
        except OSError:
            continue
        assert not in_group and p.info["cmdline"] != ["sleep", TAG], (p.info, "outlived its submission")
    groups = [g for g in Path("/sys/fs/cgroup").glob(f"*/{mine}*")] + \
        [g for g in Path("/sys/fs/cgroup").glob(f"*/**/{mine}*") if g.is_dir()]
    assert not groups, f"cgroups left behind: {groups}"


def _cell_text(course: Path, student: str, grade_id: str = "to_device_impl") -> str:
    nb = nbformat.read(str(course / "autograded" / student / LAB / f"{LAB}.ipynb"), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    # the printed text as one string (a kernel under load sends one print in several stream
    # messages: CI saw "/tmp" and " full after 512 MiB" apart), then every output as JSON
    printed = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    return printed + "\n" + json.dumps(cell.get("outputs", []))


def _apparent(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.mark.skipif(not ISOLATED, reason=f"this machine lacks OS protections: {PLAN.note()}")
def test_resource_and_escape_attacks_are_contained(graded, terminal) -> None:
    course, fixture, rows, _ = graded
    for student in ATTACKS:  # each also scores what its notebook scores without the attack (8/10), and is noted
        # (a fork bomb that takes every task its cgroup allows leaves its own kernel no thread to send its
        # values with: it may lose its own marks, never a classmate's)
        assert (rows[student].score == FULL_SCORE or student == "fork_bomb") and \
            re.search(fixture[student].note, rows[student].notes), (student, rows[student].notes)
    assert "forked" in _cell_text(course, "fork_bomb")
    # /dev/shm and /tmp were the submission's own, capped, and went with it
    shown = _cell_text(course, "shm_filler")
    assert "/dev/shm full after 256 MiB" in shown and "/tmp full after" in shown, shown[:400]
    assert not Path(f"/dev/shm/gpulab-fill-{TAG}").exists() and not Path(f"/tmp/gpulab-fill-{TAG}").exists()
    # sparse files: nothing near 3 GiB came back
    assert _apparent(course / "autograded" / "sparse") < 2**20 * 5
    assert sorted(p.name for p in (course / "autograded" / "sparse" / LAB).iterdir()) == [f"{LAB}.ipynb"]
    # the output flood: kept small, and nbgrader's memory stayed near an honest submission's
    def peak(student: str) -> int:
        log = (course / "grading_logs" / LAB / f"{student}.log").read_text()
        return int(re.search(r"gpulab: nbgrader peak memory (\d+) MiB", log).group(1))
    assert (course / "autograded" / "flood" / LAB / f"{LAB}.ipynb").stat().st_size < 4 * 2**20
    assert peak("flood") < peak("good_ana") + 150, (peak("flood"), peak("good_ana"))
    # TIOCSTI: nothing was typed into the grader's terminal, and nothing the kernel reached was a terminal
    master, slave, _ = terminal
    for fd in (master, slave):
        os.set_blocking(fd, False)
        with pytest.raises(BlockingIOError):
            os.read(fd, 100)
    assert "typed into nothing" in _cell_text(course, "tiocsti") and not Path("/tmp/TIOCSTI_RAN").exists()
    # reading classmates' grading copies, their kernels' connection files, .git, the source checkout
    shown = _cell_text(course, "snoop")
    assert "LEAK" not in shown and shown.count("refused") >= 10, shown[:600]


@pytest.mark.timeout(600)
def test_feedback_never_shows_hidden_tests(graded) -> None:
    """Issue 48 item 4: every page is built from the submission, the released test cells and the grader's
    verdicts. The history attacks (``In`` printed plainly, base64, one character before each line,
    base85(zlib)) printed every hidden line in the graded run; none reaches a page, the students' own
    cells and outputs do, and so do the grader's words and the gradebook's scores."""
    from gpulab.accounts.students import alias
    from gpulab.course import feedback_page as page

    course, fixture, rows, _ = graded
    report = fb.feedback(course, LAB)[LAB]
    assert report["error"] is None and report["leaks"] == {} and report["failed"] == {}, report
    specs = integrity.lab_spec(gradebook.db_url(course), LAB)
    lines = fb.hidden_lines(specs)
    assert len(lines) >= 10
    pages = sorted(course.glob(f"feedback/*/{LAB}/{LAB}.html"))
    assert {p.parts[-3] for p in pages} == {alias(s) for s in fixture}  # a page for everyone, a note page for the ungraded
    for path in pages:  # a hidden line the student wrote in their own submission is theirs (tamper_grader_patch)
        own = fb.submitted_lines(fb.submitted_folder(course, path.parts[-3], LAB))
        assert fb.leaks(path.read_text(), lines - own) == [], path

    def shown(student: str) -> str:
        return fb.html_text((course / "feedback" / alias(student) / LAB / f"{LAB}.html").read_text(), lines=True)

    def graded_cell(student: str, index: int) -> nbformat.NotebookNode:
        return nbformat.read(str(course / "autograded" / alias(student) / LAB / f"{LAB}.ipynb"), as_version=4).cells[index]

    for student in ("history_leaker", "history_prefix", "history_b85"):
        printed = "".join(o.get("text", "") for o in graded_cell(student, -1).outputs if o.get("output_type") == "stream")
        assert len(printed) > 500, f"{student}: the attack printed nothing in the graded run"
        text = shown(student)
        assert printed.strip()[:200] not in text and not [ln for ln in lines if ln in text], student
        assert fixture[student].extra_cells[0].splitlines()[-1] in text, f"{student}: its own cell is on the page"
    prefixed = "".join(o.get("text", "") for o in graded_cell("history_prefix", -1).outputs)
    assert sum(f"|{ln}" in {"|" + " ".join(x[1:].split()) for x in prefixed.splitlines()} for ln in lines) >= 10, \
        "the one-character prefix attack printed the hidden lines in the graded run"
    nb = nbformat.read(str(course / "autograded" / "hidden_fail" / LAB / f"{LAB}.ipynb"), as_version=4)
    failed = next(c for c in nb.cells if c.get("outputs") and c.outputs[0].get("ename") == "GradingError")
    message = failed.outputs[0].evalue
    assert "expected 'gloo', got 'nccl'" in message  # the grader's message, in the autograded notebook
    text = shown("hidden_fail")
    assert page.verdict_words(message, "GradingError") in text and "got 'nccl'" not in text
    score, max_score = gradebook.scores(course, LAB, "hidden_fail")
    assert f"Score: {round(score, 2)} / {round(max_score, 2)}" in " ".join(text.split())  # GetGrades, from the gradebook
    assert page.PASSED in text
    leaked = shown("leaker")
    assert "caller = inspect.currentframe().f_back" in leaked, "the leaker's own cells are on its page"
    assert "BEGIN HIDDEN TESTS" not in leaked
    assert "not valid JSON" in (course / "feedback" / "not_json" / LAB / f"{LAB}.html").read_text()
    assert "import itertools as it" in shown("own_itertools"), "a student's own line stays on the page"
    for student in ("nested_notebook", "-rf", "new\nline"):
        assert (course / "feedback" / alias(student) / LAB / f"{LAB}.html").exists(), student
    # The check can fail: the autograded notebook, rendered as it is, shows every hidden line.
    from nbconvert import HTMLExporter

    raw, _ = HTMLExporter().from_filename(str(course / "autograded" / "hidden_fail" / LAB / f"{LAB}.ipynb"))
    assert len(fb.leaks(raw, lines)) == len(lines)


@pytest.mark.timeout(300)
def test_wall_clock_limit_stops_a_submission_and_scores_zero(graded) -> None:
    course = graded[0]
    shutil.rmtree(course / "submitted")
    submit_class(course, {"slowpoke": Case()})
    rows = grade(course, LAB, jobs=1, limits=Limits(wall_s=3, cell_timeout_s=20, memory_mb=1536,
                                                              allow_weaker=not ISOLATED), progress=False)
    assert [(r.student, r.score) for r in rows] == [("slowpoke", 0.0)]
    assert "wall-clock limit" in rows[0].notes
    assert gradebook.scores(course, LAB, "slowpoke") == (0.0, MAX_SCORE)
    assert not (course / "autograded" / "slowpoke" / LAB).exists()


@pytest.mark.timeout(300)
def test_collect_imports_an_lms_zip(graded, tmp_path: Path) -> None:
    course = graded[0]
    good = nbformat.writes(student_notebook(course, Case()))
    archive = tmp_path / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("alice_00_setup.ipynb", good)
        z.writestr("bob/00_setup.ipynb", good)
        z.writestr("carol_smith_00_setup.ipynb", good)
        z.writestr("Untitled.ipynb", good)
        z.writestr("readme.txt", "not a submission")
    report = collect(course, LAB, archive)
    assert report.students == ["alice", "bob", "carol_smith"]
    assert any(s.endswith("Untitled.ipynb") for s in report.skipped)
    for student in report.students:
        nb = json.loads((course / "submitted" / student / LAB / f"{LAB}.ipynb").read_text())
        assert nb["cells"], student


@pytest.fixture(scope="module")
def side_classes(tmp_path_factory: pytest.TempPathFactory):
    """Issue 48's two small classes (tests/grading_timed_class.py), each graded once with the
    grader's own limits: lab 01 two at a time (the spinner beside an honest copy), lab 06 alone."""
    from grading_timed_class import NOTED_LAB, SPUN_LAB, noted_class, spinner_class

    limits = Limits(allow_weaker=not ISOLATED)
    spun = spinner_class(tmp_path_factory.mktemp("spun"))
    spun_rows = grade(spun, SPUN_LAB, jobs=2, limits=limits, progress=False, plan=PLAN)
    noted = noted_class(tmp_path_factory.mktemp("noted"))
    noted_rows = grade(noted, NOTED_LAB, jobs=1, limits=limits, progress=False, plan=PLAN)
    return spun, {r.student: r for r in spun_rows}, {r.student: r for r in noted_rows}


@pytest.mark.timeout(900)
def test_a_spinning_classmate_moves_no_score(side_classes) -> None:
    """The load-shaping spinner keeps a busy process on every core through its classmate's timed
    phases (and its own): both score the source's full marks, and the spinner did spin."""
    from grading_timed_class import SPUN_HONEST, SPUN_LAB, SPUN_SPINNER, autograded_points

    course, rows, _ = side_classes
    full = autograded_points(SPUN_LAB)
    got = {s: (rows[s].score, rows[s].notes) for s in (SPUN_HONEST, SPUN_SPINNER)}
    assert all(score == full for score, _ in got.values()), f"(score, notes) beside a spinner, full marks {full}: {got}"
    nb = nbformat.read(str(course / "autograded" / SPUN_SPINNER / SPUN_LAB / f"{SPUN_LAB}.ipynb"), as_version=4)
    printed = "".join(o.get("text", "") for o in nb.cells[1].get("outputs", []) if o.get("output_type") == "stream")
    assert "spinning" in printed, f"the spinner's cell did not start its processes: {printed!r}"
    assert not re.search(r"signal|outlived|process", rows[SPUN_HONEST].notes), rows[SPUN_HONEST].notes


@pytest.mark.timeout(900)
def test_an_honest_lab06_gets_no_note(side_classes) -> None:
    """Issue 48 item 5: the launcher's watchdog and the DataLoader workers are the kit's own; an
    honest lab 06 (the source answers) scores full marks and grades.csv carries no note for it."""
    from grading_timed_class import NOTED_HONEST, NOTED_LAB, autograded_points

    _, _, rows = side_classes
    row = rows[NOTED_HONEST]
    assert row.score == autograded_points(NOTED_LAB), (row.score, row.notes)
    # the source answers are the course's solution, so the similarity notes are right here; what must
    # not appear is a note about the kit's own processes (the watchdog's killpg, the loader's workers)
    kept = [n for n in row.notes.split("; ") if n and n != PLAN.note() and "wait for manual grading" not in n
            and not re.fullmatch(r"cell \w+ is 100% the same as the course's solution \(.*\)", n)]
    assert not kept, f"an honest lab 06 got a note: {kept!r}"
