"""gpulab.data.transfer: the uint8 path equals the float path and moves a quarter of the bytes; bad
mean/std and float batches are refused with the fix; record_moves sees what crosses the link."""

from __future__ import annotations

import pytest
import torch

from gpulab.accel import SimAccelerator
from gpulab.data.loading import normalize_on_host, to_device_normalize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)




def test_uint8_path_equals_the_float_path() -> None:
    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    ref = (x.float() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    fast = to_device_normalize(x, MEAN, STD, "cpu")
    assert fast.dtype == torch.float32 and fast.shape == x.shape
    torch.testing.assert_close(fast, ref)
    torch.testing.assert_close(normalize_on_host(x, MEAN, STD), ref)
    half = to_device_normalize(x, torch.tensor(MEAN), torch.tensor(STD), torch.device("cpu"), dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), ref, rtol=1e-2, atol=2e-2)
    assert to_device_normalize(x, MEAN, STD, SimAccelerator()).device.type == "cpu"  # an accelerator works too
    assert x.dtype == torch.uint8 and x.max() > 1  # the input is left alone


def test_uint8_moves_a_quarter_of_the_bytes() -> None:
    x = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    assert x.numel() * x.element_size() * 4 == normalize_on_host(x, MEAN, STD).numel() * 4


@pytest.mark.parametrize("mean,std,match", [((0.5, 0.5), STD, "mean has shape"), (MEAN, [[0.2, 0.2, 0.2]] * 2, "std has shape"),
                                            (MEAN, (0.2, 0.0, 0.2), "positive")])
def test_mean_std_of_the_wrong_shape(mean, std, match) -> None:
    with pytest.raises(ValueError, match=match):
        to_device_normalize(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), mean, std, "cpu")


def test_a_float_batch_is_refused_with_the_fix() -> None:
    with pytest.raises(TypeError, match="send uint8"):
        to_device_normalize(torch.zeros(2, 3, 4, 4), MEAN, STD, "cpu")


@pytest.mark.gpu
def test_to_device_normalize_on_a_gpu() -> None:
    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8).pin_memory()
    out = to_device_normalize(x, MEAN, STD, "cuda")
    assert out.is_cuda
    torch.testing.assert_close(out.cpu(), normalize_on_host(x, MEAN, STD))


def test_record_moves_sees_what_crosses_the_link() -> None:
    from gpulab.data.transfer import record_moves

    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    _, moves = record_moves(to_device_normalize, x, MEAN, STD, "cpu")
    assert max(moves, key=lambda m: m[2])[:2] == (torch.uint8, None)  # the batch moved as uint8
    _, naive = record_moves(lambda: normalize_on_host(x, MEAN, STD).to("cpu", non_blocking=True))
    assert naive == [(torch.float32, None, x.numel())]
    assert record_moves(lambda: x.to(torch.float32))[1] == []  # a dtype change alone moves nothing


def test_only_the_uint8_batch_crosses_on_every_batch_after_the_first() -> None:
    """The scale and shift were copied from pageable host memory on every call: two blocking
    host-to-device copies per batch (issue 37, bug 8). Counted on the meta device, a stand-in GPU."""
    from torch.overrides import TorchFunctionMode

    from gpulab.data.transfer import record_moves, to_device_normalize

    class Creations(TorchFunctionMode):  # tensors made directly on a device: a host-to-device copy too
        def __init__(self):
            super().__init__()
            self.made = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in (torch.tensor, torch.as_tensor) and str(kwargs.get("device", "cpu")) != "cpu":
                self.made += 1
            return func(*args, **kwargs)

    batch = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    mean, std = (0.41, 0.5, 0.52), (0.2, 0.21, 0.23)
    to_device_normalize(batch, mean, std, "meta")  # the first batch may make them
    with Creations() as made:
        out, moves = record_moves(to_device_normalize, batch, mean, std, "meta")
    assert out.device.type == "meta" and out.dtype == torch.float32
    assert moves == [(torch.uint8, None, batch.numel())] and made.made == 0
    cpu = to_device_normalize(batch, mean, std, "cpu")
    want = (batch.float() / 255 - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    torch.testing.assert_close(cpu, want)
