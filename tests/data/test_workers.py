"""gpulab.data.workers: persistent workers across epochs, warnings with their reason, the loader config
and its measurement."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from gpulab.data.loading import LoaderConfig, LoaderWarning, make_loader, measure_loader, sweep_loader
from gpulab.data.synthetic import SyntheticImages

CORES = os.cpu_count() or 1


class WhoLoads(Dataset):
    """Returns the pid of the process that loaded each sample."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return os.getpid() if get_worker_info() else -1


def test_persistent_workers_survive_several_epochs() -> None:
    loader = make_loader(WhoLoads(), num_workers=2, persistent_workers=True, batch_size=2, shuffle=False)
    pids = [set(torch.cat(list(loader)).tolist()) for _ in range(3)]
    assert len(pids[0]) == 2 and os.getpid() not in pids[0] and pids[0] == pids[1] == pids[2]
    fresh = make_loader(WhoLoads(), num_workers=2, persistent_workers=False, batch_size=2, shuffle=False)
    first, second = (set(torch.cat(list(fresh)).tolist()) for _ in range(2))
    assert first.isdisjoint(second), "without persistent_workers each epoch starts new workers"


def test_too_many_workers_warns_with_the_reason() -> None:
    with pytest.warns(LoaderWarning, match=f"this machine has {CORES} cores"):
        make_loader(WhoLoads(), num_workers=CORES + 1)


def test_pin_memory_without_a_gpu_does_not_flood_warnings() -> None:
    if torch.cuda.is_available():
        pytest.skip("pins for real on a GPU")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = make_loader(SyntheticImages(16), num_workers=0, pin_memory=True, batch_size=4)
        for _ in range(3):  # epochs: torch would warn at every one
            list(loader)
        sweep_loader(SyntheticImages(16), num_workers=(0, 1), pin_memory=(False, True), batch_size=(4,),
                     num_batches=2, disable=True)
    pins = [w for w in caught if "pin_memory" in str(w.message)]
    assert len(pins) == 2, [str(w.message) for w in pins]  # one for make_loader, one for the sweep


def test_loader_config_and_measure() -> None:
    with pytest.raises(ValueError, match="num_workers"):
        LoaderConfig(num_workers=-1)
    assert LoaderConfig(0, persistent_workers=True, prefetch_factor=4).effective() == LoaderConfig(0)
    m = measure_loader(make_loader(SyntheticImages(20), batch_size=4), epochs=2)
    assert m["samples"] == 40 and len(m["startup_s"]) == 2 and m["samples_per_s"] > 0


def test_a_consumer_step_caps_the_measured_rate() -> None:
    """With step_s, the main process holds each batch that long: no setting can beat batch / step_s."""
    data = list(range(40))
    loader = make_loader(data, batch_size=8, shuffle=False)
    stats = measure_loader(loader, step_s=0.01)
    assert stats["samples"] == 40 and stats["samples_per_s"] <= 8 / 0.01
    sweep = sweep_loader(data, num_workers=(0,), batch_size=(8,), step_s=0.01, count_startup=False, disable=True)
    assert 0 < sweep.best_samples_per_s <= 8 / 0.01
    with pytest.raises(ValueError, match="step_s"):
        measure_loader(loader, step_s=-1)
