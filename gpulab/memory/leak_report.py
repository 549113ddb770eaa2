"""What LeakFinder reports: the verdict, the growth, and the surviving tensors grouped by the line
that made them (:class:`LeakReport`, one :class:`LeakSite` per line). Print a report for its table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpulab.devices.meter_report import format_bytes
from gpulab.memory.origins import Frame

__all__ = ["LeakReport", "LeakSite"]


@dataclass
class LeakSite:
    """Surviving tensors made by one line of the loop."""

    where: Frame | None  # the line in the loop (or the innermost user frame); None: no Python frame
    via: Frame | None  # the innermost user frame under it (model code), if different
    nbytes: int
    tensors: int
    steps: list[int]  # the distinct steps they were made in
    example: str  # "(32, 16, 32, 32) float32"

    def line(self) -> str:
        """One line of the report table."""
        span = f"{self.steps[0]}-{self.steps[-1]}" if len(self.steps) > 1 else str(self.steps[0])
        where = str(self.where) if self.where else "(no Python frame: autograd's device thread)"
        via = f"  [via {self.via}]" if self.via else ""
        return (f"{format_bytes(self.nbytes):>11} {self.tensors:>8} {len(self.steps):>6}  {span:>7}  {where}"
                f"  e.g. {self.example}{via}")


@dataclass
class LeakReport:
    """What :meth:`LeakFinder.report` returns; print it for the table."""

    leaking: bool
    leak_step: int | None
    growth_per_step: float
    history: list[int]
    sites: list[LeakSite] = field(default_factory=list)
    mode: str = ""
    dropped: int = 0

    def table(self) -> str:
        """The verdict, the growth, and the surviving tensors by site."""
        n = len(self.history)
        out = [f"LeakFinder [{self.mode}]: {n} steps"]
        if n:
            first, last = self.history[0], self.history[-1]
            rel = f" ({(last - first) / first:+.1%})" if first else ""
            out.append(f"live after step 0: {format_bytes(first)}, after step {n - 1}: {format_bytes(last)}{rel}; "
                       f"trend {format_bytes(self.growth_per_step)} per step")
        out.append(f"LEAKING: memory grows steadily (flagged at step {self.leak_step})" if self.leaking
                   else "not leaking: no steady growth over the judged window")
        if self.sites:
            out.append("tensors made during earlier steps and still alive, by the line that made them:")
            out.append(f"{'bytes':>11} {'tensors':>8} {'steps':>6}  {'made in':>7}  where")
            out.extend(s.line() for s in self.sites)
        else:
            out.append("no tensor made during an earlier step is still alive")
        if self.dropped:
            out.append(f"({self.dropped} allocations past max_records were counted but not traced)")
        return "\n".join(out)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()
