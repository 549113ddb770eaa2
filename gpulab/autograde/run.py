"""``make grade``: autograde a whole class, each submission sandboxed, and write ``grades.csv``; one
bad submission never stops the rest. The stages, in the order they run, one module each:

1. :mod:`~gpulab.autograde.plan`: the submissions, what a stopped run finished, jobs and CPUs;
2. :mod:`~gpulab.autograde.reference`: each lab's source notebook run once on this run's seed, which
   gives the expected side, and the references masked for the students' kernels;
3. :mod:`~gpulab.autograde.box`: each submission's isolated copy of the course and its sandbox;
4. :mod:`~gpulab.autograde.execute`: nbgrader's autograde in it, the kernel jailed, each test cell
   judged from evidence (:mod:`gpulab.verdict`);
5. :mod:`~gpulab.autograde.collect`: what the run left, as notes and scores;
6. :mod:`~gpulab.autograde.record`: the gradebook, the copying notes, ``grades.csv``.

:mod:`~gpulab.autograde.runners` runs stages 3-5 for each submission, in pinned threads here or as
tasks on a Ray cluster. nbgrader has no parallel autograde of its own (jupyter/nbgrader#174).
"""

from __future__ import annotations

import hashlib
import secrets as secrets_mod
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from tqdm.auto import tqdm

from gpulab.accounts import students
from gpulab.autograde import gradebook
from gpulab.autograde import plan as planning
from gpulab.autograde.box import integrity, mask
from gpulab.autograde.box.prepare import grading_root
from gpulab.autograde.limits import LabRun, Limits, measure_lock_file
from gpulab.autograde.nbgrader import find_labs
from gpulab.autograde.record import GradeRow, note_copies, record, write_csv, write_progress
from gpulab.autograde.reference import ReferenceError, run_reference
from gpulab.autograde.runners import ray as cluster
from gpulab.autograde.runners.threads import each, grade_here
from gpulab.confine import isolation, jail
from gpulab.labs import LABS


class WeakSandboxError(ValueError):
    """An OS protection is missing and the instructor did not accept grading without it."""


@dataclass
class Run:
    """One grading run's state: what is left, what is done, and where its copies live."""

    course: Path
    limits: Limits
    plan: isolation.Plan
    jobs: int
    seed: int
    secret: str
    root: Path
    pairs: list[tuple[str, str]]
    rows: list[GradeRow] = field(default_factory=list)
    pending: dict[tuple[str, str], None] = field(default_factory=dict)
    specs: dict = field(default_factory=dict)
    runs: dict[str, LabRun] = field(default_factory=dict)
    took: list[tuple[float, str, str]] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)

    @property
    def template(self) -> Path:
        return self.root / "template.db"


def prepare_lab(course: Path, lab: str, root: Path, seed: int, secret: str, limits: Limits,
                plan: isolation.Plan) -> LabRun:
    """The lab's reference run and masks for this grading run (raises ReferenceError)."""
    lock = measure_lock_file()
    expected = run_reference(course, lab, root / "reference" / lab, seed, secret, limits.cell_timeout_s,
                             limits.threads, measure_lock=lock, limits=limits)
    binds = mask.write_masks(mask.lab_references(lab), root / "masks" / lab) if plan.namespaces else []
    print(f"reference run of {lab}: {expected.seconds:.0f} s on {expected.cpus} CPU(s)", flush=True)
    return LabRun(lab, seed, root / "reference" / lab / "expected.json", binds, lock)


def _seeds(seed: int | None) -> tuple[int, str]:
    if seed is None:
        return secrets_mod.randbelow(2**31), secrets_mod.token_hex(16)  # fresh for every run
    return seed, hashlib.sha256(f"gpulab-seed:{seed}".encode()).hexdigest()[:32]


def _start(course: Path, lab: str | None, jobs: int | None, limits: Limits | None, plan: isolation.Plan | None,
           fresh: bool, seed: int | None, progress: bool) -> Run:
    """Check the arguments, find the submissions and what a stopped run finished, draw the seed."""
    known = set(find_labs(course))
    if lab is not None and lab not in known:
        raise ValueError(f"no lab {lab!r} in {course / 'source'}; the labs are: {', '.join(sorted(known))}")
    jobs = planning.default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise ValueError(f"jobs={jobs}: use at least 1 parallel grader")
    limits = limits or Limits(memory_mb=planning.default_memory_mb(jobs))
    if limits.threads is None:
        limits = replace(limits, threads=max(1, planning.default_jobs() // jobs))
    plan = plan or isolation.detect(limits.confine_writes, limits.confine_reads)
    if plan.off() and not limits.allow_weaker:
        raise WeakSandboxError(plan.refusal())
    pairs = planning.submissions(course, lab)
    rows = [GradeRow(s, lab_, notes=f"no lab called {lab_!r}; the labs are {', '.join(sorted(known))}")
            for s, lab_ in pairs if lab_ not in known]
    pairs = [(s, lab_) for s, lab_ in pairs if lab_ in known]
    kept = {} if fresh else planning.interrupted_rows(course, pairs)
    if kept:
        print(f"resuming a grading run that was stopped: {len(kept)} submission(s) it graded are kept, "
              f"{len(pairs) - len(kept)} to grade (FRESH=1 grades everything again)", flush=True)
        rows += list(kept.values())
        pairs = [p for p in pairs if p not in kept]
    else:
        planning.start_ledger(course)
    planning.ensure_released(course, {lab_ for _, lab_ in pairs})
    seed_, secret = _seeds(seed)
    if pairs and progress:
        print(f"the hidden tests' inputs: seed {seed_} (make grade SEED={seed_} grades on them again)", flush=True)
    return Run(course, limits, plan, jobs, seed_, secret, grading_root(plan.namespaces), pairs, rows,
               dict.fromkeys(pairs))


def _references(run: Run, alone: set[str]) -> None:
    """Stage 2: every lab's reference run; a lab whose source fails its own tests is not graded."""
    if run.pairs:
        gradebook.backup(run.course)  # the gradebook as it was before this run, whatever happens next
        write_progress(run.rows, run.pending, run.course / "grades.csv")
        gradebook.snapshot(run.course, run.template)
        run.template.chmod(0o600)
        run.specs = {lab_: integrity.lab_spec(f"sqlite:///{run.template}", lab_, run.course / "source" / lab_)
                     for lab_ in {lab_ for _, lab_ in run.pairs}}
    labs = sorted({lab_ for _, lab_ in run.pairs})
    refused: dict[str, str] = {}
    for phase_labs, slots, lim in (([x for x in labs if x not in alone], planning.cpu_slots(run.jobs), run.limits),
                                   ([x for x in labs if x in alone], planning.cpu_slots(1), _alone(run.limits))):
        items = [(run.course, x, run.root, run.seed, run.secret, lim, run.plan) for x in phase_labs]
        for item, got in each(slots, prepare_lab, items):
            if isinstance(got, (ReferenceError, mask.MaskError)):
                refused[item[1]] = str(got)
            elif isinstance(got, Exception):
                raise got
            else:
                run.runs[item[1]] = got
    for lab_, why in refused.items():
        print(f"NOT GRADING {lab_}: {why}", flush=True)
    for s, lab_ in [p for p in run.pairs if p[1] in refused]:
        run.rows.append(GradeRow(s, lab_, max_score=gradebook.max_score(run.course, lab_),
                                 notes=f"not graded: {refused[lab_].splitlines()[0]} (see make grade's output)"))
        run.pending.pop((s, lab_), None)
    run.pairs = [p for p in run.pairs if p[1] not in refused]


def _alone(limits: Limits) -> Limits:
    return replace(limits, threads=planning.default_jobs())


def _finish(run: Run, result, weaker: str, on_ray: bool, keep_sandboxes: bool, t_start: float) -> str:
    """Stage 6 for one result; the progress bar's postfix."""
    if weaker and not on_ray:
        result.notes.append(weaker)
    run.rows.append(record(run.course, result, run.limits.max_notebook_mb * 2**20))
    planning.note_graded(run.course, result.student, result.lab)
    run.pending.pop((result.student, result.lab), None)
    write_progress(run.rows, run.pending, run.course / "grades.csv")
    if not keep_sandboxes:
        shutil.rmtree(run.root / result.lab / students.alias(result.student), ignore_errors=True)
    run.took.append((result.seconds, result.student, result.lab))
    postfix = f"{students.shown(result.student)}: {result.status}"
    if result.node:  # on a cluster: each node's throughput so far
        run.per_node[result.node] = run.per_node.get(result.node, 0) + 1
        minutes = max(time.monotonic() - t_start, 1.0) / 60
        postfix += " | " + ", ".join(f"{n} {c / minutes:.1f}/min" for n, c in sorted(run.per_node.items()))
    return postfix


def _submissions(run: Run, alone: set[str], ray_address: str | None, progress: bool, keep_sandboxes: bool) -> None:
    """Stages 3-6 for every submission, in pinned threads or on the Ray cluster."""
    phases = [(planning.cpu_slots(run.jobs), run.limits, [p for p in run.pairs if p[1] not in alone]),
              (planning.cpu_slots(1), _alone(run.limits), [p for p in run.pairs if p[1] in alone])]
    ray = cluster.RayGrader(ray_address) if ray_address and run.pairs else None
    secrets = jail.repository_secrets(run.course) if run.limits.confine_reads else []
    weaker, cancel, t_start = run.plan.note(), threading.Event(), time.monotonic()
    try:
        with tqdm(total=len(run.pairs), desc="autograding", unit="submission", disable=not progress) as bar:
            for slots, lim, phase in phases:
                if not phase:
                    continue
                results = (cluster.grade_on_ray(ray, run.course, run.template, run.specs, run.runs, phase, lim, run.root)
                           if ray is not None else
                           grade_here(slots, run.course, run.template, run.specs, run.runs, phase, lim, run.root,
                                      cancel, run.plan, secrets))
                for result in results:
                    bar.set_postfix_str(_finish(run, result, weaker, ray is not None, keep_sandboxes, t_start))
                    bar.update()
    finally:
        if ray is not None:
            ray.close()
    if progress and run.took:
        print("slowest: " + ", ".join(f"{students.shown(st)} ({lab_}) {sec:.0f} s"
                                      for sec, st, lab_ in sorted(run.took, reverse=True)[:3]), flush=True)
    if progress and run.per_node:
        print("graded per node: " + ", ".join(f"{n} {c}" for n, c in sorted(run.per_node.items())), flush=True)


def grade(course: str | Path, lab: str | None = None, jobs: int | None = None, limits: Limits | None = None,
          progress: bool = True, keep_sandboxes: bool = False, plan: isolation.Plan | None = None,
          ray_address: str | None = None, fresh: bool = False, seed: int | None = None) -> list[GradeRow]:
    """Autograde every submission (or one lab's) and write ``<course>/grades.csv``; returns its rows.

    Args:
        jobs: parallel autogrades (default: one per core), each on CPUs of its own. A lab marked
            ``timed_alone`` in :data:`gpulab.labs.LABS` is graded after the others, one at a time.
        limits: per-submission limits (default: :class:`Limits` with :func:`plan.default_memory_mb`).
        plan: the OS isolation to use (default: :func:`isolation.detect`); a missing layer raises
            :class:`WeakSandboxError` unless ``limits.allow_weaker``.
        ray_address: grade on this Ray cluster instead (``jobs`` then only sizes the reference runs).
        fresh: grade everything, even what a stopped run finished (:func:`plan.interrupted_rows`).
        seed: the hidden tests' inputs and the measured runs' seeds (default: fresh for every run;
            give the seed of an earlier run to grade on its inputs again).
    """
    run = _start(Path(course).resolve(), lab, jobs, limits, plan, fresh, seed, progress)
    alone = {lab_.id for lab_ in LABS if lab_.timed_alone}
    try:
        _references(run, alone)
        _submissions(run, alone, ray_address, progress, keep_sandboxes)
    finally:
        if not keep_sandboxes:
            shutil.rmtree(run.root, ignore_errors=True)
    note_copies(run.course, run.rows)
    run.rows.sort(key=lambda r: (r.lab, r.student))
    write_csv(run.rows, run.course / "grades.csv")
    return run.rows
