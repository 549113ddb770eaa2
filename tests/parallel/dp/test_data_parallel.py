"""gpulab.parallel.DataParallel against a single-device run: gradients equal for several models
(uneven splits, BatchNorm in both modes, tuple and dict outputs, keyword arguments, a batch smaller
than the number of devices), replica exceptions, bad input, and torch's CPU pitfall."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from gpulab.devices import cuda_device_count, logical_devices, placement
from gpulab.models import MLP, SmallCNN
from gpulab.parallel import DataParallel, comm
from gpulab.parallel.dp.data_parallel import FunctionalDataParallel, data_parallel
from gpulab.parallel.dp.step_memory import HeadWorkload, step_memory


@pytest.fixture
def devs():
    return logical_devices(4, physical=["cpu"])


class TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body, self.head = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x, scale=1.0):
        h = torch.tanh(self.body(x)) * scale
        return self.head(h), h


class DictOut(TupleOut):
    def forward(self, x, scale=1.0):
        logits, h = super().forward(x, scale)
        return {"logits": logits, "features": h}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _check_same_gradients(model, ref, loss_of, x, devs, **dp_kwargs):
    """loss_of(output) through DataParallel vs the plain model; returns the DataParallel output."""
    dp = DataParallel(model, devs, **dp_kwargs)
    out = dp(x)
    loss_of(out).backward()
    loss_of(ref(x)).backward()
    got, want = _grads(model), _grads(ref)
    for name in want:
        torch.testing.assert_close(got[name], want[name], msg=lambda m, n=name: f"{n}: {m}")
        assert placement(model.get_parameter(name).grad) == devs[0]
    return out


@pytest.mark.parametrize("rows", [5, 8, 2, 1])  # uneven (3 pieces), even, fewer rows than devices
def test_mlp_gradients_equal_a_single_device_run(devs, rows) -> None:
    torch.manual_seed(rows)
    model = MLP([6, 16, 3])
    ref = copy.deepcopy(model)
    y = torch.randint(0, 3, (rows,))
    out = _check_same_gradients(model, ref, lambda o: F.cross_entropy(o, y), torch.randn(rows, 6), devs)
    assert out.shape == (rows, 3) and placement(out) == devs[0]


def test_batchnorm_in_eval_mode_equals_a_single_device_run(devs) -> None:
    torch.manual_seed(0)
    model = SmallCNN(num_classes=4, channels=(4, 8)).eval()
    ref = copy.deepcopy(model)
    _check_same_gradients(model, ref, lambda o: o.square().mean(), torch.randn(6, 3, 8, 8), devs)


def test_batchnorm_in_training_normalises_each_piece_and_keeps_replica_0_statistics(devs) -> None:
    """torch's replica semantics: per-piece batch statistics; running stats updated from piece 0 only."""
    torch.manual_seed(0)
    model = SmallCNN(num_classes=4, channels=(4, 8))
    ref = copy.deepcopy(model)
    x = torch.randn(7, 3, 8, 8)  # 2, 2, 2, 1 rows
    DataParallel(model, devs)(x).square().mean().backward()

    params = dict(ref.named_parameters())
    outs = []
    for i, piece in enumerate(x.chunk(4)):
        if i == 0:
            outs.append(ref(piece))  # updates ref's running statistics, as replica 0 does
        else:  # the other replicas update copies that are dropped
            buffers = {n: b.clone() for n, b in ref.named_buffers()}
            outs.append(functional_call(ref, {**params, **buffers}, (piece,)))
    torch.cat(outs).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=lambda m, n=name: f"{n}: {m}")
    for (name, b), c in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, c, msg=lambda m, n=name: f"buffer {n}: {m}")
    assert model.features[1].num_batches_tracked.item() == 1  # one update, not one per replica


@pytest.mark.parametrize("cls", [TupleOut, DictOut])
def test_tuple_and_dict_outputs_are_gathered_with_their_structure(devs, cls) -> None:
    torch.manual_seed(1)
    model = cls()
    ref = copy.deepcopy(model)
    y = torch.randint(0, 3, (9,))

    def loss_of(out):
        logits, h = (out["logits"], out["features"]) if isinstance(out, dict) else out
        return F.cross_entropy(logits, y) + h.square().mean()

    out = _check_same_gradients(model, ref, loss_of, torch.randn(9, 6), devs, output_device=devs[2])
    first = out["logits"] if isinstance(out, dict) else out[0]
    assert placement(first) == devs[2]  # output_device moves the gather


def test_keyword_arguments_are_scattered_too(devs) -> None:
    model = TupleOut()
    x, scale = torch.randn(8, 6), torch.rand(8, 1)
    logits, h = DataParallel(model, devs)(x, scale=scale)
    torch.testing.assert_close(logits, model(x, scale=scale)[0])


def test_inference_under_no_grad(devs) -> None:
    model = MLP([6, 4])
    with torch.no_grad():
        out = DataParallel(model, devs)(torch.randn(5, 6))
    assert not out.requires_grad


def test_an_exception_in_a_replica_names_it(devs) -> None:
    class Picky(nn.Linear):
        def forward(self, x):
            if x.shape[0] == 1:
                raise RuntimeError("a piece of one row")
            return super().forward(x)

    with pytest.raises(RuntimeError, match="in replica 2 on logical:2.*a piece of one row"):
        DataParallel(Picky(3, 3), devs)(torch.randn(5, 3))  # pieces of 2, 2, 1 rows


def test_bad_input_gets_clear_errors(devs) -> None:
    model = MLP([3, 2])
    with pytest.raises(ValueError, match="0 rows"):
        DataParallel(model, devs)(torch.empty(0, 3))
    with pytest.raises(TypeError, match=r"logical_devices\(2\)"):
        DataParallel(model, ["cuda:0", "cuda:1"])
    with pytest.raises(TypeError, match="logical_devices"):
        DataParallel(model, [0, 1, 2])
    with pytest.raises(TypeError, match="logical_devices"):
        DataParallel(model, "cuda")
    with pytest.raises(TypeError, match="output_device"):
        DataParallel(model, devs, output_device="cuda:1")
    with pytest.raises(ValueError, match="twice"):
        DataParallel(model, [devs[0], devs[0]])
    with pytest.raises(ValueError, match="devices\\[0\\]"):
        DataParallel(comm.to(MLP([3, 2]), devs[1]), devs)
    with pytest.raises(ValueError, match="no tensor"):
        DataParallel(model, devs)("not a batch")


@pytest.mark.skipif(cuda_device_count() > 0, reason="the pitfall is CPU-only")
def test_torch_data_parallel_on_a_cpu_silently_calls_the_module_once() -> None:
    """Why gpulab has its own: torch.nn.DataParallel ignores device_ids without CUDA."""
    model, calls = nn.Linear(3, 2), []
    model.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[0]))
    dp = torch.nn.DataParallel(model, device_ids=[0, 1, 2, 3])
    dp(torch.randn(8, 3))
    assert calls == [8] and dp.device_ids == []


@pytest.mark.gpu
def test_logical_devices_sharing_one_gpu() -> None:
    gpu = logical_devices(4, physical=["cuda:0"])
    model = MLP([6, 16, 3]).to("cuda:0")
    ref = copy.deepcopy(model)
    y = torch.randint(0, 3, (10,), device="cuda:0")
    _check_same_gradients(model, ref, lambda o: F.cross_entropy(o, y), torch.randn(10, 6, device="cuda:0"), gpu)


@pytest.mark.multigpu
def test_matches_torch_data_parallel_on_real_gpus() -> None:
    n = cuda_device_count()
    gpus = logical_devices(n)
    model = SmallCNN(num_classes=4, channels=(4, 8)).to("cuda:0")
    ref = copy.deepcopy(model)
    x = torch.randn(4 * n + 1, 3, 8, 8, device="cuda:0")
    DataParallel(model, gpus)(x).square().mean().backward()
    torch.nn.DataParallel(ref, device_ids=list(range(n)))(x).square().mean().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    for b, c in zip(model.buffers(), ref.buffers()):
        torch.testing.assert_close(b, c)


def test_functional_data_parallel_is_the_same_step_as_the_module(devs) -> None:
    """data_parallel(...) and FunctionalDataParallel(data_parallel, ...) give DataParallel's outputs,
    gradients and per-device peaks; the function gets output_device as it was given."""
    work = HeadWorkload(hidden=8, vocab=500)
    head = work.model()
    x, y = work.batch(16)
    for out in (None, devs[2]):
        wrapped = FunctionalDataParallel(data_parallel, head, devs, out)
        assert wrapped.output_device == (out or devs[0]) and list(wrapped.parameters()) == list(head.parameters())
        ref_peaks = step_memory(DataParallel(head, devs, out), F.cross_entropy, x, y, devs).rows
        assert [r.peak for r in step_memory(wrapped, F.cross_entropy, x, y, devs).rows] == [r.peak for r in ref_peaks]
        torch.testing.assert_close(wrapped(x), DataParallel(head, devs, out)(x))
        torch.testing.assert_close(data_parallel(head, x, devs, out), head(x))
    seen = []

    def spy(module, batch, devices, output_device):
        seen.append((module, batch.shape[0], devices, output_device))
        return module(batch)

    FunctionalDataParallel(spy, head, devs)(x)
    FunctionalDataParallel(spy, head, devs, devs[3])(x)
    assert seen == [(head, 16, devs, None), (head, 16, devs, devs[3])]
    assert "fn=" in repr(FunctionalDataParallel(spy, head, devs)) and "output_device=logical:0" in repr(
        FunctionalDataParallel(spy, head, devs))


def test_functional_data_parallel_rejects_swapped_or_bad_arguments(devs) -> None:
    model = MLP([3, 2])
    with pytest.raises(TypeError, match="data-parallel function .* use DataParallel"):
        FunctionalDataParallel(model, devs, devs[0])
    with pytest.raises(TypeError, match="wraps an nn.Module"):
        FunctionalDataParallel(data_parallel, "model", devs)
    with pytest.raises(TypeError, match="list of LogicalDevice"):
        FunctionalDataParallel(data_parallel, model, "cuda")
    with pytest.raises(TypeError):
        FunctionalDataParallel(data_parallel, model, devs, output_device="cuda:1")
    with pytest.raises(ValueError):
        FunctionalDataParallel(data_parallel, comm.to(MLP([3, 2]), devs[1]), devs)
