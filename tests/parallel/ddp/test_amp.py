"""gpulab.parallel.ddp.amp: AMP on the CPU is bfloat16 without a grad scaler."""

from __future__ import annotations

import torch
from torch import nn

from gpulab.parallel import amp_settings, amp_step, make_grad_scaler

from .nets import Net, _data


def test_amp_on_cpu_is_bf16_without_a_scaler():
    s = amp_settings("cpu")
    assert s.dtype == torch.bfloat16 and not s.use_scaler
    assert amp_settings("cuda").dtype == torch.float16 and amp_settings("cuda").use_scaler
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
