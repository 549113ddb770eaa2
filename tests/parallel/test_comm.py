"""gpulab.parallel.comm: values and gradients against plain torch ops, placement, bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import gpulab.parallel as parallel
from gpulab.devices import LogicalDevice, logical_devices, placement
from gpulab.parallel import comm


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


def _on(x: torch.Tensor, dev: LogicalDevice) -> torch.Tensor:
    """A leaf tensor that lives on ``dev`` (moved there, then detached: the storage stays placed)."""
    return comm.to(x, dev).detach().requires_grad_(x.requires_grad)


def test_reexported_from_parallel() -> None:
    for name in ["to", "broadcast", "scatter", "gather", "reduce_add"]:
        assert getattr(parallel, name) is getattr(comm, name)


def test_to_is_a_real_copy_on_a_shared_physical_device(devs) -> None:
    x = torch.randn(5, 3)
    y = comm.to(x, devs[1])
    torch.testing.assert_close(y, x)
    assert y.device == x.device  # same physical device...
    assert y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()  # ...but its own memory
    assert placement(y) == devs[1] and placement(x) == devs[0]
    assert comm.to(y, devs[1]) is y  # already there: no copy, like Tensor.to


def test_to_backward_sends_the_gradient_home(devs) -> None:
    x = _on(torch.randn(4, 3, requires_grad=True), devs[2])
    w = torch.randn(4, 3)
    y = comm.to(x, devs[1])
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, w)  # d/dx sum(x * w) = w
    assert placement(x.grad) == devs[2]  # on the source device, not where the loss was


def test_gradients_match_torch_reference(devs) -> None:
    def chain(a, b):
        # a (8, 3) scattered over 4 devices, each piece scaled there, gathered back; b broadcast
        # to every device and reduce-added on device 3.
        pieces = comm.scatter(a, devs)
        gathered = comm.gather([p * (i + 1) for i, p in enumerate(pieces)], devs[1])
        summed = comm.reduce_add([c * (i + 1) for i, c in enumerate(comm.broadcast(b, devs))], devs[3])
        return comm.to(gathered, devs[2]), summed

    a = torch.randn(8, 3, dtype=torch.double, requires_grad=True)
    b = torch.randn(3, dtype=torch.double, requires_grad=True)
    assert gradcheck(chain, (a, b))
    assert gradgradcheck(chain, (a, b))
    out, summed = chain(a, b)
    scale = torch.arange(1, 5, dtype=torch.double).repeat_interleave(2)[:, None]
    torch.testing.assert_close(out, a * scale)  # the plain-torch reference
    torch.testing.assert_close(summed, b * 10)


def test_scatter_has_chunk_semantics(devs) -> None:
    x = torch.arange(10.0).reshape(5, 2)
    pieces = comm.scatter(x, devs)
    assert [p.shape[0] for p in pieces] == [2, 2, 1]  # torch.chunk: 5 rows over 4 -> 3 pieces
    for p, ref, dev in zip(pieces, torch.chunk(x, 4), devs):
        torch.testing.assert_close(p, ref)
        assert placement(p) == dev
    assert pieces[0].untyped_storage().data_ptr() == x.untyped_storage().data_ptr()  # own device: a view
    cols = comm.scatter(torch.randn(3, 8), devs, dim=1)
    assert [tuple(c.shape) for c in cols] == [(3, 2)] * 4


def test_gather_concatenates_on_the_output_device(devs) -> None:
    parts = [_on(torch.randn(i + 1, 3, requires_grad=True), d) for i, d in enumerate(devs)]
    out = comm.gather(parts, devs[0])
    torch.testing.assert_close(out, torch.cat(parts))
    assert placement(out) == devs[0]
    g = torch.randn_like(out)
    out.backward(g)
    for p, ref, dev in zip(parts, g.split([1, 2, 3, 4]), devs):
        torch.testing.assert_close(p.grad, ref)
        assert placement(p.grad) == dev
    assert comm.gather([torch.randn(2, 3), torch.randn(2, 5)], devs[1], dim=1).shape == (2, 8)


def test_gather_of_scalars_makes_a_vector(devs) -> None:
    losses = [_on(torch.tensor(float(i)), d) for i, d in enumerate(devs)]
    out = comm.gather(losses, devs[0])
    torch.testing.assert_close(out, torch.arange(4.0))


def test_broadcast_and_reduce_add(devs) -> None:
    w = torch.randn(3, 2, requires_grad=True)  # lives on device 0
    copies = comm.broadcast(w, devs)
    assert copies[0] is w  # its own device gets the tensor itself, as torch's broadcast does
    assert [placement(c) for c in copies] == devs
    assert len({c.untyped_storage().data_ptr() for c in copies}) == 4
    total = comm.reduce_add([c * (i + 1) for i, c in enumerate(copies)], devs[0])
    torch.testing.assert_close(total, w * 10)
    assert placement(total) == devs[0]
    total.sum().backward()
    torch.testing.assert_close(w.grad, torch.full_like(w, 10.0))  # 1 + 2 + 3 + 4


def test_to_moves_a_module(devs) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    reference = copy.deepcopy(model)
    old = model[0].weight.untyped_storage().data_ptr()
    assert comm.to(model, devs[3]) is model
    for t, r in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(t, r)
        assert placement(t) == devs[3]
    assert model[0].weight.untyped_storage().data_ptr() != old  # a copy, though both are on the CPU
    assert isinstance(model[0].weight, torch.nn.Parameter)
    x = torch.randn(5, 3)
    torch.testing.assert_close(model(comm.to(x, devs[3])), reference(x))


@pytest.mark.parametrize("bad", ["cuda:1", torch.device("cpu"), 1, None])
def test_a_device_that_is_not_logical_names_the_fix(devs, bad) -> None:
    x = torch.randn(2)
    with pytest.raises(TypeError, match=r"logical_devices\(n\)"):
        comm.to(x, bad)
    with pytest.raises(TypeError, match=r"logical_devices\(2\)"):
        comm.scatter(x, [devs[0], bad])
    with pytest.raises(TypeError, match=r"logical_devices\(n\)"):
        comm.gather([x, x], bad)


def test_a_gpu_the_machine_lacks_is_refused() -> None:
    missing = LogicalDevice(0, torch.device("cuda", 99))
    with pytest.raises(ValueError, match="does not have"):
        comm.to(torch.randn(2), missing)


def test_bad_lists_and_shapes(devs) -> None:
    x = torch.randn(4, 2)
    with pytest.raises(ValueError, match="devices is empty"):
        comm.scatter(x, [])
    with pytest.raises(TypeError, match="must be a list of LogicalDevice"):
        comm.broadcast(x, devs[0])
    with pytest.raises(ValueError, match="twice"):
        comm.broadcast(x, [devs[0], devs[1], devs[0]])
    with pytest.raises(ValueError, match="differ along dim=0 only"):
        comm.gather([torch.randn(2, 3), torch.randn(2, 4)], devs[0])
    with pytest.raises(ValueError, match="same dtype"):
        comm.gather([torch.randn(2), torch.randn(2, dtype=torch.double)], devs[0])
    with pytest.raises(ValueError, match="same-shaped"):
        comm.reduce_add([torch.randn(2), torch.randn(3)], devs[0])
    with pytest.raises(ValueError, match="list of tensors"):
        comm.gather(torch.randn(2), devs[0])
    with pytest.raises(TypeError, match="torch.Tensor"):
        comm.to([1.0, 2.0], devs[1])


@pytest.mark.multigpu
def test_real_gpus_get_real_device_copies() -> None:
    d0, d1 = logical_devices(2)
    x = comm.to(torch.randn(64, 8, requires_grad=True), d0).detach().requires_grad_()
    y = comm.to(x, d1)
    assert y.device == torch.device("cuda", 1) and x.device == torch.device("cuda", 0)
    y.sum().backward()
    assert x.grad.device == torch.device("cuda", 0)
    out = comm.gather(comm.scatter(x, [d0, d1]), d1)
    assert out.device == torch.device("cuda", 1)
    torch.testing.assert_close(out.cpu(), x.detach().cpu())
