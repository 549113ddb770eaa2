"""gpulab.accel.pick: device strings become accelerators, unknown ones are refused with the reason."""

from __future__ import annotations

import pytest
import torch

from gpulab.accel import as_accelerator
from gpulab.accel.cuda import CudaAccelerator


def test_device_strings() -> None:
    assert as_accelerator("sim").kind == "simulated"
    assert as_accelerator(torch.device("cpu")).kind == "host"
    with pytest.raises(ValueError, match="unknown accelerator"):
        as_accelerator("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            CudaAccelerator("cuda:0")
