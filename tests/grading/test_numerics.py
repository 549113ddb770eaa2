"""gpulab.grading.numerics: graded runs compute in IEEE float32 with deterministic cuDNN, then the
process's settings come back; lab 08's epoch and evaluation cases run inside it."""

from __future__ import annotations

import pytest
import torch

from gpulab.grading import lab08
from gpulab.grading.numerics import exact_float32


def _settings() -> tuple[bool, bool, bool, bool]:
    b = torch.backends
    return b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark


def test_inside_the_block_no_tf32_and_deterministic_cudnn_then_the_settings_come_back() -> None:
    b = torch.backends
    saved = _settings()
    try:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark = True, True, False, True
        with pytest.raises(KeyError), exact_float32():
            assert _settings() == (False, False, True, False)
            raise KeyError("a student's error")  # the settings come back on an error too
        assert _settings() == (True, True, False, True)
    finally:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32, b.cudnn.deterministic, b.cudnn.benchmark = saved


def test_lab08_runs_the_students_epoch_and_evaluation_exactly() -> None:
    seen = []

    def train_epoch(model, opt, loss_fn, batches):
        seen.append(_settings())
        return lab08.train_epoch(model, opt, loss_fn, batches)

    def evaluate(model, loss_fn, batches):
        seen.append(_settings())
        return lab08.evaluate(model, loss_fn, batches)

    lab08.epoch_case(train_epoch, seed=1, steps=2)
    lab08.eval_case(evaluate, seed=1, steps=2)
    assert seen == [(False, False, True, False)] * 3
