"""gpulab.grading.lab02 (lab 02's graders): they pass correct code and fail each way of getting the
right-looking answer without doing the work (an echo that reads ahead or loads twice, a cache that
decodes lazily or freezes the augmentation, a pipeline that normalises on the host or not at all)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.data import Dataset

from gpulab.accel import SimAccelerator
from gpulab.data.caching import InMemoryCache
from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import PipelineSetup, model_step
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.transfer import to_device_normalize
from gpulab.data.workers import make_loader
from gpulab.grading import GradingError, lab02


class Echo:
    """A student's BatchEcho."""

    def __init__(self, loader, factor):
        self.loader, self.factor = loader, factor

    def __iter__(self):
        for batch in self.loader:
            for _ in range(self.factor):
                yield batch

    def __len__(self):
        return len(self.loader) * self.factor


class ReadsAhead(Echo):
    def __iter__(self):
        for batch in list(self.loader):  # the whole epoch in memory first
            for _ in range(self.factor):
                yield batch


class LoadsAgain(Echo):
    def __iter__(self):
        for _ in range(self.factor):
            yield from self.loader  # a, b, a, b: reloads instead of reusing


class SaysOne(Echo):
    def __len__(self):
        return len(self.loader)  # hides its factor


def test_check_echo_passes_a_real_echo_and_measures_its_factor() -> None:
    report = lab02.check_echo(Echo)
    assert report.loads == 2 * (3 + 4 + 2 + 0) and report.factor == pytest.approx(report.yields / report.loads)
    assert report.yields == 2 * (3 * 2 + 4 + 2 * 4)


@pytest.mark.parametrize("cls,match", [(ReadsAhead, "loaded before the first"), (LoadsAgain, "iterated the loader 2 times"),
                                       (SaysOne, "len")])
def test_check_echo_fails_echoes_that_do_not_echo(cls, match) -> None:
    with pytest.raises(GradingError, match=match):
        lab02.check_echo(cls)


def test_check_echo_refuses_the_reference() -> None:
    with pytest.raises(GradingError, match="reference"):
        lab02.check_echo(BatchEcho)
    lab02.check_echo(BatchEcho, forbidden=())  # and the reference itself passes


class Cache(Dataset):
    """A student's DecodedCache."""

    def __init__(self, dataset):
        self.dataset = dataset
        items = [dataset.load(i) for i in range(len(dataset))]
        self.images = torch.stack([img for img, _ in items])  # (N, C, H, W)
        self.labels = [label for _, label in items]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.dataset.transform(self.images[i]), self.labels[i]


class Lazy(Cache):
    def __init__(self, dataset):
        self.dataset, self.images, self.labels = dataset, {}, [int(y) for y in dataset.labels]

    def __getitem__(self, i):
        if i not in self.images:
            self.images[i] = self.dataset.load(i)[0]
        return self.dataset.transform(self.images[i]), self.labels[i]


class Frozen(Cache):
    def __init__(self, dataset):
        self.items = [dataset[i] for i in range(len(dataset))]  # augmented once, kept

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_check_cache_passes_a_decode_once_cache_with_forked_workers() -> None:
    lab02.check_cache(Cache, workers=2)


@pytest.mark.parametrize("cls,match", [(Lazy, "decoded 0 times"), (Frozen, "augmentations")])
def test_check_cache_fails_lazy_and_frozen_caches(cls, match) -> None:
    with pytest.raises(GradingError, match=match):
        lab02.check_cache(cls, workers=0)


def test_check_cache_refuses_the_reference() -> None:
    with pytest.raises(GradingError, match="InMemoryCache"):
        lab02.check_cache(lambda dataset: InMemoryCache(dataset, fill=True), workers=0)


SETUP = PipelineSetup(num_samples=64, batch_size=16, decode_repeats=1, compute_s=0.001)


def _pipeline(normalize: str):
    def make_pipeline(setup, accel):
        norm = (setup.mean, setup.std) if normalize == "host" else None
        loader = make_loader(Cache(SyntheticImages(setup.num_samples, seed=setup.seed, normalize=norm)),
                             batch_size=setup.batch_size)
        compute = model_step(accel, setup.compute_s)

        def step_fn(batch):
            images, targets = batch
            if normalize == "device":
                c = images.shape[1]
                m, s = torch.tensor(setup.mean).view(c, 1, 1), torch.tensor(setup.std).view(c, 1, 1)
                return compute(((images.float() / 255 - m) / s, targets))
            if normalize == "reference":
                return compute((to_device_normalize(images, setup.mean, setup.std, accel.torch_device), targets))
            return compute((images.float(), targets))  # "host" (already float) or "never"

        return loader, step_fn

    return make_pipeline


def test_probe_reads_what_crosses_and_what_the_model_gets() -> None:
    accel = SimAccelerator()
    good, _ = lab02.probe_pipeline(_pipeline("device"), SETUP, accel, read_epoch=True)
    assert (good.crossed_dtype, good.batch_shape, good.model_dtypes) == (torch.uint8, (16, 3, 32, 32), ["float32"])
    assert good.normalise_error < 1e-5 and good.log.floating_bytes == 0
    assert sorted(good.epoch_labels) == sorted(int(y) for y in SyntheticImages(64, seed=SETUP.seed).labels)
    host, _ = lab02.probe_pipeline(_pipeline("host"), SETUP, accel)
    assert host.crossed_dtype == torch.float32 and host.log.floating_bytes > 0 and host.normalise_error != host.normalise_error
    never, _ = lab02.probe_pipeline(_pipeline("never"), SETUP, accel)
    assert never.crossed_dtype == torch.uint8 and never.normalise_error > 1
    with pytest.raises(GradingError, match="reference"):
        lab02.probe_pipeline(_pipeline("reference"), SETUP, accel)


def test_check_pipeline_times_a_fresh_pipeline_beside_the_baseline() -> None:
    report = lab02.check_pipeline(_pipeline("device"), replace(SETUP, compute_s=0.002), SimAccelerator(), attempts=1,
                                  disable=True)
    c = report.comparison
    assert c.candidate.num_steps == c.baseline.num_steps == 2 * 4  # 3 epochs of 4 batches, the first is warm-up
    assert c.candidate_log.floating_bytes == 0 and c.candidate_echo == pytest.approx(1.0, abs=0.1)
    assert "crossed to the device: torch.uint8" in str(report)
