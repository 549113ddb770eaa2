"""gpulab.devices.batches: the one walker over nested batches, against hand-listed leaves."""

from __future__ import annotations

from collections import namedtuple

import torch

from gpulab.devices.batches import tree_leaves, tree_map, tree_nbytes, tree_tensors

Pair = namedtuple("Pair", "inputs targets")


def _batch():
    x, m, y = torch.zeros(4, 3), torch.ones(4, dtype=torch.bool), torch.arange(4)
    return (x, {"mask": m, "name": "ids"}, [Pair(y, 7)]), (x, m, y)


def test_leaves_in_order_with_readable_paths() -> None:
    batch, (x, m, y) = _batch()
    leaves = tree_leaves(batch)
    assert [p for p, _ in leaves] == ["batch[0]", "batch[1]['mask']", "batch[2][0][0]"]
    assert len(leaves) == 3 and all(a is b for (_, a), b in zip(leaves, (x, m, y)))
    assert len(tree_tensors(batch)) == 3 and all(a is b for a, b in zip(tree_tensors(batch), (x, m, y)))
    assert tree_leaves(torch.zeros(1), "inputs")[0][0] == "inputs"
    assert tree_leaves({"a": 1, "b": "s"}) == [] and tree_tensors(None) == []


def test_nbytes_counts_every_tensor_once_per_leaf() -> None:
    batch, (x, m, y) = _batch()
    assert tree_nbytes(batch) == 4 * 3 * 4 + 4 * 1 + 4 * 8  # float32 + bool + int64
    assert tree_nbytes("no tensors") == 0


def test_map_keeps_containers_namedtuples_and_other_values() -> None:
    batch, (x, m, y) = _batch()
    out = tree_map(lambda t: t + 1, batch)
    assert isinstance(out, tuple) and isinstance(out[2], list) and isinstance(out[2][0], Pair)
    assert out[1]["name"] == "ids" and out[2][0].targets == 7
    torch.testing.assert_close(out[0], x + 1)
    torch.testing.assert_close(out[2][0].inputs, y + 1)
