"""The verdict of a test cell, decided in the grader's process from two streams of evidence.

The reference kernel ran the lab's source notebook once for this grading run and sent, for each
check of each test cell, the check and its expected value (:mod:`gpulab.grading.evidence`); the
student's kernel sent only its values. :func:`judge_cell` pairs them in order: the n-th value of a
cell answers the n-th check. A value that is missing, extra, of the wrong kind or unreadable fails
the cell, and so does an error the kernel reported. What the student's kernel sent is only ever
decoded and compared, never run.

Timed checks are timed by the grader (:class:`gpulab.course.execute.SandboxedExecute` sends one
request per run, in the order of :func:`schedule`, each on a seed revealed only in that request);
:func:`speed_verdict` applies the rule of :mod:`gpulab.grading.speedup` to what it measured.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpulab.grading import judge
from gpulab.i18n import messages

VERSION = 1
ROLES = ("baseline", "candidate")


# ---- timed checks: the grader's clock, on seeds no kernel knows in advance ----

def run_seeds(secret: str, notebook: str, grade_id: str, index: int, warmup: int, repeats: int) -> dict[str, list[int]]:
    """The seeds of one timed check's runs (``warmup``, ``baseline``, ``candidate``), derived from the
    grading run's ``secret``: the same for the reference kernel and every student, and never given
    to a kernel before its request."""
    def draw(tag: str, i: int) -> int:
        digest = hashlib.sha256(f"{secret}:{notebook}:{grade_id}:{index}:{tag}:{i}".encode()).digest()
        return int.from_bytes(digest[:4], "little") % 2**30

    return {"warmup": [draw("warmup", i) for i in range(2 * warmup)],
            "baseline": [draw("baseline", i) for i in range(repeats)],
            "candidate": [draw("candidate", i) for i in range(repeats)]}


def schedule(seeds: dict[str, list[int]]) -> list[tuple[str, int, bool]]:
    """(role, seed, timed) in request order: warm-ups, then rounds alternating which role goes first."""
    order = [(ROLES[i % 2], s, False) for i, s in enumerate(seeds["warmup"])]
    for i, (b, c) in enumerate(zip(seeds["baseline"], seeds["candidate"])):
        pair = [("baseline", b, True), ("candidate", c, True)]
        order += pair if i % 2 == 0 else pair[::-1]
    return order


# A busy machine slows a student's baseline runs as much as their own, and the reference run may
# have had the machine to itself (another grading job, a second test worker, a login beside it).
# The grader times a fixed piece of its own work before each timed run, in the reference run and
# in the student's: the ratio of the medians raises the baseline's cap, by at most LOAD_LIMIT, so
# that load costs fewer marks while a kernel that slows its baseline on purpose still gains little.
# Busy machines measured 1.13-1.60x (two test workers and two grading jobs on 2 cores); the limit
# keeps band x limit (1.56) under the 1.6x that the kit's slowed-baseline attack needs to pass, which
# a 1.6 limit let through on such a machine.
# The ratio also lowers the cap, down to LOAD_FLOOR, when the reference ran on the busier machine:
# its baseline was slowed, and a cap of band x that baseline let the slowed-baseline attack through
# whenever the student's run had the machine to itself by 16 % or more (CI saw it). Lowering the cap
# costs an honest baseline nothing, since the quieter machine speeds it up alike; no kernel can slow
# the reference run's probes, and the floor keeps one noisy probe from halving the cap further.
LOAD_LIMIT = 1.25
LOAD_FLOOR = 0.5
PROBE_ITERATIONS = 200_000  # about 10 ms of one core of a laptop


def probe_seconds(n: int = PROBE_ITERATIONS) -> float:
    """Wall time of ``n`` steps of a pure-Python loop in the grader's own process (one core; no
    kernel's code can reach it): how busy the machine is now, as a time."""
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i * i
    return time.perf_counter() - t0


def load_factor(mine: "Runs", ref: "Runs") -> float:
    """How much busier (above 1) or quieter (below 1) the machine was during ``mine``'s runs than
    during the reference's, from the grader's probes: 1 with no probes, between :data:`LOAD_FLOOR`
    and :data:`LOAD_LIMIT`."""
    if not mine.probes or not ref.probes:
        return 1.0
    ratio = statistics.median(mine.probes) / max(statistics.median(ref.probes), 1e-9)
    return min(LOAD_LIMIT, max(LOAD_FLOOR, ratio))


@dataclass
class Runs:
    """What the grader measured of one timed check in one kernel (``probes``: :func:`probe_seconds`
    before each timed run)."""

    times: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    results: dict[str, list[Any]] = field(default_factory=lambda: {r: [] for r in ROLES})  # encoded
    cpus: int = 1
    error: str = ""      # why the runs stopped (a failed request, a missing result)
    probes: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"times": self.times, "results": self.results, "cpus": self.cpus, "error": self.error,
                "probes": self.probes}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Runs":
        probes = [float(p) for p in data.get("probes", []) if isinstance(p, (int, float)) and p > 0]
        return cls(data["times"], data["results"], int(data.get("cpus", 1)), data.get("error", ""), probes)

    def median(self, role: str) -> float:
        return statistics.median(self.times[role])


def speed_verdict(spec: dict[str, Any], mine: Runs, ref: Runs) -> tuple[str | None, str]:
    """(why the timed check fails or None, the figures measured): results equal to the reference
    run's, no candidate run under ``floor_s``, the baseline counted at most ``band`` x the reference
    run's (times the machine's :func:`load_factor`), and the reference's own speed-up as the bar below
    ``min_cores`` cores."""
    what = spec.get("what") or "speed-up"

    def fail(detail: str) -> str:
        return f"{what}: {detail}" + (f"\n  Hint: {spec['hint']}" if spec.get("hint") else "")

    if mine.error:
        return fail(mine.error), ""
    repeats = int(spec.get("repeats", 3))
    if any(len(mine.times[r]) != repeats or len(mine.results[r]) != repeats for r in ROLES):
        return fail("the timed runs did not all complete"), ""
    for role in ROLES:
        for i, (got, want) in enumerate(zip(mine.results[role], ref.results[role])):
            try:
                why = judge.verdict({"kind": "close", "what": f"the result of {role} run {i + 1}",
                                     "rtol": spec.get("rtol"), "atol": spec.get("atol")},
                                    judge.decode(got), judge.decode(want))
            except judge.EvidenceError as err:
                why = f"the result of {role} run {i + 1} could not be read: {err}"
            if why:
                return fail(f"the timed work did not give the reference's result ({why})"), ""
    floor = spec.get("floor_s")
    if floor is not None and min(mine.times["candidate"]) < 0.95 * float(floor):
        return fail(f"a run took {min(mine.times['candidate']) * 1e3:.1f} ms, less than the {float(floor) * 1e3:.1f} ms "
                    "its device work needs: the work was not done as written"), ""
    cand, base = mine.median("candidate"), mine.median("baseline")
    ref_base, ref_cand = ref.median("baseline"), ref.median("candidate")
    band, load = float(spec.get("band", 1.25)), load_factor(mine, ref)
    capped = min(base, band * load * ref_base)
    speedup = capped / max(cand, 1e-12)
    ref_speedup = ref_base / max(ref_cand, 1e-12)
    busier = (f" ({band:g} x {load:.2f}: the machine was {load:.2f}x as busy)" if load > 1.01 else
              f" ({band:g} x {load:.2f}: the reference ran on a machine {1 / load:.2f}x as busy)" if load < 0.99 else "")
    figures = (f"yours {speedup:.2f}x ({cand * 1e3:.1f} ms vs baseline {base * 1e3:.1f} ms"
               + (f", counted as {capped * 1e3:.1f} ms: at most {band * load:.2f} x the reference run's{busier}"
                  if capped < base else "")
               + f"); reference {ref_speedup:.2f}x; {mine.cpus} core(s); timed by the grader")
    at_least = float(spec["at_least"])
    if speedup >= at_least:
        return None, figures + ": passed against the target"
    min_cores = float(spec.get("min_cores", 1.6))
    relative = float(spec.get("relative", 0.85))
    if mine.cpus < min_cores and speedup >= relative * ref_speedup:
        return None, figures + f": passed relative to the reference ({judge.relative_bar_why(min_cores, relative, mine.cpus)})"
    bar = f"at least {at_least:.2f}x" + (f" (or {relative:.2f} x the reference's {ref_speedup:.2f}x"
                                         + (f" with fewer than {min_cores:g} cores)"
                                            if min_cores <= judge.EVERY_MACHINE_CORES else ")")
                                         if mine.cpus < min_cores else "")
    return fail(f"needs {bar}; measured {figures}"), figures


# ---- a test cell's verdict ----

@dataclass
class CellResult:
    """The grader's verdict on one test cell."""

    passed: bool
    message: str = ""              # why it failed, for the student (the first failing check)
    figures: list[str] = field(default_factory=list)  # timed checks' measurements, shown either way
    note: str = ""                 # what a human should look at (grades.csv)


@dataclass
class Expected:
    """One lab's reference run (``expected.json``, readable by the grader only): for each notebook
    and test cell, the entries its checks sent."""

    lab: str
    seed: int
    cpus: int
    cells: dict[str, dict[str, dict[str, Any]]]   # notebook -> grade_id -> {"entries": [...], "error": str}
    seconds: float = 0.0

    def cell(self, notebook: str, grade_id: str) -> dict[str, Any] | None:
        return self.cells.get(notebook, {}).get(grade_id)

    def save(self, path: Path) -> None:
        data = {"version": VERSION, "lab": self.lab, "seed": self.seed, "cpus": self.cpus, "seconds": self.seconds,
                "cells": self.cells}
        path.write_text(json.dumps(data))
        path.chmod(0o600)

    @classmethod
    def load(cls, path: Path) -> "Expected":
        data = json.loads(Path(path).read_text())
        if data.get("version") != VERSION:
            raise ValueError(f"{path} is not a reference run of this gpulab (version {data.get('version')})")
        return cls(data["lab"], int(data["seed"]), int(data["cpus"]), data["cells"], float(data.get("seconds", 0)))

    def problems(self) -> list[str]:
        """Where the reference run fails its own checks: the source notebook has a bug, and no
        submission of this lab can be graded against it."""
        out = []
        for nb, cells in self.cells.items():
            for gid, cell in cells.items():
                if cell.get("error"):
                    out.append(f"{nb}/{gid}: the reference run raised {cell['error'][:300]}")
                    continue
                runs = {n: Runs.from_json(e["runs"]) for n, e in enumerate(cell["entries"]) if _is_entry(e, "timed")}
                result = judge_cell(cell, cell["entries"], runs, "")
                if not result.passed:
                    out.append(f"{nb}/{gid}: {result.message[:300]}")
        return out


def _is_entry(record: Any, kind: str) -> bool:
    return isinstance(record, dict) and record.get("kind") == kind


def judge_cell(reference: dict[str, Any], records: list[Any], runs: dict[int, Runs], kernel_error: str,
               lang: str | None = None) -> CellResult:
    """Judge one test cell.

    Args:
        reference: the reference run's cell: ``{"entries": [...]}``, each a check (``spec``,
            ``expected``) or a timed check (``spec``, ``runs``).
        records: what the student's kernel sent in the cell, in order (raw JSON, untrusted).
        runs: for the n-th record that announced a timed check, what the grader measured.
        kernel_error: the error the kernel reported for the cell ('' if none).
    """
    result = _judge(reference["entries"], records, runs, kernel_error, lang)
    if "MaskedReference" in kernel_error:
        result.note = "called gpulab's reference, which is masked while grading (" + kernel_error[:200] + ")"
    return result


def _judge(entries: list[dict[str, Any]], records: list[Any], runs: dict[int, Runs], kernel_error: str,
           lang: str | None = None) -> CellResult:
    figures: list[str] = []
    capped = ""
    if len(records) > len(entries):  # a value for every check and no more: forged or doubled evidence fails first
        why = (f"the cell sent {len(records) - len(entries)} more value(s) than its checks make "
               "(a check called from your own code, or evidence sent by hand)")
        return CellResult(False, why, figures, note=why)
    for n, entry in enumerate(entries):
        spec = messages.localize(entry.get("spec", {}), lang)  # the student's language, if translated
        what = spec.get("what") or f"check {n + 1}"
        if n >= len(records):
            stop = f": {kernel_error}" if kernel_error else ""
            return CellResult(False, f"the test stopped before checking {what}{stop}", figures)
        got = records[n]
        if _is_entry(entry, "timed"):
            if not _is_entry(got, "timed") or n not in runs:
                why = f"{what}: the cell did not hand its timed work to the grader"
                return CellResult(False, why, figures, note=why)
            mine = runs[n]
            why, shown = speed_verdict(spec, mine, Runs.from_json(entry["runs"]))
            if shown:
                figures.append(shown)
            if "counted as" in (why or "") + shown:
                capped = f"{what}: the baseline ran slower than the reference run's, and was capped"
            if why:
                odd = "less than" in why or "malformed" in mine.error or "results instead of one" in mine.error
                return CellResult(False, why, figures, note=why.splitlines()[0] if odd else capped)
            continue
        if not _is_entry(got, "check") or "value" not in got:
            why = f"{what}: the cell sent something other than this check's value"
            return CellResult(False, why, figures, note=why)
        try:
            why = judge.verdict(spec, judge.decode(got["value"]), judge.decode(entry.get("expected")))
        except (judge.EvidenceError, RecursionError) as err:
            why = f"{what}: the value sent could not be read ({err or 'nested too deeply'})"
            return CellResult(False, why, figures, note=why)
        if why:
            return CellResult(False, why, figures)
    if kernel_error:
        return CellResult(False, f"every check passed, but the cell then raised {kernel_error}", figures, note=capped)
    return CellResult(True, "", figures, note=capped)
