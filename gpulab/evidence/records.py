"""The records a kernel sends, and the reference run's entries the grader keeps: typed, versioned.

On the wire a record is a JSON object with a ``kind``; :func:`parse` is the one place where such an
object, from an untrusted kernel, becomes a typed record, or ``None`` when it is not one (which fails
whatever check it stood for). Values inside are encoded (:mod:`gpulab.evidence.codec`) and stay so
until a verdict decodes them.

- :class:`Check`: one check's value; from the reference kernel also the check's ``spec`` (kind,
  ``what``, ``hint``, tolerances, bounds, rule) and a visible test's literal ``expected``.
- :class:`Measured`: a measured check announced by a cell (the id of its work); from the reference
  kernel also its ``spec``.
- :class:`Result`: what one measured run of that work returned.
- :class:`MeasuredEntry`: what the grader keeps of a reference cell's measured check: its spec, the
  seeds of its runs and the runs it measured (JSON of :class:`gpulab.verdict.cell.MeasuredRuns`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

VERSION = 2  # of the records and of the reference run's file (gpulab.autograde.reference.Expected)


class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()  # a Check without a literal expected value


@dataclass(frozen=True)
class Check:
    value: Any
    spec: dict[str, Any] | None = None
    expected: Any = ABSENT


@dataclass(frozen=True)
class Measured:
    id: int
    spec: dict[str, Any] | None = None


@dataclass(frozen=True)
class Result:
    value: Any


@dataclass(frozen=True)
class MeasuredEntry:
    spec: dict[str, Any]
    seeds: list[int] = field(default_factory=list)
    runs: dict[str, Any] = field(default_factory=dict)


Record = Union[Check, Measured, Result]
Entry = Union[Check, MeasuredEntry]


def to_wire(record: Record | MeasuredEntry) -> dict[str, Any]:
    """The JSON object a record travels (or is kept) as."""
    if isinstance(record, Check):
        out: dict[str, Any] = {"kind": "check", "value": record.value}
        if record.spec is not None:
            out["spec"] = record.spec
        if record.expected is not ABSENT:
            out["expected"] = record.expected
        return out
    if isinstance(record, Measured):
        return {"kind": "measured", "id": record.id, **({"spec": record.spec} if record.spec is not None else {})}
    if isinstance(record, Result):
        return {"kind": "result", "value": record.value}
    if isinstance(record, MeasuredEntry):
        return {"kind": "measured", "spec": record.spec, "seeds": record.seeds, "runs": record.runs}
    raise TypeError(f"not a record: {type(record).__name__}")


def _spec(raw: dict[str, Any]) -> dict[str, Any] | None:
    spec = raw.get("spec")
    return spec if isinstance(spec, dict) else None


def parse(raw: Any) -> Record | None:
    """A kernel's record, typed, or None when ``raw`` is not one."""
    if not isinstance(raw, dict):
        return None
    kind = raw.get("kind")
    if kind == "check" and "value" in raw:
        return Check(raw["value"], _spec(raw), raw["expected"] if "expected" in raw else ABSENT)
    if kind == "measured":
        ident = raw.get("id")
        if isinstance(ident, bool) or not isinstance(ident, int) or not 0 <= ident < 10_000:
            return None
        return Measured(ident, _spec(raw))
    if kind == "result" and "value" in raw:
        return Result(raw["value"])
    return None


def parse_entry(raw: Any) -> Entry | None:
    """An entry of the reference run's file (written by the grader itself)."""
    if isinstance(raw, dict) and raw.get("kind") == "measured" and "runs" in raw:
        return MeasuredEntry(raw.get("spec") or {}, list(raw.get("seeds") or []), dict(raw["runs"]))
    record = parse(raw)
    return record if isinstance(record, Check) and record.spec is not None else None
