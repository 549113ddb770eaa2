"""Lab 08's rules (out of memory).

- ``lab08.peak_share``: the student's value is a pair ``[peak, float32 peak]`` (bytes, measured in
  the kernel by gpulab's MemoryMeter on the same workload) and the share ``peak / float32 peak``
  must be at most the bar. The bar is ``at_most`` (the contract: 0.75 for bf16 autocast, what a
  CPU gives with room to spare); where the reference run's own share (its solution on the same
  device) is high enough that ``factor`` times it passes ``at_most`` (on a GPU, autocast's cache of
  bf16 weight copies keeps more), the bar follows the reference's, but never above ``cap``.
  Interactively there is no reference, and the bar is ``at_most``.
"""

from __future__ import annotations

from typing import Any

from gpulab.verdict.bounds import _number
from gpulab.verdict.rules import rule


def _share(pair: Any, what: str) -> tuple[float, float, float]:
    if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise ValueError(f"{what} must be a pair [peak, float32 peak], got {type(pair).__name__}")
    peak, base = _number(pair[0], f"{what}'s peak"), _number(pair[1], f"{what}'s float32 peak")
    if base <= 0:
        raise ValueError(f"{what}'s float32 peak is {base:.4g}: nothing to compare against")
    return peak, base, peak / base


@rule("lab08.peak_share")
def peak_share(mine: Any, ref: Any, *, at_most: float, factor: float = 1.15, cap: float = 0.95) -> str | None:
    """``mine[0] / mine[1] <= min(cap, max(at_most, factor * ref[0] / ref[1]))`` (``at_most`` without a reference)."""
    peak, base, share = _share(mine, "the value")
    bar = float(at_most)
    if ref is not None:
        bar = min(float(cap), max(bar, float(factor) * _share(ref, "the reference's value")[2]))
    if share > bar:
        return f"{peak:.6g} / {base:.6g} bytes = {share:.3f} of the float32 peak, more than the {bar:.3f} allowed"
    return None
