"""Lab 06's rules (DDP), applied by the grader.

- ``lab06.calls_per_step``: the student's value is the number of all-reduces one traced step of
  their bucketed class started (the larger over the ranks, counted by the grader's recorder). The
  contract: one per bucket, plus at most one more (the used-parameter flags). The buckets are
  those the contract defines for the traced model: its gradients' sizes in bytes (``sizes``, in
  registration order) taken last first, each bucket holding at most ``bucket_mb`` MiB unless one
  tensor alone is larger, in as few buckets as possible. The sizes and the capacity come with the
  reference run's check (plain numbers of the traced model), never from the student's kernel.
"""

from __future__ import annotations

import math
from typing import Any

from gpulab.verdict.rules import rule


def fewest_buckets(sizes: list[int], bucket_mb: float) -> int:
    """How many buckets the contract's plan has: runs of ``sizes`` taken last first, each at most
    ``bucket_mb`` MiB unless one tensor alone is larger (greedy filling gives the fewest)."""
    cap, count, filled = float(bucket_mb) * 2**20, 0, 0.0
    for nbytes in reversed([int(s) for s in sizes]):
        if count and filled + nbytes <= cap:
            filled += nbytes
        else:
            count, filled = count + 1, float(nbytes)
    return count


@rule("lab06.calls_per_step")
def calls_per_step(mine: Any, ref: Any, *, sizes: list[int], bucket_mb: float) -> str | None:
    """``mine`` all-reduces per step: between the plan's bucket count and one more."""
    if isinstance(mine, bool) or not isinstance(mine, int):
        return f"expected a number of all-reduces, got {type(mine).__name__}"
    if not sizes or not (isinstance(bucket_mb, (int, float)) and math.isfinite(bucket_mb) and bucket_mb > 0):
        raise ValueError("the check gives no model sizes or no bucket capacity")
    buckets = fewest_buckets(sizes, bucket_mb)
    if mine < buckets:
        return (
            f"{mine} all-reduces per step, fewer than the {buckets} buckets of {bucket_mb:g} MB this model "
            "needs: some gradients were not averaged in their own bucket's call"
        )
    if mine > buckets + 1:
        return (
            f"{mine} all-reduces per step for {buckets} buckets of {bucket_mb:g} MB: one per bucket, plus at "
            "most one more, is allowed"
        )
    return None
