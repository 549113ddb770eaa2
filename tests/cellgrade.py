"""Grade chosen test cells of a lab against other answers, in seconds, the way ``make grade`` judges them.

``make grade`` runs a whole notebook per submission (a minute or more per lab); the design tests
(two correct designs pass, plausible wrong ones fail, each named for its mistake) need many answers
per exercise, so they use this harness instead:

    results = grade_cells("00_setup", {"round_robin": {"place_ranks_impl": SRC_A}, "all_on_0": {...}},
                          tests=["placement_for_machines"], prelude=["c001", "c016"])
    assert results["round_robin"]["placement_for_machines"].passed

For each answer set, a fresh Python process runs the lab's code cells in order, the exercise cells
replaced by the answers given (others keep the source's solution), up to the last test cell named,
in ``graded`` mode, with gpulab's ``REFERENCES`` of the lab masked (they raise
``MaskedReference``); the source's own cells run once in ``reference`` mode, on the same seed. The
evidence each test cell sends is captured (``gpulab.evidence.wire.emit``), a measured check's work is run and
measured in the same process (``grading.measured.measure_here``: the CPU and I/O counters of that
process), and :func:`gpulab.verdict.cell.judge_cell` decides, as the grader does. ``prelude``
keeps only the named plain code cells (ids) of those before the tests (every exercise cell and
named test cell always runs); by default all of them run.

What it does not do: the sandbox, the jail, nbgrader's cell overwriting and scoring; the lab
pipeline tests (``tests/test_notebooks.py``) and the graded class cover those.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COURSE = REPO / "notebooks"
SECRET = "cellgrade"


def _cells(lab: str, course: Path = COURSE) -> list[dict[str, Any]]:
    import nbformat

    nb = nbformat.read(str(course / "source" / lab / f"{lab}.ipynb"), as_version=4)
    out = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        meta = cell.metadata.get("nbgrader", {})
        kind = "solution" if meta.get("solution") else "test" if meta.get("grade") else "code"
        out.append({"id": cell.get("id"), "grade_id": meta.get("grade_id"), "kind": kind, "source": cell.source})
    return out


def _plan(lab: str, answers: dict[str, str] | None, tests: list[str], prelude: list[str] | None,
          course: Path) -> list[dict[str, Any]]:
    cells = _cells(lab, course)
    last = max(i for i, c in enumerate(cells) if c["grade_id"] in tests)
    plan = []
    for c in cells[: last + 1]:
        if c["kind"] == "code" and prelude is not None and c["id"] not in prelude:
            continue
        if c["kind"] == "test" and c["grade_id"] not in tests:
            continue
        src = c["source"]
        if c["kind"] == "solution" and answers and c["grade_id"] in answers:
            src = answers[c["grade_id"]]
        plan.append({**c, "source": src})
    return plan


def _worker(job: dict[str, Any]) -> dict[str, Any]:
    """In the child: run the planned cells, capture each test cell's evidence (and measure its work)."""
    os.environ.update(GPULAB_GRADING=job["mode"], GPULAB_SEED=str(job["seed"]), MPLBACKEND="agg")
    os.chdir(job["cwd"])
    from gpulab.evidence import wire
    from gpulab.evidence.codec import encode
    from gpulab.evidence.records import to_wire
    from gpulab.grading import measured

    captured: list[Any] = []
    wire.emit = lambda record: captured.append(json.loads(json.dumps(to_wire(record))))  # what the kernel would send
    if job["mode"] == "graded":
        _mask(job["lab"])
    from gpulab.grading.measured import measure_here
    from gpulab.verdict.cell import MeasuredRuns, measured_seeds

    ns: dict[str, Any] = {"__name__": "__main__"}
    out: dict[str, Any] = {}
    for cell in job["plan"]:
        captured.clear()
        error = ""
        code = re.sub(r"^(\s*)[%!].*$", r"\1pass", cell["source"], flags=re.M)  # IPython magics
        try:
            exec(compile(code, f"<cell {cell['id']}>", "exec"), ns)
        except BaseException as err:  # the kernel's error, as the grader would read it
            error = f"{type(err).__name__}: {err}"
            if cell["kind"] != "test":
                out.setdefault("_errors", []).append(f"{cell['id']}: {error}")
        if cell["kind"] != "test":
            continue
        records, runs = list(captured), {}
        for k, rec in enumerate(records):
            if isinstance(rec, dict) and rec.get("kind") == "measured":
                spec = rec.get("spec") or job["specs"].get(cell["grade_id"], {}).get(str(k), {})
                warmup, repeats = int(spec.get("warmup", 1)), int(spec.get("repeats", 1))
                seeds = measured_seeds(SECRET, job["lab"], cell["grade_id"], k, warmup + repeats)
                result = MeasuredRuns()
                try:
                    work = measured._MEASURED[rec["id"]]
                    for i, s in enumerate(seeds):
                        m, value = measure_here(work, s)
                        if i >= warmup:
                            result.measurements.append(m)
                            result.results.append(encode(value))
                except Exception as err:
                    result.error = f"a measured run raised {type(err).__name__}: {err}"
                runs[k] = result.to_json()
        out[cell["grade_id"]] = {"records": records, "error": error, "runs": runs}
    return out


def _mask(lab: str) -> None:
    """gpulab's references of the lab raise MaskedReference, as in a graded kernel."""
    import importlib

    import gpulab
    from gpulab.autograde.box.mask import lab_references

    for ref in lab_references(lab):
        module = importlib.import_module(ref.__module__)
        name = ref.__name__

        def masked(*args: Any, _n: str = f"{ref.__module__}.{name}", **kwargs: Any) -> Any:
            raise gpulab.MaskedReference(_n)

        setattr(module, name, type(name, (), {"__init__": masked}) if isinstance(ref, type) else masked)


def _run(job: dict[str, Any], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cellgrade-") as tmp:
        out = Path(tmp) / "out.json"
        proc = subprocess.run([sys.executable, __file__, "--worker", str(out)], input=json.dumps(job),
                              capture_output=True, text=True, timeout=timeout, cwd=REPO)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"cellgrade worker failed ({job['mode']}):\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def grade_cells(lab: str, answers: dict[str, dict[str, str]], tests: list[str], prelude: list[str] | None = None,
                seed: int = 12345, timeout: float = 600, course: Path = COURSE, cwd: Path | None = None) -> dict:
    """``{answer set: {test grade_id: CellResult}}`` (see the module doc). Raises RuntimeError when the
    source itself fails a named test: the harness is then testing nothing."""
    from gpulab.autograde.expected import Expected
    from gpulab.verdict.cell import MeasuredRuns, judge_cell

    work = str(cwd or (course / "source" / lab))
    ref = _run({"mode": "reference", "seed": seed, "lab": lab, "cwd": work, "specs": {},
                "plan": _plan(lab, None, tests, prelude, course)}, timeout)
    cells = {}
    for gid in tests:
        got = ref[gid]
        entries = []
        for k, rec in enumerate(got["records"]):
            if isinstance(rec, dict) and rec.get("kind") == "measured":
                rec = {"kind": "measured", "spec": rec["spec"], "seeds": [], "runs": got["runs"][str(k)]}
            entries.append(rec)
        cells[gid] = {"entries": entries, "error": got["error"]}
    problems = Expected(lab, seed, 1, {lab: cells}).problems()
    if problems:
        raise RuntimeError(f"the source of {lab} fails its own tests here: {problems}")
    specs = {gid: {k: e["spec"] for k, e in enumerate(c["entries"]) if e.get("kind") == "measured"}
             for gid, c in cells.items()}
    out = {}
    for name, given in answers.items():
        got = _run({"mode": "graded", "seed": seed, "lab": lab, "cwd": work, "specs": specs,
                    "plan": _plan(lab, given, tests, prelude, course)}, timeout)
        out[name] = {gid: judge_cell(cells[gid], got[gid]["records"],
                                     {int(k): MeasuredRuns.from_json(v) for k, v in got[gid]["runs"].items()},
                                     got[gid]["error"])
                     for gid in tests}
    return out


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.path.insert(0, str(REPO))
    result = _worker(json.loads(sys.stdin.read()))
    Path(sys.argv[2]).write_text(json.dumps(result))
