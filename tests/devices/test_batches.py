"""gpulab.devices.batches: nested batches (dicts, lists, tuples, namedtuples) keep their shape under
tree_map, non-tensors are left alone, and tree_nbytes is the byte count worked out by hand."""

from __future__ import annotations

from collections import namedtuple

import torch

from gpulab.devices.batches import tree_map, tree_nbytes, tree_tensors

Sample = namedtuple("Sample", "image label")


def _batch():
    image = torch.zeros(2, 3, dtype=torch.float32)  # 6 * 4 = 24 bytes
    label = torch.arange(4)  # int64: 4 * 8 = 32 bytes
    mask = torch.ones(10, dtype=torch.uint8)  # 10 bytes
    return {"x": Sample(image, label), "extra": [mask, "file.png", 7], "empty": ()}, (image, label, mask)


def test_tree_map_keeps_every_container_and_leaves_non_tensors() -> None:
    batch, (image, label, mask) = _batch()
    out = tree_map(lambda t: t + 1, batch)
    assert set(out) == {"x", "extra", "empty"} and out["empty"] == ()
    assert isinstance(out["x"], Sample) and isinstance(out["extra"], list)
    assert torch.equal(out["x"].image, image + 1) and torch.equal(out["x"].label, label + 1)
    assert torch.equal(out["extra"][0], mask + 1) and out["extra"][1:] == ["file.png", 7]
    assert tree_map(lambda t: t * 2, torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
    assert tree_map(lambda t: t, "no tensors") == "no tensors"


def test_tree_nbytes_is_the_hand_count() -> None:
    batch, tensors = _batch()
    assert tree_nbytes(batch) == 24 + 32 + 10 == sum(t.nbytes for t in tensors)
    view = torch.zeros(100)[:5]  # a view moves its own elements, not its whole storage
    assert tree_nbytes([view]) == 5 * 4
    assert tree_nbytes({"a": "b"}) == 0


def test_tree_tensors_in_order() -> None:
    batch, (image, label, mask) = _batch()
    assert [t is ref for t, ref in zip(tree_tensors(batch), (image, label, mask))] == [True] * 3
    assert len(tree_tensors(batch)) == 3 and tree_tensors(("a", 1)) == []
