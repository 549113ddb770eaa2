"""Autograde a whole class in parallel, each submission sandboxed, and write ``grades.csv``; one bad
submission never stops the rest.

Per lab, a reference run of the source notebook gives the expected values (:mod:`gpulab.course.reference`).
Then ``jobs`` worker threads, each on CPUs of its own, grade one submission at a time through
:func:`gpulab.course.sandbox.grade_in_sandbox` (or Ray tasks, :mod:`gpulab.course.cluster`), and
this process merges each result into the real gradebook (:mod:`gpulab.course.gradebook`).
nbgrader has no parallel autograde of its own (jupyter/nbgrader#174).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import secrets as secrets_mod
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

import psutil
from tqdm.auto import tqdm

from gpulab.confine import isolation, jail
from gpulab.course import cluster, gradebook, integrity, mask, students
from gpulab.course.limits import measure_lock_file
from gpulab.course.mask import lab_references
from gpulab.course.nbgrader_cli import find_labs, nbgrader
from gpulab.course.reference import ReferenceError, run_reference
from gpulab.course.sandbox import LabRun, Limits, SandboxResult, grading_root
from gpulab.course.sandbox import grade_safely as _grade_safely
from gpulab.labs import LABS


@dataclass
class GradeRow:
    """One line of ``grades.csv``."""

    student: str
    lab: str
    score: float = 0.0
    max_score: float = 0.0
    notes: str = ""


def submissions(course: Path, lab: str | None = None) -> list[tuple[str, str]]:
    """(student, lab) pairs found under ``submitted/``, sorted."""
    root = Path(course) / "submitted"
    if not root.is_dir():
        return []
    pairs = []
    for student in sorted(p for p in root.iterdir() if p.is_dir()):
        for lab_dir in sorted(p for p in student.iterdir() if p.is_dir()):
            if lab is None or lab_dir.name == lab:
                pairs.append((student.name, lab_dir.name))
    return pairs


def scores_from_gradebook(course: Path, lab: str, student: str) -> tuple[float, float]:
    """(score, max_score) of one submission in the course gradebook."""
    return gradebook.scores(Path(course), lab, student)


def ensure_released(course: Path, labs: set[str]) -> None:
    """The gradebook must know a lab's test cells before it can grade it."""
    for lab in sorted(labs):
        if gradebook.max_score(course, lab) == 0.0:
            proc = nbgrader(course, "generate_assignment", lab, "--force")
            if proc.returncode != 0:
                raise RuntimeError(f"cannot register {lab} in the gradebook:\n{proc.stderr[-2000:]}")


def default_jobs() -> int:
    """One worker per core (each autograde is one busy kernel)."""
    return max(1, psutil.cpu_count(logical=True) or 1)


def default_memory_mb(jobs: int) -> int:
    """4 GiB per kernel, or less so that ``jobs`` kernels fit in 80 % of this machine's memory."""
    return int(min(4096, 0.8 * psutil.virtual_memory().total / 2**20 / max(jobs, 1)))


def write_csv(rows: list[GradeRow], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "lab", "score", "max_score", "notes"])
        for r in rows:  # ids and notes are the students' words: a spreadsheet must show them, not run them
            w.writerow([students.csv_cell(r.student), r.lab, f"{r.score:g}", f"{r.max_score:g}", students.csv_cell(r.notes)])


def _keep_log(course: Path, result: SandboxResult) -> None:
    """Keep nbgrader's output of each submission in ``<course>/grading_logs/<lab>/<student>.log``."""
    if result.log is not None and result.log.exists():
        dest = course / "grading_logs" / result.lab / f"{result.student}.log"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(result.log, dest)


def _record(course: Path, result: SandboxResult, max_bytes: int) -> GradeRow:
    row = GradeRow(result.student, result.lab)
    try:
        row.score, row.max_score = gradebook.merge(course, result, max_bytes)
    except Exception as err:  # one bad merge must not stop the class
        row.max_score = gradebook.max_score(course, result.lab)
        result.notes.append(f"could not record in the gradebook: {err}")
    row.notes = "; ".join(result.notes)
    try:
        _keep_log(course, result)
    except OSError as err:
        row.notes = "; ".join(filter(None, [row.notes, f"no grading log: {err}"]))
    return row


NOT_YET = "not graded: the grading run stopped before this submission; run make grade again"


def _write_progress(rows: list[GradeRow], pending: dict[tuple[str, str], None], path: Path) -> None:
    """grades.csv as it stands, with a row for each submission still waiting (a run may be killed)."""
    waiting = [GradeRow(s, lab_, notes=NOT_YET) for s, lab_ in pending]
    write_csv(sorted(rows + waiting, key=lambda r: (r.lab, r.student)), path)


class WeakSandboxError(ValueError):
    """An OS protection is missing and the instructor did not accept grading without it."""


def cpu_slots(jobs: int, cpus: list[int] | None = None) -> list[list[int]]:
    """One CPU set per parallel grader, ``len(cpus) // jobs`` CPUs each, disjoint while there are enough:
    a kernel and the reference run get as many CPUs, and a classmate graded meanwhile other ones."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    k = max(1, len(cpus) // jobs)
    return [[cpus[(i * k + j) % len(cpus)] for j in range(k)] for i in range(jobs)]


def _pool(slots: list[list[int]]) -> ThreadPoolExecutor:
    """Worker threads, each pinned to one of ``slots`` (what they start inherits the CPU set)."""
    counter = itertools.count()

    def pin() -> None:
        os.sched_setaffinity(0, slots[next(counter) % len(slots)])

    return ThreadPoolExecutor(max_workers=len(slots), initializer=pin)


def prepare_lab(course: Path, lab: str, root: Path, seed: int, secret: str, limits: Limits,
                plan: isolation.Plan) -> LabRun:
    """The lab's reference run and masks for this grading run (raises ReferenceError)."""
    lock = measure_lock_file()
    expected = run_reference(course, lab, root / "reference" / lab, seed, secret, limits.cell_timeout_s,
                             limits.threads, measure_lock=lock)
    binds = mask.write_masks(lab_references(lab), root / "masks" / lab) if plan.namespaces else []
    path = root / "reference" / lab / "expected.json"
    print(f"reference run of {lab}: {expected.seconds:.0f} s on {expected.cpus} CPU(s)", flush=True)
    return LabRun(lab, seed, path, binds, lock)


def fingerprint(folder: Path) -> str:
    """A hash of the regular files under a submission folder (names and bytes; links are not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            h.update(str(path.relative_to(folder)).encode() + b"\0")
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def _ledger(course: Path) -> Path:
    return course / "grading_logs" / "graded.jsonl"


def interrupted_rows(course: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], GradeRow]:
    """After a stopped run (rows that say :data:`NOT_YET`), the rows it finished for unchanged submissions."""
    path = course / "grades.csv"
    if not path.is_file() or not _ledger(course).is_file():
        return {}
    with open(path, newline="") as fh:
        old = {(students.from_csv(r["student"]), r["lab"]): r for r in csv.DictReader(fh)}
    if not any(r["notes"] == NOT_YET for r in old.values()):
        return {}  # the last run finished: grade everything again
    graded = {}
    for line in _ledger(course).read_text().splitlines():
        try:
            student, lab, digest = json.loads(line)
        except (ValueError, TypeError):
            continue
        graded[(student, lab)] = digest
    kept = {}
    for pair in pairs:
        row = old.get(pair)
        if row is not None and row["notes"] != NOT_YET and pair in graded \
                and graded[pair] == fingerprint(course / "submitted" / pair[0] / pair[1]):
            kept[pair] = GradeRow(pair[0], pair[1], float(row["score"]), float(row["max_score"]),
                                  students.from_csv(row["notes"]))
    return kept


def grade(course: str | Path, lab: str | None = None, jobs: int | None = None, limits: Limits | None = None,
          progress: bool = True, keep_sandboxes: bool = False, plan: isolation.Plan | None = None,
          ray_address: str | None = None, fresh: bool = False, seed: int | None = None) -> list[GradeRow]:
    """Autograde every submission (or one lab's) and write ``<course>/grades.csv``; returns its rows.

    Args:
        jobs: parallel autogrades (default: one per core), each on CPUs of its own. A lab marked
            ``timed_alone`` in :data:`gpulab.labs.LABS` is graded after the others, one at a time.
        limits: per-submission limits (default: :class:`Limits` with :func:`default_memory_mb`).
        plan: the OS isolation to use (default: :func:`isolation.detect`); a missing layer raises
            :class:`WeakSandboxError` unless ``limits.allow_weaker``.
        ray_address: grade on this Ray cluster instead (``jobs`` then only sizes the reference runs).
        fresh: grade everything, even what a stopped run finished (:func:`interrupted_rows`).
        seed: the hidden tests' inputs and the measured runs' seeds (default: fresh for every run;
            give the seed of an earlier run to grade on its inputs again).
    """
    course = Path(course).resolve()
    known = set(find_labs(course))
    if lab is not None and lab not in known:
        raise ValueError(f"no lab {lab!r} in {course / 'source'}; the labs are: {', '.join(sorted(known))}")
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: use at least 1 parallel grader")
    limits = limits or Limits(memory_mb=default_memory_mb(jobs))
    if limits.threads is None:
        limits = replace(limits, threads=max(1, default_jobs() // jobs))
    plan = plan or isolation.detect(limits.confine_writes, limits.confine_reads)
    if plan.off() and not limits.allow_weaker:
        raise WeakSandboxError(plan.refusal())
    weaker = plan.note()
    secrets = jail.repository_secrets(course) if limits.confine_reads else []
    pairs = submissions(course, lab)
    rows = [GradeRow(s, lab_, notes=f"no lab called {lab_!r}; the labs are {', '.join(sorted(known))}")
            for s, lab_ in pairs if lab_ not in known]
    pairs = [(s, lab_) for s, lab_ in pairs if lab_ in known]
    kept = {} if fresh else interrupted_rows(course, pairs)
    if kept:
        print(f"resuming a grading run that was stopped: {len(kept)} submission(s) it graded are kept, "
              f"{len(pairs) - len(kept)} to grade (FRESH=1 grades everything again)", flush=True)
        rows += list(kept.values())
        pairs = [p for p in pairs if p not in kept]
    else:
        _ledger(course).parent.mkdir(parents=True, exist_ok=True)
        _ledger(course).write_text("")
    ensure_released(course, {lab_ for _, lab_ in pairs})
    root = grading_root(plan.namespaces)
    cancel = threading.Event()
    template, specs = root / "template.db", {}
    pending = dict.fromkeys(pairs)
    max_bytes = limits.max_notebook_mb * 2**20
    if seed is None:
        seed, secret = secrets_mod.randbelow(2**31), secrets_mod.token_hex(16)  # fresh for every run
    else:
        secret = hashlib.sha256(f"gpulab-seed:{seed}".encode()).hexdigest()[:32]
    if pairs and progress:
        print(f"the hidden tests' inputs: seed {seed} (make grade SEED={seed} grades on them again)", flush=True)
    # labs whose checks time parallel work against serial work get the machine to themselves
    alone = {lab_.id for lab_ in LABS if lab_.timed_alone}
    try:
        if pairs:
            gradebook.backup(course)  # the gradebook as it was before this run, whatever happens next
            _write_progress(rows, pending, course / "grades.csv")
            gradebook.snapshot(course, template)
            template.chmod(0o600)
            specs = {lab_: integrity.lab_spec(f"sqlite:///{template}", lab_, course / "source" / lab_)
                     for lab_ in {lab_ for _, lab_ in pairs}}
        labs_here = sorted({lab_ for _, lab_ in pairs})
        runs: dict[str, LabRun] = {}
        refused: dict[str, str] = {}
        limits_alone = replace(limits, threads=default_jobs())
        for phase_labs, slots, lim in ((
                [x for x in labs_here if x not in alone], cpu_slots(jobs), limits),
                ([x for x in labs_here if x in alone], cpu_slots(1), limits_alone)):
            with _pool(slots) as pool:
                futures = {pool.submit(prepare_lab, course, x, root, seed, secret, lim, plan): x for x in phase_labs}
                for fut in as_completed(futures):
                    try:
                        runs[futures[fut]] = fut.result()
                    except (ReferenceError, mask.MaskError) as err:
                        refused[futures[fut]] = str(err)
        for lab_, why in refused.items():
            print(f"NOT GRADING {lab_}: {why}", flush=True)
        for s, lab_ in [p for p in pairs if p[1] in refused]:
            rows.append(GradeRow(s, lab_, max_score=gradebook.max_score(course, lab_),
                                 notes=f"not graded: {refused[lab_].splitlines()[0]} (see make grade's output)"))
            pending.pop((s, lab_), None)
        pairs = [p for p in pairs if p[1] not in refused]
        phases = [(cpu_slots(jobs), limits, [p for p in pairs if p[1] not in alone]),
                  (cpu_slots(1), limits_alone, [p for p in pairs if p[1] in alone])]
        ray = cluster.RayGrader(ray_address) if ray_address and pairs else None
        per_node: dict[str, int] = {}
        took: list[tuple[float, str, str]] = []
        t_start = time.monotonic()
        try:
            with tqdm(total=len(pairs), desc="autograding", unit="submission", disable=not progress) as bar:
                for slots, lim, phase in phases:
                    if not phase:
                        continue
                    if ray is not None:
                        results = _on_ray(ray, course, template, specs, runs, phase, lim, root)
                    else:
                        results = _in_threads(slots, course, template, specs, runs, phase, lim, root, cancel, plan,
                                              secrets)
                    for result in results:
                        if weaker and ray is None:
                            result.notes.append(weaker)
                        rows.append(_record(course, result, max_bytes))
                        with open(_ledger(course), "a") as ledger:
                            ledger.write(json.dumps([result.student, result.lab, fingerprint(
                                course / "submitted" / result.student / result.lab)]) + "\n")
                        pending.pop((result.student, result.lab), None)
                        _write_progress(rows, pending, course / "grades.csv")
                        if not keep_sandboxes:
                            shutil.rmtree(root / result.lab / students.alias(result.student), ignore_errors=True)
                        took.append((result.seconds, result.student, result.lab))
                        postfix = f"{students.shown(result.student)}: {result.status}"
                        if result.node:  # on a cluster: each node's throughput so far
                            per_node[result.node] = per_node.get(result.node, 0) + 1
                            minutes = max(time.monotonic() - t_start, 1.0) / 60
                            postfix += " | " + ", ".join(f"{n} {c / minutes:.1f}/min" for n, c in sorted(per_node.items()))
                        bar.set_postfix_str(postfix)
                        bar.update()
        finally:
            if ray is not None:
                ray.close()
        if progress and took:
            print("slowest: " + ", ".join(f"{students.shown(st)} ({lab_}) {sec:.0f} s"
                                          for sec, st, lab_ in sorted(took, reverse=True)[:3]), flush=True)
        if progress and per_node:
            print("graded per node: " + ", ".join(f"{n} {c}" for n, c in sorted(per_node.items())), flush=True)
    finally:
        if not keep_sandboxes:
            shutil.rmtree(root, ignore_errors=True)
    _note_copies(course, rows)
    rows.sort(key=lambda r: (r.lab, r.student))
    write_csv(rows, course / "grades.csv")
    return rows


def _in_threads(slots: list[list[int]], course: Path, template: Path, specs: dict, runs: dict[str, LabRun],
                phase: list[tuple[str, str]], limits: Limits, root: Path, cancel: threading.Event,
                plan: isolation.Plan, secrets: list[Path]) -> Iterator[SandboxResult]:
    """Grade ``phase`` here, in worker threads pinned to ``slots``; results as they finish."""
    with _pool(slots) as pool:
        futures = [pool.submit(_grade_safely, course, template, specs[lab_], lab_, s,
                               root / lab_ / students.alias(s), limits, cancel, plan, secrets, runs[lab_])
                   for s, lab_ in phase]
        try:
            for fut in as_completed(futures):
                yield fut.result()
        except (KeyboardInterrupt, GeneratorExit):
            cancel.set()  # each worker kills its nbgrader and kernel within half a second
            raise


def _on_ray(ray: cluster.RayGrader, course: Path, template: Path, specs: dict, runs: dict[str, LabRun],
            phase: list[tuple[str, str]], limits: Limits, root: Path) -> Iterator[SandboxResult]:
    """Grade ``phase`` on the cluster; results as they arrive, their files under ``root``."""
    shared = {lab_: ray.put(cluster.lab_bundle(course, template, specs[lab_], lab_, limits, runs[lab_]))
              for lab_ in sorted({lab_ for _, lab_ in phase})}
    jobs = [(shared[lab_], cluster.bundle(course, lab_, s, limits), cluster.task_options(lab_, limits, ray.gpus_per_node))
            for s, lab_ in phase]
    for s, lab_, answer in ray.run(jobs):
        yield cluster.unpack(answer, root / lab_ / students.alias(s))


def _note_copies(course: Path, rows: list[GradeRow]) -> None:
    """Note the answer cells found in a reference, the solution or a classmate's
    (:mod:`gpulab.course.similarity`); a failure here costs the notes, never the grades."""
    from gpulab.course import similarity

    by_lab: dict[str, list[GradeRow]] = {}
    for row in rows:
        by_lab.setdefault(row.lab, []).append(row)
    for lab_, lab_rows in by_lab.items():
        try:
            copies = similarity.lab_copies(course, lab_, [r.student for r in lab_rows], lab_references(lab_))
        except Exception as err:  # a missing or broken copydetect must not stop the class
            print(f"similarity check of {lab_} skipped: {type(err).__name__}: {err}", flush=True)
            continue
        for row in lab_rows:
            found = [n for n in similarity.notes(copies.get(row.student, [])) if n not in row.notes]
            if found:
                row.notes = "; ".join(filter(None, [row.notes, *found]))


def print_table(rows: list[GradeRow], seconds: float | None = None) -> None:
    """The summary table: student, lab, score, notes."""
    if not rows:
        print("no submissions found under notebooks/submitted/<student>/<lab>/")
        return
    w = max(len("student"), *(len(students.shown(r.student)) for r in rows))
    print(f"{'student':<{w}}  {'lab':<18} {'score':>11}  notes")
    for r in rows:
        print(f"{students.shown(r.student):<{w}}  {r.lab:<18} {r.score:>5g}/{r.max_score:<5g}  {r.notes}")
    full = sum(r.max_score > 0 and r.score == r.max_score for r in rows)
    noted = sum(bool(r.notes) for r in rows)
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    print(f"{len(rows)} submission(s) graded{took}: {full} full marks, {noted} with notes")
