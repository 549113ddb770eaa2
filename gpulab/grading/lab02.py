"""Lab 02's graders: what a student's input pipeline *does*, observed where it cannot be told.

Nothing here reads an attribute the student's objects expose about themselves (a ``factor``, a
``dataset``, a dtype flag), and nothing decides a verdict: each function runs the student's code
on inputs drawn from the grading run's seed and returns what it saw, as plain values, for a test
cell to send; the expected side is the same test run against the solution in the reference kernel.

- :func:`observe_echo`: a ``BatchEcho`` class over loaders that record every batch they hand out:
  which loaded batch each yield is, loads before the first yield, passes per epoch.
- :func:`observe_cache`: a ``DecodedCache`` class over a dataset that counts ``load`` (decoding)
  and ``transform`` (augmentation) calls, its reads under fixed random states, and what forked
  DataLoader workers read through it (these two in :mod:`gpulab.grading.lab02_reuse`, re-exported).
- :func:`observe_normalize`: ``to_device_normalize``'s values and the dtype that crossed.
- :class:`PipelineRecorder`, :func:`run_epoch`, :func:`probe_pipeline`, :func:`timed_setup`
  (:mod:`gpulab.grading.lab02_pipeline`, re-exported here): an epoch of a ``make_pipeline(setup,
  accel)`` pipeline, copied through an accelerator that records what crosses and what the model
  receives, summed up as a result that depends on every sample delivered but not on the order or on
  the random augmentation; the grader times such epochs itself (``grading.check_measured``).

The ``num_workers`` choice is not timed here: an epoch at the student's count against one at
``tune_loader``'s is CPU work, which a busy grading machine stretches; the lab prints it instead.
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable, Iterable

import torch

from gpulab.data.caching import InMemoryCache
from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import tuned_pipeline
from gpulab.data.transfer import normalize_on_host, record_moves, to_device_normalize
from gpulab.data.worker_sweep import pick_workers, sweep_workers
from gpulab.grading.lab02_pipeline import (
    PAD,
    PipelineRecorder,
    canonical_digests,
    probe_pipeline,
    run_epoch,
    timed_setup,
)
from gpulab.grading.lab02_reuse import (
    bad_factors,
    echo_cases,
    observe_cache,
    observe_echo,
    observe_echo_loader,
    outcome,
    reference_cache,
)

__all__ = [
    "REFERENCES",
    "outcome",
    "WorkerCensus",
    "observe_sweep",
    "pick_cases",
    "observe_echo",
    "echo_cases",
    "observe_echo_loader",
    "bad_factors",
    "observe_cache",
    "reference_cache",
    "normalize_cases",
    "observe_normalize",
    "canonical_digests",
    "PipelineRecorder",
    "run_epoch",
    "probe_pipeline",
    "timed_setup",
    "PAD",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the normalisation (on the device, and the naive host version it must match),
# the cache, the echo, the tuned pipeline that assembles them, and the worker sweep and choice. The
# baseline pipeline and the instruments (sweep_loader, tune_loader, TransferLog, record_moves,
# profile_loop) stay: the demos and these graders use them.
REFERENCES: tuple = (
    to_device_normalize,
    normalize_on_host,
    InMemoryCache,
    BatchEcho,
    tuned_pipeline,
    sweep_workers,
    pick_workers,
)


# --- the num_workers sweep ----------------------------------------------------------------------


class WorkerCensus(torch.utils.data.Dataset):
    """``n`` samples ``(4 numbers, label)`` that note, in shared memory, which process read each one:
    for each DataLoader worker id (the main process in the last row), the reads and up to 8 distinct
    pids, so that a worker id served by a new process every epoch shows as several pids."""

    MAX_WORKERS = 16

    def __init__(self, n: int) -> None:
        self.n = n
        self.table = torch.zeros(self.MAX_WORKERS + 1, 9, dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        info = torch.utils.data.get_worker_info()
        row = self.table[min(info.id, self.MAX_WORKERS - 1) if info is not None else self.MAX_WORKERS]
        row[0] += 1
        pid = os.getpid()
        for j in range(1, 9):  # one process per worker id at a time: no race on its row
            if int(row[j]) in (0, pid):
                row[j] = pid
                break
        return torch.full((4,), float(i)), i

    def facts(self, needed: int) -> dict[str, Any]:
        pids = {int(p) for p in self.table[:-1, 1:].flatten() if p}
        return {
            "worker processes that read": len(pids),
            "read in the main process": bool(self.table[-1, 0] > 0),
            f"read at least {needed} samples": int(self.table[:, 0].sum()) >= needed,
        }


def observe_sweep(
    sweep: Callable[..., Any], counts: Iterable[int], batch_size: int = 4, num_batches: int = 3, epochs: int = 2
) -> dict[str, Any]:
    """``sweep(census, [k], batch_size=, num_batches=, epochs=)`` for each ``k`` of ``counts``, on a fresh
    :class:`WorkerCensus` each time: what it returned (its keys, whether the rate is a positive
    number) and who read the samples (``k`` worker processes for the whole run, so persistent; the
    main process only without workers; at least ``epochs x num_batches x batch_size`` samples)."""
    out: dict[str, Any] = {}
    for k in counts:
        census = WorkerCensus(2 * batch_size * num_batches)
        got = outcome(sweep, census, [k], batch_size=batch_size, num_batches=num_batches, epochs=epochs)
        rate = got.get(k) if isinstance(got, dict) else None
        out[f"num_workers={k}"] = {
            "returned": sorted(got)
            if isinstance(got, dict)
            else got
            if isinstance(got, str)
            else f"a {type(got).__name__}",
            "rate a positive number": isinstance(rate, (int, float))
            and not isinstance(rate, bool)
            and 0 < rate < float("inf"),
            **census.facts(epochs * num_batches * batch_size),
        }
    return out


def pick_cases(rng: random.Random, n: int = 12) -> list[tuple[dict[int, float], float]]:
    """``n`` random ``(rates, slack)`` arguments of ``pick_workers`` (1 to 7 counts in a shuffled key
    order, and a smaller count within the slack of the best in about half of them), then two fixed ones."""
    cases = []
    for _ in range(n):
        counts = rng.sample(range(0, 17), rng.randint(1, 7))
        rates = {k: round(rng.uniform(100.0, 2000.0), 1) for k in counts}
        slack = rng.choice([0.0, 0.05, 0.1, 0.25])
        best = max(rates, key=rates.get)
        smaller = [k for k in counts if k < best]
        if smaller and rng.random() < 0.5:  # a cheaper count just inside the slack
            rates[rng.choice(smaller)] = round(rates[best] * (1 - slack * rng.uniform(0.1, 0.9)), 1)
        cases.append((rates, slack))
    # whatever the seed drew: the fastest is not the choice, nor is the first key within the slack
    return cases + [({4: 1000.0, 2: 980.0, 0: 500.0}, 0.05), ({3: 990.0, 1: 985.0, 5: 1000.0}, 0.05)]


# --- to_device_normalize ------------------------------------------------------------------------


def normalize_cases(rng: random.Random, n: int = 6) -> dict[str, tuple]:
    """``n`` random ``(batch_uint8, mean, std)`` cases (1 to 4 channels, odd shapes, mean and std as
    lists or tensors), and two with the wrong number of values (a ValueError)."""
    cases: dict[str, tuple] = {}
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    for i in range(n):
        c = rng.randint(1, 4)
        shape = (rng.randint(1, 5), c, rng.randint(1, 9), rng.randint(1, 9))
        x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen)
        m, s = torch.rand(c, generator=gen), 0.1 + torch.rand(c, generator=gen)
        if rng.random() < 0.5:
            m, s = m.tolist(), s.tolist()
        cases[f"case {i}: a {tuple(shape)} batch"] = (x, m, s)
    x = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8, generator=gen)
    cases["3 channels, 2 means"] = (x, [0.5, 0.5], [0.2, 0.2, 0.2])
    cases["3 channels, 4 stds"] = (x, [0.5] * 3, [0.2] * 4)
    return cases


def observe_normalize(
    fn: Callable[..., Any], cases: dict[str, tuple], dtype: torch.dtype = torch.float32
) -> dict[str, Any]:
    """For each case: ``fn(x, mean, std, "cpu", dtype=dtype)`` (or the error it raised), and the
    dtype that crossed in its largest ``tensor.to(<device>)`` (``record_moves``): the requested
    dtype, or the tensor's own when none was requested."""
    out: dict[str, Any] = {}
    for name, (x, m, s) in cases.items():
        got, moves = record_moves(outcome, fn, x, m, s, torch.device("cpu"), dtype=dtype)
        largest = max(moves, key=lambda mv: mv[2]) if moves else None
        crossed = "nothing crossed" if largest is None else str(largest[1] or largest[0]).removeprefix("torch.")
        out[name] = got if isinstance(got, str) else {"values": got, "crossed as": crossed}
    return out
