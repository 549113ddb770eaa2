"""Rules: named, pure judgements of one check, run by the grader on decoded values.

A test cell sends its student's side only (``grading.check_rule(value, "lab00.placement", ...)``);
the reference run sends the solution's side of the same check. The grader then calls::

    why = rules.judge("lab00.placement", mine, ref, **params)   # None: passed

``mine`` and ``ref`` are decoded evidence (:func:`gpulab.verdict.check.decode`: plain Python,
numpy-backed tensors, :class:`Measurement` lists for a measured check). Interactively (Validate)
there is no reference run, and a rule gets ``ref=None``: it then judges what it can from ``mine``
and its ``params`` alone (the contract), and the grader judges the rest.

A rule is registered with :func:`rule` in ``gpulab.verdict.labNN`` under ``"labNN.<name>"`` and
must not do I/O, import torch, or trust ``mine``: anything in it may be forged, so a rule checks
that the inputs the student's value claims to answer are the reference's (:func:`same_inputs`).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, fields
from typing import Any, Callable

Rule = Callable[..., "str | None"]
RULES: dict[str, Rule] = {}


class UnknownRule(KeyError):
    """A check named a rule that no ``gpulab.verdict`` module registers."""


def rule(name: str) -> Callable[[Rule], Rule]:
    """Register ``fn(mine, ref, **params) -> str | None`` as the rule ``name`` (``"labNN.what"``)."""
    if "." not in name:
        raise ValueError(f"a rule's name is '<module>.<name>', e.g. 'lab00.placement'; got {name!r}")

    def register(fn: Rule) -> Rule:
        if name in RULES and RULES[name] is not fn:
            raise ValueError(f"the rule {name!r} is registered twice")
        RULES[name] = fn
        return fn

    return register


def get(name: str) -> Rule:
    """The rule ``name``, importing ``gpulab.verdict.<module>`` the first time."""
    if name not in RULES:
        module = str(name).partition(".")[0]
        if not module.isidentifier():
            raise UnknownRule(name)
        try:
            importlib.import_module(f"gpulab.verdict.{module}")
        except ModuleNotFoundError:
            raise UnknownRule(name) from None
    if name not in RULES:
        raise UnknownRule(name)
    return RULES[name]


def judge(name: str, mine: Any, ref: Any, **params: Any) -> str | None:
    """Apply the rule ``name``; a rule that raises on a forged value fails the check, never the grader."""
    try:
        fn = get(name)
    except UnknownRule:
        return f"the grader has no rule {str(name)[:60]!r}"
    try:
        return fn(mine, ref, **params)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as err:
        return f"the value sent could not be judged ({type(err).__name__}: {str(err)[:200]})"


# ---- what the grader measures of a kernel's work, from its own side ----------------------------

@dataclass(frozen=True)
class Measurement:
    """One run of a measured check's work, as the grader saw it from outside the kernel.

    ``wall_s`` is the grader's clock from the request to the kernel's reply; ``cpu_s`` the CPU time
    the kernel and every process it started spent meanwhile (its cgroup's ``cpu.stat``, else
    ``/proc``); the ``read_*``/``write_*`` fields are the kernel's I/O counters (``/proc/<pid>/io``:
    ``rchar``, ``syscr``, ``read_bytes``, ``wchar``) over the same span. No kernel can make any of
    them smaller than the work it did: they only grow.
    """

    wall_s: float
    cpu_s: float | None = None
    read_chars: int | None = None
    read_calls: int | None = None
    read_bytes: int | None = None
    write_chars: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Measurement":
        def num(key: str, kind: type) -> Any:
            v = data.get(key)
            if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                return None
            return kind(v)

        wall = num("wall_s", float)
        if wall is None:
            raise ValueError("a measurement without its wall time")
        return cls(wall, num("cpu_s", float), num("read_chars", int), num("read_calls", int), num("read_bytes", int),
                   num("write_chars", int))


def least(runs: list[Measurement], field_name: str) -> float:
    """The smallest value of ``field_name`` over ``runs`` (a busy machine only ever adds)."""
    values = [getattr(r, field_name) for r in runs if getattr(r, field_name) is not None]
    if not values:
        raise ValueError(f"the grader could not measure {field_name} on this machine")
    return min(values)


# ---- helpers for rules -------------------------------------------------------------------------

def same_inputs(mine: Any, ref: Any, keys: tuple[str, ...]) -> str | None:
    """Why ``mine`` does not answer the same inputs as ``ref`` (dicts holding ``keys``), or None."""
    if not isinstance(mine, dict):
        return f"expected a dict with {', '.join(keys)}, got {type(mine).__name__}"
    for k in keys:
        if k not in mine:
            return f"the value has no {k!r}"
        if ref is not None and (k not in ref or repr(mine[k]) != repr(ref[k])):
            return f"the value answers other inputs than the grader's ({k!r} differs)"
    return None
