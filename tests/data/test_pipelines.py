"""gpulab.data.pipelines: the calibrated baseline and tuned pipelines run and compare; fresh samples
are counted from what crosses, whatever the loader says about itself."""

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


def test_an_echo_is_measured_not_read_from_the_loader() -> None:
    from gpulab.data.loading import BatchEcho
    from gpulab.data.pipelines import PipelineSetup, baseline_pipeline, calibrate, compare_pipelines, tuned_pipeline

    accel = SimAccelerator()
    setup = calibrate(accel, PipelineSetup(num_samples=64, batch_size=16, decode_repeats=1), batches=2)
    loader, step = tuned_pipeline(setup, accel)

    class QuietEcho(BatchEcho):
        factor = 1  # what it says about itself

        def __init__(self, loader):
            self.loader = loader

        def __iter__(self):
            for batch in self.loader:
                yield batch
                yield batch

        def __len__(self):
            return 2 * len(self.loader)

    cmp = compare_pipelines(baseline_pipeline(setup, accel), (QuietEcho(loader), step), accel, epochs=2, attempts=1,
                            disable=True)
    assert cmp.candidate_echo == pytest.approx(2.0, abs=0.05) and cmp.baseline_echo == pytest.approx(1.0, abs=0.05)
    assert cmp.candidate_fresh == pytest.approx(cmp.candidate.throughput / cmp.candidate_echo)
    assert cmp.candidate_log.bytes_by_dtype["uint8"] > 0 and cmp.candidate_log.floating_bytes == 0
    assert cmp.baseline_log.floating_bytes > 0  # the baseline copies float32
    assert "copied 2.0" in str(cmp)
