"""Lab 06's graders for the α–β cost model and for buckets rebuilt from the ready order.

Inputs are drawn from the grading run's seed (``grading.rng``); the reference run's solution gives
the expected side (gpulab's :mod:`gpulab.parallel.measure.ring_cost` and
:mod:`gpulab.parallel.ddp.rebuild` do the same, for the unit tests and the visible tests'
interactive expected values):

- :func:`alpha_beta_cases` (noisy all-reduce times of a known α and β), :func:`prediction_cases`
  and :func:`best_size_cases` (models, backward times, α, β, both regimes) for the fit and the
  prediction;
- :func:`timed_params`: the timed model's parameters, for the graded choice of a bucket size at
  given α, β and backward time; :func:`measured_alpha_beta` and :func:`timed_model` for the
  notebook's timing demo (all-reduce times measured in 2 gloo ranks, one rank's backward measured
  here; then :func:`gpulab.grading.lab06_ddp.bucketing_run` at the chosen size, not graded);
- :func:`rebuild_cases` (random sizes, ready orders and limits) and :func:`rebuild_models`
  (:class:`~gpulab.parallel.ddp.rebuild.OutOfOrderNet` models whose ready order is not the
  reverse registration order); :func:`refusing_torch_bucket_rule` around the student's call, since
  the exercise is to write the rule torch's ``_compute_bucket_assignment_by_size`` implements.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from gpulab.grading.lab06_ddp import SPEED_CFG
from gpulab.parallel.ddp.rebuild import OutOfOrderNet
from gpulab.parallel.launcher.launch import launch
from gpulab.parallel.measure.ring_cost import allreduce_seconds, backward_seconds, ring_allreduce_seconds
from gpulab.parallel.measure.timing import deep_mlp

__all__ = ["CANDIDATES_MB", "MEASURED_SIZES", "alpha_beta_cases", "prediction_cases", "best_size_cases",
           "measured_alpha_beta", "timed_model", "timed_params", "rebuild_cases", "rebuild_models",
           "refusing_torch_bucket_rule"]

CANDIDATES_MB = (0.05, 0.25, 1.0, 4.0)  # for the timed model: about a layer per bucket ... the whole 2.1 MB model
MEASURED_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20)  # bytes: latency-bound to bandwidth-bound on gloo


def _meta_params(sizes: list[int]) -> list[torch.Tensor]:
    return [torch.empty(n, device="meta") for n in sizes]  # only sizes matter: no memory


def alpha_beta_cases(rng: random.Random, n: int = 6) -> dict[str, tuple[list[float], list[float], int]]:
    """``(nbytes, seconds, world_size)`` per case: all-reduce times of an α and β drawn from ``rng``,
    with up to 20 % noise, at 3 to 7 sizes."""
    cases = {}
    for i in range(n):
        world_size, alpha, beta = rng.randint(2, 8), rng.uniform(5e-6, 5e-4), 1 / rng.uniform(1e8, 5e10)
        sizes = sorted(rng.sample([2**k for k in range(10, 27)], rng.randint(3, 7)))
        times = [ring_allreduce_seconds(b, world_size, alpha, beta) * (1 + rng.uniform(-0.2, 0.2)) for b in sizes]
        cases[f"case {i + 1}: {world_size} ranks, sizes {sizes} bytes"] = (sizes, times, world_size)
    return cases


def _model_case(rng: random.Random) -> dict[str, Any]:
    sizes = [rng.choice([rng.randint(10, 5000), rng.randint(10_000, 600_000)]) for _ in range(rng.randint(2, 30))]
    return {"params": _meta_params(sizes), "backward_s": rng.uniform(1e-3, 0.2), "world_size": rng.randint(2, 8),
            "alpha": rng.uniform(5e-6, 5e-4), "beta": 1 / rng.uniform(1e8, 5e10), "overlap": rng.random() < 0.6}


def _name(i: int, c: dict[str, Any], extra: str) -> str:
    sizes = [p.numel() for p in c["params"]]
    return (f"case {i + 1}: {len(sizes)} parameters of {sizes} elements, backward {c['backward_s'] * 1e3:.2f} ms, "
            f"{c['world_size']} ranks, alpha {c['alpha']:.3g} s, beta {c['beta']:.3g} s/B, overlap={c['overlap']}, {extra}")


def prediction_cases(rng: random.Random, n: int = 10) -> dict[str, tuple]:
    """Arguments of ``predict_sync_seconds(params, backward_s, bucket_size_mb, world_size, alpha,
    beta, overlap)`` drawn from ``rng`` (meta tensors as parameters)."""
    cases = {}
    for i in range(n):
        c, mb = _model_case(rng), rng.choice([0.001, 0.01, 0.1, 0.5, 1.0, 4.0, 25.0])
        cases[_name(i, c, f"{mb:g} MB buckets")] = (c["params"], c["backward_s"], mb, c["world_size"], c["alpha"],
                                                     c["beta"], c["overlap"])
    return cases


def best_size_cases(rng: random.Random, n: int = 8) -> dict[str, tuple]:
    """Arguments of ``best_bucket_size(params, backward_s, candidates_mb, world_size, alpha, beta,
    overlap)`` drawn from ``rng``."""
    cases = {}
    for i in range(n):
        c = _model_case(rng)
        candidates = sorted(rng.sample([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 4.0, 25.0], rng.randint(2, 5)))
        cases[_name(i, c, f"candidates {candidates} MB")] = (c["params"], c["backward_s"], candidates, c["world_size"],
                                                              c["alpha"], c["beta"], c["overlap"])
    return cases


def measured_alpha_beta(world_size: int = 2, sizes: tuple[int, ...] = MEASURED_SIZES,
                        repeats: int = 15) -> tuple[list[int], list[float], int]:
    """``(nbytes, seconds, world_size)``: one all-reduce's median time at each size, measured in
    ``world_size`` gloo CPU ranks (the slower rank's), ready for ``fit_alpha_beta``."""
    per_rank = launch(allreduce_seconds, world_size, args=(list(sizes), repeats), backend="gloo", echo=False)
    return list(sizes), [max(ts) for ts in zip(*per_rank)], world_size


def timed_params() -> list[nn.Parameter]:
    """The parameters of the model :func:`~gpulab.grading.lab06_ddp.bucketing_run` trains (66 tensors, 2.1 MB)."""
    return list(deep_mlp(SPEED_CFG.width, SPEED_CFG.depth, seed=SPEED_CFG.seed).parameters())


def timed_model(world_size: int = 2) -> tuple[list[nn.Parameter], float]:
    """The model :func:`~gpulab.grading.lab06_ddp.bucketing_run` times (its parameters) and the
    seconds of one backward of a rank's share of its batch, measured here."""
    cfg = SPEED_CFG
    model = deep_mlp(cfg.width, cfg.depth, seed=cfg.seed)
    g = torch.Generator().manual_seed(cfg.seed)
    inputs = torch.randn(cfg.batch_size // world_size, cfg.width, generator=g)   # (B / N, width)
    targets = torch.randint(0, 10, (cfg.batch_size // world_size,), generator=g)
    return list(model.parameters()), backward_seconds(model, inputs, targets)


def rebuild_cases(rng: random.Random, n: int = 12) -> dict[str, tuple]:
    """Arguments of ``rebuild_buckets(params, order, bucket_size_mb, first_bucket_mb)``: sizes
    (meta float32 tensors), a shuffled ready order and limits drawn from ``rng``; the first cases
    hit the limits exactly."""
    kib = 1 / 1024
    cases = {"sizes that reach each limit exactly": (_meta_params([256, 256, 512, 1024]), [0, 1, 2, 3], 2 * kib, 2 * kib),
             "one parameter": (_meta_params([rng.randint(1, 10**6)]), [0], 25.0, 1.0)}
    for i in range(n):
        sizes = [rng.randint(1, 400_000) for _ in range(rng.randint(1, 25))]
        order = list(range(len(sizes)))
        rng.shuffle(order)
        mb, first = rng.choice([0.25, 0.5, 1.0, 2.0, 25.0]), rng.choice([0.1, 0.25, 1.0])
        cases[f"case {i + 1}: {sizes} elements, ready order {order}, limits {first:g} then {mb:g} MB"] = (
            _meta_params(sizes), order, mb, first)
    return cases


def rebuild_models(rng: random.Random, n: int = 3) -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor, float, float]]:
    """``(model, inputs, targets, bucket_size_mb, first_bucket_mb)`` per case: an
    :class:`OutOfOrderNet` with widths and a layer order drawn from ``rng`` (never the identity, so
    the ready order is not the reverse registration order), and limits that give several buckets."""
    out = {}
    for i in range(n):
        widths = [rng.choice([16, 32, 64])] + [rng.choice([128, 256, 384, 512]) for _ in range(rng.randint(3, 5))] + [10]
        layers = list(range(len(widths) - 1))
        order = layers[:]
        while order == layers:
            rng.shuffle(order)
        torch.manual_seed(rng.randrange(10**6))
        model = OutOfOrderNet(widths, order)
        inputs, targets = torch.randn(8, widths[0]), torch.randint(0, 10, (8,))
        out[f"model {i + 1}: widths {widths}, layers registered in order {order}"] = (
            model, inputs, targets, rng.choice([0.5, 1.0]), rng.choice([0.25, 0.5]))
    return out


@contextlib.contextmanager
def refusing_torch_bucket_rule() -> Iterator[None]:
    """Within the block, torch's own bucket rule raises (the exercise is to write it)."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the exercise is to write the bucket rule yourself, not to call torch's "
                           "_compute_bucket_assignment_by_size")

    modules = [m for m in (dist, getattr(torch._C, "_distributed_c10d", None)) if hasattr(m, "_compute_bucket_assignment_by_size")]
    saved = [(m, m._compute_bucket_assignment_by_size) for m in modules]
    for m in modules:
        m._compute_bucket_assignment_by_size = refused
    try:
        yield
    finally:
        for m, fn in saved:
            m._compute_bucket_assignment_by_size = fn
