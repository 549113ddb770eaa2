"""gpulab.parallel.amp: AMP on the CPU is bfloat16 without a grad scaler; float16 asks for one."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gpulab.parallel import amp_settings, amp_step, make_grad_scaler

from .ddp.nets import Net, _data


def test_amp_on_cpu_is_bf16_without_a_scaler():
    s = amp_settings("cpu")
    assert s.dtype == torch.bfloat16 and not s.use_scaler
    assert amp_settings("cuda", torch.float16).use_scaler and not amp_settings("cuda", torch.bfloat16).use_scaler
    model = Net()
    seen = []
    model.out.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    scaler = make_grad_scaler("cpu")
    assert not scaler.is_enabled()
    x, y = _data()
    losses = [amp_step(model, x, y, nn.functional.cross_entropy, opt, scaler, "cpu").item() for _ in range(5)]
    assert seen == [torch.bfloat16] * 5, "the forward must run under bf16 autocast"
    assert all(p.dtype == torch.float32 for p in model.parameters()), "weights stay float32"
    assert losses[-1] < losses[0]
    # same step by hand, without autocast: close to the bf16 result, not equal
    ref = Net()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.3)
    opt_ref.zero_grad()
    nn.functional.cross_entropy(ref(x), y).backward()
    opt_ref.step()
    again = Net()
    amp_step(again, x, y, nn.functional.cross_entropy, torch.optim.SGD(again.parameters(), lr=0.3), scaler, "cpu")
    torch.testing.assert_close(again.out.weight, ref.out.weight, atol=2e-2, rtol=0)


def test_float16_on_the_cpu_gets_an_enabled_scaler_and_bad_dtypes_are_named():
    s = amp_settings("cpu", torch.float16)
    assert s.dtype == torch.float16 and s.use_scaler
    assert make_grad_scaler("cpu", torch.float16).is_enabled()
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        amp_settings("cpu", torch.float32)


@pytest.mark.gpu
def test_cuda_default_follows_the_compute_capability():
    major = torch.cuda.get_device_properties(0).major
    s = amp_settings("cuda:0")
    assert s.dtype == (torch.bfloat16 if major >= 8 else torch.float16)
    assert s.use_scaler == (major < 8)
