"""gpulab.data.pipelines: the calibrated baseline and tuned pipelines run and compare."""

from __future__ import annotations

import pytest
import torch

from gpulab.accel import SimAccelerator


def test_calibrated_pipelines_run_and_compare() -> None:
    from gpulab.data.pipelines import PipelineSetup, baseline_pipeline, calibrate, compare_pipelines, tuned_pipeline

    accel = SimAccelerator()
    setup = calibrate(accel, PipelineSetup(num_samples=96, batch_size=16, decode_repeats=2), batches=2)
    assert setup.compute_s == pytest.approx(max(0.002, setup.batch_cpu_s / 4))
    float_batch = 16 * 4 * 3 * 32 * 32
    assert float_batch / accel.h2d_bytes_per_s == pytest.approx(setup.compute_s / 6)
    base, tuned = baseline_pipeline(setup, accel), tuned_pipeline(setup, accel)
    images, labels = next(iter(tuned[0]))
    assert images.dtype == torch.uint8 and images.shape == (16, 3, 32, 32)
    assert next(iter(base[0]))[0].dtype == torch.float32
    cmp = compare_pipelines(base, tuned, accel, epochs=2, attempts=1, disable=True)
    assert cmp.baseline.num_steps == cmp.candidate.num_steps == 6 and cmp.throughput_ratio > 0
    with pytest.raises(ValueError, match="warm-up"):
        compare_pipelines(base, tuned, accel, epochs=1)
