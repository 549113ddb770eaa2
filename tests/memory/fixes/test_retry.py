"""gpulab.memory.fixes.retry.step_or_split (lab 08's exercise 3): under a budget that the whole batch does
not fit, the step goes on in micro-batches, the fewest that fit (as a brute force over every split
finds them), and leaves the parameters of the step that never ran out of memory."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from gpulab.devices import MemoryMeter, logical_devices
from gpulab.memory.fixes import retry
from gpulab.memory.fixes.retry import step_or_split
from gpulab.models import MLP

DEV = logical_devices(1, physical=["cpu"])[0]


def _data(steps=4, batch=2048):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(batch, 64, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(steps)]


class CountingLoss(nn.Module):
    """Cross-entropy that records how many samples each call saw."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = reduction
        self.seen: list[int] = []

    def forward(self, outputs, targets):
        self.seen.append(targets.shape[0])
        return nn.functional.cross_entropy(outputs, targets, reduction=self.reduction)


def test_accumulation_equals_the_whole_batch_gradient() -> None:
    torch.manual_seed(0)
    model = MLP((8, 16, 3))
    x, y = torch.randn(10, 8), torch.randint(0, 3, (10,))
    grads = []
    for k in (1, 3, 10):  # uneven micro-batches too: 4, 3, 3
        m = copy.deepcopy(model)
        loss = retry._accumulate(m, nn.CrossEntropyLoss(), x, y, k, "mean")  # what step_or_split runs per split
        grads.append((loss, [p.grad.clone() for p in m.parameters()]))
    for loss, g in grads[1:]:
        assert loss == pytest.approx(grads[0][0], rel=1e-6)
        for a, b in zip(g, grads[0][1]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_a_summed_loss_is_split_without_rescaling() -> None:
    """reduction="sum": each micro-batch's loss is added as it is; the step equals the unsplit one."""
    torch.manual_seed(0)
    model = MLP((64, 256, 10))
    ref = copy.deepcopy(model)
    x, y = _data(1, 300)[0]
    meter = MemoryMeter()
    meter.track(ref, DEV)
    with meter:
        want_loss, _ = step_or_split(ref, torch.optim.SGD(ref.parameters(), lr=1e-4), nn.CrossEntropyLoss(reduction="sum"), x, y)
    meter = MemoryMeter(int(0.6 * meter.peak(DEV)))
    meter.track(model, DEV)
    with meter:
        loss, k = step_or_split(model, torch.optim.SGD(model.parameters(), lr=1e-4), nn.CrossEntropyLoss(reduction="sum"), x, y)
    assert k > 1 and loss == pytest.approx(want_loss, rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_parts_of_the_wrong_kind_name_the_fix() -> None:
    model = MLP((4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(3, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(TypeError, match="nn.Module"):
        step_or_split(lambda t: t, opt, nn.CrossEntropyLoss(), x, y)
    with pytest.raises(TypeError, match="Optimizer"):
        step_or_split(model, None, nn.CrossEntropyLoss(), x, y)
    with pytest.raises(TypeError, match="tensors"):
        step_or_split(model, opt, nn.CrossEntropyLoss(), x.tolist(), y)


def _fits_alone(model, x, y, k, budget) -> bool:
    """Whether the gradients in ``k`` micro-batches fit ``budget`` in a fresh meter (nothing failed before)."""
    m = copy.deepcopy(model)
    meter = MemoryMeter(budget)
    meter.track(m, DEV)
    try:
        with meter:
            retry._accumulate(m, nn.CrossEntropyLoss(), x, y, k, "mean")
        return True
    except torch.OutOfMemoryError:
        return False


@pytest.mark.parametrize("budget_share", [1.0, 0.6, 0.35])
def test_step_or_split_takes_the_unsplit_step_in_the_fewest_micro_batches_that_fit(budget_share) -> None:
    torch.manual_seed(0)
    model = MLP((64, 256, 10))
    ref = copy.deepcopy(model)
    x, y = _data(1, 301)[0]  # an odd batch: uneven splits
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    meter = MemoryMeter()
    meter.track(ref, DEV)
    with meter:
        want_loss, want_k = step_or_split(ref, ref_opt, nn.CrossEntropyLoss(), x, y)
    assert want_k == 1
    budget = int(budget_share * meter.peak(DEV))
    fewest = next(k for k in range(1, 302) if _fits_alone(model, x, y, k, budget))
    loss_fn = CountingLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    meter = MemoryMeter(budget)
    meter.track(model, DEV)
    with meter:
        loss, k = step_or_split(model, opt, loss_fn, x, y)
    assert k == fewest and (k > 1) == (budget_share < 1)  # a failed attempt leaves the next one the whole budget
    assert sum(loss_fn.seen[-k:]) == 301 and max(loss_fn.seen[-k:]) - min(loss_fn.seen[-k:]) <= 1
    assert meter.live(DEV) == 3 * sum(p.numel() * 4 for p in model.parameters())  # weights, gradients, momentum
    assert loss == pytest.approx(want_loss, rel=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_step_or_split_raises_when_one_sample_does_not_fit_and_lets_other_errors_through() -> None:
    torch.manual_seed(0)
    model = MLP((64, 256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    meter = MemoryMeter(budget=120_000)  # the weights (77 kB) fit, their gradients too do not
    meter.track(model, DEV)
    with meter, pytest.raises(torch.OutOfMemoryError, match="split into 4 micro-batches"):
        step_or_split(model, opt, nn.CrossEntropyLoss(), *_data(1, 4)[0])
    assert all(p.grad is None for p in model.parameters())
    boom = KeyError("a bug in the loss")

    def bad_loss(outputs, targets):
        raise boom

    with pytest.raises(KeyError) as err:
        step_or_split(model, opt, bad_loss, *_data(1, 4)[0])
    assert err.value is boom
    with pytest.raises(ValueError, match="reduction must be 'mean' or 'sum'"):
        step_or_split(model, opt, nn.CrossEntropyLoss(reduction="none"), *_data(1, 4)[0])
    with pytest.raises(ValueError, match="same non-zero number of samples"):
        step_or_split(model, opt, nn.CrossEntropyLoss(), torch.randn(3, 64), torch.zeros(2, dtype=torch.long))


class CublasLimited(nn.Module):
    """A linear layer whose matmul fails as cuBLAS does when its workspace cannot be allocated: a plain
    RuntimeError, not torch.OutOfMemoryError, for micro-batches of more than ``fits`` samples."""

    def __init__(self, fits: int):
        super().__init__()
        self.fits, self.linear = fits, nn.Linear(4, 2)

    def forward(self, x):
        if x.shape[0] > self.fits:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")
        return self.linear(x)


def test_a_cublas_out_of_memory_is_retried_like_the_allocators() -> None:
    """cuBLAS and cuDNN report out-of-memory as a plain RuntimeError: it must split the batch too, or
    the step is lost (issue 39, smaller items)."""
    torch.manual_seed(0)
    model = CublasLimited(fits=3)
    x, y = torch.randn(8, 4), torch.zeros(8, dtype=torch.long)
    with torch.no_grad():
        want = nn.functional.cross_entropy(model.linear(x), y).item()
    loss, k = step_or_split(model, torch.optim.SGD(model.parameters(), lr=0.1), nn.CrossEntropyLoss(), x, y)
    assert k == 3 and loss == pytest.approx(want, rel=1e-6)  # 8 fails, then 4 + 4, then 3 + 3 + 2 fits


def test_a_runtime_error_that_is_not_out_of_memory_passes_through() -> None:
    from gpulab.memory.batch_size import is_out_of_memory

    def shape_bug(outputs, targets):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (3x4 and 5x2)")

    model = MLP((4, 2))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        step_or_split(model, torch.optim.SGD(model.parameters(), lr=0.1), shape_bug,
                      torch.randn(3, 4), torch.zeros(3, dtype=torch.long))
    assert all(p.grad is None for p in model.parameters())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory")) and is_out_of_memory(
        RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")) and not is_out_of_memory(ValueError("out of memory"))


def test_find_max_batch_size_counts_a_cublas_failure_as_not_fitting() -> None:
    from gpulab.memory import find_max_batch_size

    model = CublasLimited(fits=37)
    best = find_max_batch_size(lambda b: model(torch.randn(b, 4)).sum().backward(), lo=1, hi=256, budget=2**30)
    assert best == 37


@pytest.mark.gpu
def test_step_or_split_survives_a_real_cuda_out_of_memory() -> None:
    """The caching allocator capped at 2 GiB: a batch whose activations need about 3 GiB runs out, and
    the same batch goes through in micro-batches, with the whole batch's loss."""
    import math

    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, 2 * 2**30 / total), 0)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(1024, 8192), nn.ReLU(), nn.Linear(8192, 10)).cuda()
        x = torch.randn(49152, 1024, device="cuda")  # 192 MiB; each 8192-wide activation is 1.5 GiB
        y = torch.randint(0, 10, (49152,), device="cuda")
        with torch.no_grad():
            want = nn.functional.cross_entropy(torch.cat([model(c) for c in x.split(4096)]), y).item()
        loss, k = step_or_split(model, torch.optim.SGD(model.parameters(), lr=0.0), nn.CrossEntropyLoss(), x, y)
        assert k >= 2 and math.isclose(loss, want, rel_tol=1e-4)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
