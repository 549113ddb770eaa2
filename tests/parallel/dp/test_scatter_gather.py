"""gpulab.parallel.dp.scatter_gather: nested batches split like torch.chunk, outputs gathered with their
structure like torch.cat, gradients back through both, and clear errors for batches that cannot be split.

References: ``torch.chunk`` and ``torch.cat`` for the values; for the gradients, the same computation
on the unsplit batch (a row-wise function, so splitting it must not change any gradient).
"""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch

from gpulab.devices import logical_devices, placement
from gpulab.parallel import comm
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


@pytest.mark.parametrize("rows", [1, 2, 5, 7, 13])
@pytest.mark.parametrize("dim", [0, 1])
def test_scatter_then_gather_is_chunk_then_cat(devs, rows, dim) -> None:
    x = torch.randn(rows, rows + 1, 3) if dim == 0 else torch.randn(3, rows, 2)
    pieces = scatter(x, devs, dim=dim)
    ref = x.chunk(len(devs), dim=dim)
    assert len(pieces) == len(ref)
    for p, r, d in zip(pieces, ref, devs):
        assert torch.equal(p, r) and placement(p) == d
    back = gather(pieces, devs[-1], dim=dim)
    assert torch.equal(back, torch.cat(ref, dim=dim)) and torch.equal(back, x)
    assert placement(back) == devs[-1]


def test_scatter_kwargs_values_are_the_chunks(devs) -> None:
    x, scale = torch.randn(7, 2), torch.randn(7)
    args, kwargs = scatter_kwargs((x, "tag"), {"scale": scale}, devs)
    assert len(args) == len(kwargs) == len(x.chunk(4))
    for i, (a, k) in enumerate(zip(args, kwargs)):
        assert torch.equal(a[0], x.chunk(4)[i]) and a[1] == "tag"
        assert torch.equal(k["scale"], scale.chunk(4)[i])


def test_backward_through_scatter_and_gather_equals_the_unsplit_computation(devs) -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 3, dtype=torch.double, requires_grad=True)
    w = torch.randn(3, 5, dtype=torch.double, requires_grad=True)
    coeff = torch.randn(7, 5, dtype=torch.double)
    pieces = scatter(x, devs)
    weights = comm.broadcast(w, devs[: len(pieces)])  # one copy per device, as replicate does
    y = gather([torch.tanh(p) @ wi for p, wi in zip(pieces, weights)], devs[0])
    x_ref, w_ref = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y_ref = torch.tanh(x_ref) @ w_ref
    torch.testing.assert_close(y, y_ref)
    (y * coeff).sum().backward()
    (y_ref * coeff).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(w.grad, w_ref.grad)  # the copies' gradients summed back


def test_backward_of_a_nested_batch_equals_the_unsplit_computation(devs) -> None:
    torch.manual_seed(0)
    a = torch.randn(6, 4, dtype=torch.double, requires_grad=True)
    b = torch.randn(6, 4, dtype=torch.double, requires_grad=True)
    pieces = scatter({"a": a, "pair": Pair(b, torch.arange(6)), "n": 2}, devs)
    outs = [{"prod": d["a"] * d["pair"].x ** d["n"], "rows": d["pair"].mask} for d in pieces]
    got = gather(outs, devs[1])
    assert torch.equal(got["rows"], torch.arange(6))
    a_ref, b_ref = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = a_ref * b_ref ** 2
    torch.testing.assert_close(got["prod"], ref)
    got["prod"].sin().sum().backward()
    ref.sin().sum().backward()
    torch.testing.assert_close(a.grad, a_ref.grad)
    torch.testing.assert_close(b.grad, b_ref.grad)


def test_per_replica_losses_gather_into_a_vector_with_their_gradients(devs) -> None:
    x = torch.randn(8, 3, requires_grad=True)
    losses = gather([p.square().sum() for p in scatter(x, devs)], devs[0])
    torch.testing.assert_close(losses, torch.stack([c.square().sum() for c in x.detach().chunk(4)]))
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (losses * weights).sum().backward()
    expected = 2 * x.detach() * weights.repeat_interleave(2).unsqueeze(1)  # rows 2i, 2i+1 are replica i's
    torch.testing.assert_close(x.grad, expected)
