"""Speed verdicts from the grader's own clock (the graded side of :func:`gpulab.grading.check_speedup`).

After a test cell that registered a timed check, the grader sends the kernel one request per
run: ``warmup`` untimed runs of each workload, then ``repeats`` rounds of baseline and candidate,
interleaved, each on a seed revealed only in its own request. A run's time is the wall clock
from the grader sending the request to the grader holding both the kernel's reply and the run's
result; the kernel's own timers are never read. The seeds come from this grading run's secret
(:func:`run_seeds`), so the reference kernel and every student get the same ones, and no kernel
can compute a result before its request arrives.

:func:`speed_verdict` then applies the rule of :mod:`gpulab.grading.speedup`: results equal to the
reference run's, no candidate run faster than ``floor_s``, the student's baseline counted at most
``band`` x the reference run's, and the reference's own speed-up (timed on as many cores) as the
bar when the submission has fewer than ``min_cores`` cores.
"""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass, field
from typing import Any

from gpulab.grading import judge

ROLES = ("baseline", "candidate")


def run_seeds(secret: str, notebook: str, grade_id: str, index: int, warmup: int, repeats: int) -> dict[str, list[int]]:
    """The seeds of one timed check's runs: ``{"warmup": [...], "baseline": [...], "candidate": [...]}``,
    each different, derived from the grading run's ``secret`` (never given to a kernel)."""
    def draw(tag: str, i: int) -> int:
        digest = hashlib.sha256(f"{secret}:{notebook}:{grade_id}:{index}:{tag}:{i}".encode()).digest()
        return int.from_bytes(digest[:4], "little") % 2**30

    return {"warmup": [draw("warmup", i) for i in range(2 * warmup)],
            "baseline": [draw("baseline", i) for i in range(repeats)],
            "candidate": [draw("candidate", i) for i in range(repeats)]}


def schedule(seeds: dict[str, list[int]]) -> list[tuple[str, int, bool]]:
    """(role, seed, timed) in the order the requests go: warm-ups, then rounds alternating which
    role goes first."""
    order = [(ROLES[i % 2], s, False) for i, s in enumerate(seeds["warmup"])]
    for i, (b, c) in enumerate(zip(seeds["baseline"], seeds["candidate"])):
        pair = [("baseline", b, True), ("candidate", c, True)]
        order += pair if i % 2 == 0 else pair[::-1]
    return order


@dataclass
class Runs:
    """What the grader measured of one timed check in one kernel."""

    times: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in ROLES})
    results: dict[str, list[Any]] = field(default_factory=lambda: {r: [] for r in ROLES})  # encoded
    cpus: int = 1
    error: str = ""      # why the runs stopped (a failed request, a missing result)

    def to_json(self) -> dict[str, Any]:
        return {"times": self.times, "results": self.results, "cpus": self.cpus, "error": self.error}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Runs":
        return cls(data["times"], data["results"], int(data.get("cpus", 1)), data.get("error", ""))

    def median(self, role: str) -> float:
        return statistics.median(self.times[role])


def speed_verdict(spec: dict[str, Any], mine: Runs, ref: Runs) -> tuple[str | None, str]:
    """(why the timed check fails or None, the figures measured, for the cell's output)."""
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
    band = float(spec.get("band", 1.25))
    capped = min(base, band * ref_base)
    speedup = capped / max(cand, 1e-12)
    ref_speedup = ref_base / max(ref_cand, 1e-12)
    figures = (f"yours {speedup:.2f}x ({cand * 1e3:.1f} ms vs baseline {base * 1e3:.1f} ms"
               + (f", counted as {capped * 1e3:.1f} ms: at most {band:g} x the reference run's" if capped < base else "")
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
