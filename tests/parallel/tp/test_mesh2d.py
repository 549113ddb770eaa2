"""2-D parallelism on a 2 x 2 mesh of 4 gloo ranks: the groups are the mesh's rows and columns, and
TP over "tp" with gradients averaged over "dp" equals one process on the whole batch."""

from __future__ import annotations

import functools

import pytest

from gpulab.parallel import launch
from gpulab.parallel.tp.mesh2d import run_2d


@functools.lru_cache(maxsize=None)
def _run():
    return launch(run_2d, 4, args=(2,), timeout=120, echo=False)


def test_tp_inside_dp_across_equals_one_process():
    per_rank = _run()
    assert [r["coords"] for r in per_rank] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r["tp_ranks"] for r in per_rank] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [r["dp_ranks"] for r in per_rank] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert max(r["max_abs_diff"] for r in per_rank) < 1e-5


def test_the_mesh_must_divide_the_ranks():
    with pytest.raises(ValueError, match="world_size=3 is not divisible by tp_size=2"):
        run_2d(0, 3, 2)
