"""The bytes a rank sends per step, from the collectives counted in real ranks: DDP and ZeRO-2 send
2 (N-1)/N of the model's bytes, the lab's ZeRO-1 3 (N-1)/N (the ZeRO paper's arithmetic)."""

from __future__ import annotations

import functools

import pytest

from gpulab.parallel import ShardedOptimizer, ZeRO2Optimizer, launch
from gpulab.parallel.sharding.traffic import analytic_sent, measure_traffic, sent_per_rank

STRATEGIES = [("ddp", "ddp", None), ("zero1", "zero1", ShardedOptimizer), ("zero2", "zero2", ZeRO2Optimizer)]
SIZES = (8, 30, 6)  # 240 + 30 + 180 + 6 = 456 parameters: 2 and 3 divide it, no padding


@functools.lru_cache(maxsize=None)
def _traffic(world_size):
    return launch(measure_traffic, world_size, args=(STRATEGIES, SIZES), timeout=120, echo=False)


@pytest.mark.parametrize("world_size", [2, 3])
def test_counted_bytes_match_the_papers_arithmetic(world_size):
    psi = 4 * 456  # float32 bytes of the model
    for out in _traffic(world_size):
        ddp, zero1, zero2 = out["ddp"], out["zero1"], out["zero2"]
        assert {k: v["calls"] for k, v in ddp["counted"].items()} == {"all_reduce": 4}, "one all-reduce per tensor"
        assert ddp["counted"]["all_reduce"]["bytes"] == psi
        assert {k: v["calls"] for k, v in zero2["counted"].items()} == {"reduce_scatter": 1, "all_gather": 1}
        assert zero1["counted"]["broadcast"] == {"calls": world_size, "bytes": psi}, "each rank's share, once"
        for r in (ddp, zero1, zero2):
            assert r["num_params"] == 456
            assert r["sent"] == pytest.approx(r["analytic"])
        assert zero2["sent"] == pytest.approx(2 * (world_size - 1) / world_size * psi) == ddp["sent"]
        assert zero1["sent"] == pytest.approx(1.5 * ddp["sent"])


def test_padding_adds_to_zero2s_buffers():
    padded = {"reduce_scatter": {"calls": 1, "bytes": 4 * 488}, "all_gather": {"calls": 1, "bytes": 4 * 488}}
    assert sent_per_rank(padded, 4) == pytest.approx(2 * 0.75 * 4 * 488)
    assert sent_per_rank(padded, 4) > analytic_sent("zero2", 486, 4), "486 parameters padded to 488 for 4 ranks"


def test_unknown_collectives_and_schemes_are_refused():
    with pytest.raises(ValueError, match="no send cost for \\['all_to_all'\\]"):
        sent_per_rank({"all_to_all": {"calls": 1, "bytes": 8}}, 2)
    with pytest.raises(ValueError, match="scheme must be one of"):
        analytic_sent("zero3", 10, 2)
    assert analytic_sent("zero1", 10, 2) == 3 * 0.5 * 40 and analytic_sent("ddp", 10, 1) == 0
