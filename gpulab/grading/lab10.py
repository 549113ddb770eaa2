"""Lab 10's graders (hyperparameter search): the random inputs the hidden tests draw from the grading
run's seed, and the code that runs the student's three answers on them.

Nothing here decides: each function runs the student's code and returns plain values for the test
cell's ``grading.check_*`` to send; the same call on the solution, in the reference run, gives the
expected side.
An exception of the student's code on one case is returned as that case's value, so the message
names the case. The Ray searches of the notebook cannot be re-run cheaply, so the hidden tests
replay the student's answers without Ray where they can:

- ``successive_halving(rungs, reduction_factor)``: :func:`promotions` on :func:`random_rungs`, and
  :func:`replays` (gpulab's ``replay_halving`` with the student's rule) on :func:`random_searches`;
- ``MyASHA(max_t, grace_period, reduction_factor)``, the asynchronous scheduler: :func:`scheduler_runs`
  on :func:`random_streams` (decisions on result streams, compared one by one with gpulab's
  ``PromotionASHA``), and :func:`tune_comparison` (a real Tune search), from
  :mod:`gpulab.grading.lab10_asha`;
- ``packed_resources(trials_per_device, num_cpus, num_gpus)``: :func:`packed_requests` on
  :func:`random_machines`, and :func:`packed_probe`, one unit of work the grader times
  (``grading.check_measured``, ``measure.wall``): Ray tasks that sleep for their data, each asking
  for the student's resources, so that its time is waiting (modelled device time), which a busy CPU
  does not stretch.
"""

from __future__ import annotations

import copy
import math
import random
import time
from typing import Any, Callable

from gpulab.grading.lab10_asha import comparison_case, random_streams, scheduler_runs, tune_comparison
from gpulab.hpo.asha import PromotionASHA, promoted
from gpulab.hpo.halving import replay_halving, rung_milestones, successive_halving
from gpulab.hpo.packing import packed_resources
from gpulab.hpo.resources import packing_factor

__all__ = [
    "REFERENCES",
    "HAND_WORKED",
    "random_rungs",
    "promotions",
    "random_searches",
    "replays",
    "lab_curves",
    "random_streams",
    "scheduler_runs",
    "comparison_case",
    "tune_comparison",
    "random_machines",
    "packed_requests",
    "probe_machine",
    "packed_probe",
    "warm_probe",
    "PROBE_WAIT_S",
]

# gpulab's reference implementations of this lab's exercises, masked in a graded kernel
# (gpulab.autograde.box.mask): the synchronous rule, the asynchronous scheduler and its test, and the packed
# request. replay_halving, asha_continues and rung_milestones are the lab's tools, which the demos
# use, not answers; Tune's own ASHAScheduler is refused by counting its calls (lab10_asha).
REFERENCES: tuple = (successive_halving, PromotionASHA, promoted, packed_resources)

# (rungs, reduction_factor, promotions), worked by hand in the lab's text (tests/hpo checks gpulab's
# reference on them; the hidden tests use only their rungs: the reference run gives the expected side)
HAND_WORKED: tuple[tuple[list[dict[str, float]], float, list[list[str]]], ...] = (
    # 6 trials after 1 epoch; f is already in rung 1, so only b (second best) is promoted
    ([{"a": 0.3, "b": 0.5, "c": 0.1, "d": 0.4, "e": 0.2, "f": 0.6}, {"f": 0.7}, {}], 3, [["b"], [], []]),
    # 10 trials: the best 3 are t9, t8, t7, and t8, t7 are already up (t6 went up earlier, when the
    # rung was smaller); rung 1 holds 3, so its best (t7) goes up; the top rung promotes nobody
    (
        [{**{f"t{i}": i / 10 for i in range(9)}, "t9": 0.85}, {"t8": 0.9, "t7": 0.95, "t6": 0.5}, {}],
        3,
        [["t9"], ["t7"], []],
    ),
    # fewer trials than the reduction factor: nobody is promoted yet (ASHA starts a new trial)
    ([{"a": 0.9, "b": 0.8}, {}], 3, [[], []]),
    # a tie keeps the order the rung recorded: x before y; a diverged trial (NaN) ranks last
    ([{"x": 0.5, "y": 0.5, "z": float("nan"), "w": 0.1}, {}], 2, [["x", "y"], []]),
    # reduction factor 2 on a 2-rung ladder with one rung to promote into
    ([{"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}, {"d": 0.45}], 2, [["c"], []]),
)


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the exception it raised (sent as the case's value: the message names it)."""
    try:
        return fn(*args)
    except Exception as err:  # the student's failure is the evidence
        return err


# ---- exercise 1: the promotion rule ------------------------------------------------------------


def _one_rungs(rng: random.Random) -> tuple[list[dict[str, float]], float]:
    rf = rng.choice([2, 3, 4, 2.5])
    n = rng.randint(0, 30)
    values = [round(rng.random(), 1) for _ in range(n)]  # rounded: ties happen
    if n and rng.random() < 0.3:
        values[rng.randrange(n)] = float("nan")
    names = rng.sample(range(100), n)  # trial names out of order: the rule must rank by metric
    rungs = [{f"t{names[i]}": v for i, v in enumerate(values)}]
    for _ in range(rng.randint(0, 3)):  # higher rungs: some of the lower rung's trials, already up
        below = list(rungs[-1])
        up = rng.sample(below, rng.randint(0, len(below) // 2)) if below else []
        rungs.append({t: round(rng.random(), 2) for t in up})
    return rungs, rf


def random_rungs(rng: random.Random, n: int) -> dict[str, tuple[list[dict[str, float]], float]]:
    """Case name -> (rungs, reduction_factor): the hand-worked rungs, then ``n`` random ladders
    (up to 30 trials, ties, a NaN now and then, trials already promoted, 1 to 4 rungs)."""
    cases = {f"hand-worked case {i + 1}": (copy.deepcopy(r), rf) for i, (r, rf, _) in enumerate(HAND_WORKED)}
    for i in range(n):
        rungs, rf = _one_rungs(rng)
        cases[f"random case {i + 1}: rungs of sizes {[len(r) for r in rungs]}, reduction_factor={rf}"] = (rungs, rf)
    return cases


def promotions(rule: Callable[..., Any], cases: dict[str, tuple[list[dict[str, float]], float]]) -> dict[str, Any]:
    """Case name -> ``rule(rungs, reduction_factor)`` (each call on its own copy of the rungs)."""
    return {name: _call(rule, copy.deepcopy(rungs), rf) for name, (rungs, rf) in cases.items()}


def _curves(rng: random.Random, n: int, epochs: int) -> dict[str, list[float]]:
    """``n`` learning curves of ``epochs`` accuracies that rise at different speeds (so they cross),
    with a little noise, rounded to 3 decimals (ties happen)."""
    curves = {}
    for i in range(n):
        final, start, tau = rng.uniform(0.1, 0.9), rng.uniform(0.05, 0.3), rng.uniform(0.3, 4.0)
        curves[f"trial_{i:05d}"] = [
            round(min(1.0, max(0.0, final - (final - start) * math.exp(-e / tau) + rng.gauss(0, 0.01))), 3)
            for e in range(1, epochs + 1)
        ]
    return curves


def lab_curves(seed: int = 0) -> dict[str, list[float]]:
    """12 learning curves of 9 epochs, like the lab's random search (the same in every run)."""
    return _curves(random.Random(seed), 12, 9)


def random_searches(rng: random.Random, n: int) -> dict[str, dict[str, Any]]:
    """Search name -> ``{"curves", "milestones", "reduction_factor"}``: finished random searches
    (5 to 30 trials) and a rung ladder to replay on them."""
    out = {}
    for i in range(n):
        rf = rng.choice([2, 3, 4])
        grace = rng.choice([1, 1, 2])
        max_t = rng.choice([8, 9, 12, 16, 27])
        trials = rng.randint(5, 30)
        milestones = rung_milestones(max_t, grace, rf)
        out[f"search {i + 1}: {trials} trials, milestones {milestones}, reduction_factor={rf}"] = {
            "curves": _curves(rng, trials, max_t),
            "milestones": milestones,
            "reduction_factor": rf,
        }
    return out


def replays(rule: Callable[..., Any], searches: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Search name -> what successive halving with ``rule`` runs on it: the epochs each trial
    reaches and the trial-epochs in all (gpulab's ``replay_halving``, which calls ``rule``)."""

    def one(s: dict[str, Any]) -> dict[str, Any]:
        r = replay_halving(copy.deepcopy(s["curves"]), s["milestones"], s["reduction_factor"], rule=rule)
        return {"reached": dict(r.reached), "trial_epochs": r.trial_epochs}

    return {name: _call(one, s) for name, s in searches.items()}


# ---- exercise 2: the asynchronous scheduler (gpulab.grading.lab10_asha) -------------------------

# ---- exercise 3: packing -----------------------------------------------------------------------


def random_machines(rng: random.Random, n: int) -> list[tuple[int, int, int]]:
    """``n`` (trials_per_device, num_cpus, num_gpus): CPU-only machines and GPU servers, from a
    laptop to a node with more GPUs than CPUs per trial."""
    return [
        (rng.randint(1, 8), rng.choice([1, 2, 3, 4, 6, 8, 16, 32, 64]), rng.choice([0, 0, 1, 2, 4, 8]))
        for _ in range(n)
    ]


def packed_requests(fn: Callable[..., Any], machines: list[tuple[int, int, int]]) -> dict[str, Any]:
    """``packed_resources(k, num_cpus=..., num_gpus=...)`` -> ``fn``'s request, with the resources
    it asks none of (a zero share) left out, as Ray reads them."""

    def one(k: int, cpus: int, gpus: int) -> Any:
        got = fn(k, cpus, gpus)
        return {key: v for key, v in got.items() if v} if isinstance(got, dict) else got

    return {f"packed_resources({k}, num_cpus={c}, num_gpus={g})": _call(one, k, c, g) for k, c, g in machines}


# A unit of the timed check: 2 rounds of tasks packed, 4 one per device, each waiting this long for
# its "batch". Long enough that Ray's scheduling (about 12 ms a run on the kit's 2-core VM) is small
# beside it: the check allows 3 x PROBE_WAIT_S, a round more than the packed run's 2 rounds need
# and a round less than one per device's 4.
PROBE_WAIT_S = 0.1
_REMOTE: dict[str, Any] = {}


def _probe_task() -> Callable[[int, int, float], int]:
    """The work of one probe task, defined inside a function so that Ray ships it by value: its
    worker imports neither gpulab nor torch."""

    def io_task(seed: int, i: int, wait_s: float) -> int:
        import time as _time

        _time.sleep(wait_s)  # waiting for the next batch: the CPU share idles
        x = (seed * 1_000_003 + i * 7919) % 2**31
        for _ in range(2000):  # a little compute on it
            x = (x * 1103515245 + 12345) % 2**31
        return x

    return io_task


def probe_machine() -> tuple[int, int, int]:
    """(num_cpus, num_gpus, trials per device) of the running Ray cluster, as the lab packs it
    (2 per core without GPUs, 4 per GPU with them).

    Raises:
        RuntimeError: if Ray is not running in this kernel.
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("Ray is not running: run the lab's first cell (ray_session) again")
    res = ray.cluster_resources()
    cpus, gpus = int(res.get("CPU", 1)), int(res.get("GPU", 0))
    return cpus, gpus, packing_factor(gpus)


def packed_probe(resources: dict[str, float], seed: int, *, wait_s: float = PROBE_WAIT_S) -> list[int]:
    """One unit of timed work: ``2 x trials per device x devices`` Ray tasks, each asking for
    ``resources`` (``{"cpu": ..., "gpu": ...}``, as ``tune.with_resources`` takes them) and waiting
    ``wait_s`` for its data. Packed, they run in 2 rounds; one per device, in 4.

    Returns:
        The tasks' results (from ``seed``), which the grader compares with the reference run's.
    """
    import ray

    cpus, gpus, per_device = probe_machine()
    if "fn" not in _REMOTE:
        _REMOTE["fn"] = ray.remote(_probe_task())
    task = _REMOTE["fn"].options(num_cpus=float(resources.get("cpu", 0)), num_gpus=float(resources.get("gpu", 0)))
    n = 2 * per_device * (gpus or cpus)
    return ray.get([task.remote(seed, i, wait_s) for i in range(n)])


def warm_probe(resources: dict[str, float], *, budget_s: float = 30.0, wait_s: float = PROBE_WAIT_S) -> float:
    """Run :func:`packed_probe` until Ray has started the worker processes it needs (a run within
    1.3 x its 2 rounds of waiting) or ``budget_s`` has passed; returns the last run's seconds.
    After a Tune search Ray starts them anew, which took 8.7 s on the kit's loaded 2-core VM."""
    t_end = time.perf_counter() + budget_s
    took = math.inf
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        packed_probe(resources, 0, wait_s=wait_s)
        took = time.perf_counter() - t0
        if took <= 1.3 * 2 * wait_s:
            break
    return took
