"""The bandwidth arithmetic: a ring all-reduce's time, and communication over compute falling as
the hidden size grows and rising from NVLink to InfiniBand."""

from __future__ import annotations

import pytest

from gpulab.parallel.tp.cost import LINKS, Link, mlp_layer_seconds, ring_allreduce_seconds


def test_ring_allreduce_sends_2_n_minus_1_over_n_of_the_tensor():
    free = Link("no latency", 1e9, 0.0)
    assert ring_allreduce_seconds(1e9, 1, free) == 0
    assert ring_allreduce_seconds(1e9, 2, free) == pytest.approx(1.0)  # 2 x 1/2
    assert ring_allreduce_seconds(1e9, 4, free) == pytest.approx(1.5)  # 6 x 1/4
    slow = Link("latency only", float("inf"), 1e-3)
    assert ring_allreduce_seconds(1e9, 4, slow) == pytest.approx(6e-3)
    with pytest.raises(ValueError):
        ring_allreduce_seconds(1, 0, free)


def test_tp_pays_for_wide_layers_on_fast_links():
    flops = 400e12
    ratios = [mlp_layer_seconds(h, 4096, 8, LINKS["nvlink"], flops)["comm_over_compute"] for h in (1024, 4096, 16384)]
    assert ratios[0] > ratios[1] > ratios[2], "compute grows as h^2, communication as h"
    nvlink = mlp_layer_seconds(8192, 4096, 8, LINKS["nvlink"], flops)
    infiniband = mlp_layer_seconds(8192, 4096, 8, LINKS["infiniband"], flops)
    assert nvlink["compute"] == infiniband["compute"]
    assert infiniband["comm"] > 5 * nvlink["comm"], "about 9x less bandwidth per GPU"
    assert nvlink["comm_over_compute"] < 1 < mlp_layer_seconds(1024, 4096, 8, LINKS["ethernet"], flops)["comm_over_compute"]
