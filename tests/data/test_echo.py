"""gpulab.data.echo: BatchEcho repeats each batch exactly ``factor`` times; bad factors are refused."""

from __future__ import annotations

import pytest
import torch

from gpulab.data.loading import BatchEcho


def test_echo_repeats_each_batch_exactly() -> None:
    batches = [torch.full((2,), float(i)) for i in range(4)]
    echoed = list(BatchEcho(batches, 3))
    assert len(echoed) == 12 == len(BatchEcho(batches, 3))
    for i, b in enumerate(echoed):
        assert b is batches[i // 3]  # the same batch, not a look-alike
    assert list(BatchEcho(batches, 1)) == batches


@pytest.mark.parametrize("factor", [0, -2, 1.5, True, "2"])
def test_echo_factor_below_one_or_not_an_int(factor) -> None:
    with pytest.raises(ValueError, match="echo factor"):
        BatchEcho([1], factor)
