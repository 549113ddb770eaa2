"""Lab 03's graders for ``ChunkShuffle`` (exercise 3): the random sampler arguments the hidden test
draws from the grading run's seed, and what a chunk-aware sampler's orders must be (runs over chunks,
its ``len``, independence from the global random state, randomness over seeds and epochs).

Re-exported by :mod:`gpulab.grading.lab03`, which the test cells import; the reads whose bytes the
grader counts (``chunk_reads``) stay there. Nothing here decides.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from gpulab.data.chunk_sampler import ChunkShuffleSampler

__all__ = ["reference_sampler", "sampler_cases", "sampler_facts", "sampler_statistics"]


def reference_sampler(n: int, k: int, seed: int = 0) -> ChunkShuffleSampler:
    """gpulab's ``ChunkShuffle``: one chunk per group."""
    return ChunkShuffleSampler(n, k, seed=seed)


def sampler_cases(rng: random.Random, n: int) -> list[tuple[int, int, int, int]]:
    """``n`` random ``(num_samples, chunk_size, seed, epoch)``: a few edge cases (one chunk, one
    sample per chunk, a chunk bigger than the dataset, a short last chunk) and random ones."""
    cases = [
        (64, 64, rng.randrange(100), rng.randrange(10)),
        (5, 1, rng.randrange(100), rng.randrange(10)),
        (7, 10, rng.randrange(100), rng.randrange(10)),
    ]
    while len(cases) < n:
        size = rng.randint(2, 1200)
        cases.append(
            (size, rng.randint(1, max(1, size // rng.choice([1, 2, 5, 20]))), rng.randrange(1000), rng.randrange(50))
        )
    rng.shuffle(cases)
    return cases


def _epoch(make: Callable[..., Any], n: int, k: int, seed: int, epoch: int) -> list[int]:
    sampler = make(n, k, seed=seed)
    sampler.set_epoch(epoch)
    return [int(i) for i in sampler]


def _runs(order: Sequence[int], k: int) -> list[list[int]]:
    """``order`` cut where the chunk changes: one list of indices per run over one chunk."""
    runs: list[list[int]] = []
    for n, i in enumerate(order):
        if n == 0 or i // k != order[n - 1] // k:
            runs.append([])
        runs[-1].append(i)
    return runs


@contextmanager
def _other_global_state(seed: int) -> Iterator[None]:
    """Torch's, Python's and numpy's global random state set from ``seed``, and restored after."""
    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


def sampler_facts(make: Callable[..., Any], cases: Sequence[tuple[int, int, int, int]]) -> dict[str, Any]:
    """For each case, what the exercise fixes about ``make(n, k, seed=seed)``'s epoch: its runs over
    chunks, each sorted and in chunk order (one run per chunk, every index once), its ``len``, and
    whether another global random state gives the same order."""
    facts = {}
    for n, k, seed, epoch in cases:
        got = _epoch(make, n, k, seed, epoch)
        with _other_global_state(seed + epoch + 99):
            again = _epoch(make, n, k, seed, epoch)
        facts[f"ChunkShuffle({n}, {k}, seed={seed}) at epoch {epoch}"] = {
            "runs over chunks, each sorted": sorted(sorted(run) for run in _runs(got, k)),
            "len": len(make(n, k, seed=seed)),
            "the same order in another global random state": again == got,
        }
    return facts


def sampler_statistics(make: Callable[..., Any], seed: int, epochs: int = 200) -> dict[str, bool]:
    """Whether ``make``'s orders are random where the exercise says: another seed and another epoch
    give another order, and over ``epochs`` epochs of 40 samples in chunks of 4, every chunk comes
    first sometimes (expected 20 times each) and every index of chunk 0 starts its run sometimes
    (expected 50 times each)."""
    first_chunk, first_in_chunk = [0] * 10, [0] * 4
    for epoch in range(epochs):
        got = _epoch(make, 40, 4, seed, epoch)
        first_chunk[got[0] // 4 % 10] += 1
        start = got.index(0) - got.index(0) % 4 if 0 in got else 0
        first_in_chunk[got[start] % 4] += 1
    base = _epoch(make, 100, 10, seed, 0)
    return {
        "another seed gives another order": _epoch(make, 100, 10, seed + 1, 0) != base,
        "another epoch gives another order": _epoch(make, 100, 10, seed, 1) != base,
        f"over {epochs} epochs every chunk comes first at least 3 times": min(first_chunk) >= 3,
        f"over {epochs} epochs every index of chunk 0 starts its run at least 15 times": min(first_in_chunk) >= 15,
    }
