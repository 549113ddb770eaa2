"""gpulab.parallel.dp.scatter_gather: nested batches split like torch.chunk, outputs gathered with their
structure, gradients back through both, and clear errors for batches that cannot be split."""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from gpulab.devices import logical_devices, placement
from gpulab.parallel.dp.scatter_gather import batch_rows, gather, scatter, scatter_kwargs

Pair = namedtuple("Pair", "x mask")


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def test_nested_batch_is_split_like_torch_chunk(devs) -> None:
    x, m = torch.randn(5, 3), torch.arange(5)
    pieces = scatter((x, {"mask": m, "flag": True}, Pair(x, m), []), devs)
    assert len(pieces) == 3  # 5 rows over 4 devices: torch.chunk gives 2, 2, 1
    for i, (px, d, pair, empty) in enumerate(pieces):
        ref = x.chunk(4)[i]
        torch.testing.assert_close(px, ref)
        torch.testing.assert_close(d["mask"], m.chunk(4)[i])
        assert d["flag"] is True and empty == [] and isinstance(pair, Pair)
        torch.testing.assert_close(pair.x, ref)
        assert placement(px) == devs[i] == placement(d["mask"]) == placement(pair.mask)


def test_a_batch_smaller_than_the_devices_uses_fewer_devices(devs) -> None:
    pieces = scatter(torch.randn(2, 4), devs)
    assert [tuple(p.shape) for p in pieces] == [(1, 4), (1, 4)]
    assert [placement(p) for p in pieces] == devs[:2]


def test_a_batch_without_tensors_is_repeated_per_device(devs) -> None:
    assert scatter(("abc", 3), devs) == [("abc", 3)] * 4


def test_scatter_kwargs_splits_args_and_kwargs_together(devs) -> None:
    x = torch.randn(8, 2)
    args, kwargs = scatter_kwargs((x,), {"scale": torch.ones(8), "mode": "fast"}, devs)
    assert len(args) == len(kwargs) == 4
    assert all(k["mode"] == "fast" and k["scale"].shape == (2,) for k in kwargs)
    assert all(placement(k["scale"]) == d for k, d in zip(kwargs, devs))


def test_gather_keeps_the_structure_and_sends_gradients_home(devs) -> None:
    x = torch.randn(8, 3, requires_grad=True)
    pieces = scatter(x, devs)
    outs = [{"y": (2 * p, p.sum()), "name": f"r{i}", "none": None} for i, p in enumerate(pieces)]
    out = gather(outs, devs[1])
    assert set(out) == {"y", "name", "none"} and out["none"] is None
    assert out["name"] == ["r0", "r1", "r2", "r3"]  # non-tensors: one per replica
    y, sums = out["y"]
    assert isinstance(out["y"], tuple) and placement(y) == devs[1] and sums.shape == (4,)
    torch.testing.assert_close(y, 2 * x)
    (y ** 2).sum().backward()
    torch.testing.assert_close(x.grad, 8 * x.detach())


def test_gather_of_namedtuples(devs) -> None:
    outs = [Pair(torch.ones(2), torch.zeros(2)) for _ in range(3)]
    got = gather(outs, devs[0])
    assert isinstance(got, Pair) and got.x.shape == (6,)


@pytest.mark.parametrize("batch, match", [
    (torch.empty(0, 3), "0 rows"),
    ((torch.randn(4, 2), torch.randn(3)), "same batch size"),
    ((torch.randn(4, 2), torch.tensor(1.0)), "cannot be split"),
])
def test_batches_that_cannot_be_split_say_why(devs, batch, match) -> None:
    with pytest.raises(ValueError, match=match):
        scatter(batch, devs)


def test_call_without_tensors_is_refused(devs) -> None:
    with pytest.raises(ValueError, match="no tensor"):
        scatter_kwargs((3,), {"a": "b"}, devs)


@pytest.mark.parametrize("bad", [["cpu", "cpu"], "cuda:0", [0, 1], [torch.device("cpu")], 2])
def test_devices_given_as_names_point_to_logical_devices(bad) -> None:
    with pytest.raises(TypeError, match=r"logical_devices\("):
        scatter(torch.randn(4, 2), bad)


def test_gather_refuses_mismatched_replicas(devs) -> None:
    with pytest.raises(ValueError, match="same keys"):
        gather([{"a": torch.ones(1)}, {"b": torch.ones(1)}], devs[0])
    with pytest.raises(ValueError, match="length"):
        gather([(torch.ones(1),), (torch.ones(1), torch.ones(1))], devs[0])
    with pytest.raises(ValueError, match="one output per replica"):
        gather(torch.ones(3), devs[0])


def test_batch_rows() -> None:
    assert batch_rows({"a": torch.ones(7, 2), "b": [torch.ones(7)]}) == 7
    assert batch_rows(("no", "tensors")) is None
    assert batch_rows(torch.ones(2, 9), dim=1) == 9
