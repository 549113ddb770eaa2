"""gpulab.data.loading: uint8 transfer, caching, echoing, loader building, sweeping and tuning."""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace

import matplotlib
import pytest
import torch
from torch.utils.data import Dataset, get_worker_info

from gpulab.accel import SimAccelerator
from gpulab.data import caching
from gpulab.data.loading import (
    BatchEcho,
    InMemoryCache,
    LoaderConfig,
    LoaderWarning,
    make_loader,
    measure_loader,
    normalize_on_host,
    sweep_loader,
    to_device_normalize,
    tune_loader,
)
from gpulab.data.synthetic import SyntheticImages

matplotlib.use("Agg")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
CORES = os.cpu_count() or 1


# --- uint8 transfer ----------------------------------------------------------------------------

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


# --- echo --------------------------------------------------------------------------------------

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


# --- cache -------------------------------------------------------------------------------------

def test_cache_decodes_once_and_still_augments(monkeypatch) -> None:
    ds = SyntheticImages(8)
    loads = []
    real = ds.load
    monkeypatch.setattr(ds, "load", lambda i: loads.append(i) or real(i))
    cache = InMemoryCache(ds)
    img, label = cache[5]
    img2, _ = cache[5]
    assert loads.count(5) == 1 and cache.hits == 1 and cache.misses == 1
    assert label == real(5)[1]
    crops = {tuple(cache[5][0].flatten()[:64].tolist()) for _ in range(20)}
    assert len(crops) > 1, "the augmentation must run on every access, not be cached"
    ds.augment = False
    torch.testing.assert_close(cache[3][0], real(3)[0])


def test_cache_fill_and_a_plain_dataset() -> None:
    cache = InMemoryCache(SyntheticImages(6), fill=True, disable=True)
    assert cache.filled == 6 and cache.nbytes == 6 * 3 * 32 * 32
    plain = InMemoryCache([(torch.ones(2) * i, i) for i in range(3)], fill=True, disable=True)
    assert not plain.split and plain.filled == 3 and plain[2][1] == 2


def test_cache_that_does_not_fit_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(caching.psutil, "virtual_memory", lambda: SimpleNamespace(available=1000))
    with pytest.raises(MemoryError, match="GiB are free"):
        InMemoryCache(SyntheticImages(8))


# --- workers -----------------------------------------------------------------------------------

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


# --- sweep and tune ----------------------------------------------------------------------------

COST_MODELS = {
    # samples/s as a function of the setting: a peak, a plateau, "more is better", "workers hurt"
    "peak_at_6": lambda c: 100 + 120 * min(c.num_workers, 6) - 30 * max(0, c.num_workers - 6),
    "plateau_after_4": lambda c: 100 + 200 * min(c.num_workers, 4) + c.num_workers,
    "monotonic": lambda c: 50 + 10 * c.num_workers,
    "workers_hurt": lambda c: 1000 - 50 * c.num_workers,
    "persistent_pays": lambda c: 100 + 100 * min(c.num_workers, 3) + 150 * c.persistent_workers,
}


@pytest.mark.parametrize("name", list(COST_MODELS))
def test_tune_finds_the_sweeps_best_within_5_percent_with_few_trials(name) -> None:
    model = COST_MODELS[name]
    sweep = sweep_loader(None, num_workers=range(17), persistent_workers=(False, True), measure=model, disable=True)
    tuned = tune_loader(measure=model, max_workers=16, epochs=2, disable=True)
    assert tuned.samples_per_s >= 0.95 * sweep.best_samples_per_s, (str(tuned), sweep.best)
    assert len(tuned.trials) <= 12 < len(sweep.rows)


def test_sweep_table_plot_and_a_real_run() -> None:
    ds = SyntheticImages(32)
    res = sweep_loader(ds, num_workers=(0, 1), batch_size=(8,), num_batches=2, disable=True)
    assert len(res.rows) == 2 and all(r["samples_per_s"] > 0 for r in res.rows)
    assert res.best.num_workers in (0, 1) and "samples_per_s" in res.table()
    assert res.plot().axes[0].lines


def test_tune_needs_a_dataset_or_a_measure() -> None:
    with pytest.raises(ValueError, match="measure="):
        tune_loader()


# --- the lab's reference pipelines -------------------------------------------------------------

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


def test_record_moves_sees_what_crosses_the_link() -> None:
    from gpulab.data.transfer import record_moves

    x = torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    _, moves = record_moves(to_device_normalize, x, MEAN, STD, "cpu")
    assert max(moves, key=lambda m: m[2])[:2] == (torch.uint8, None)  # the batch moved as uint8
    _, naive = record_moves(lambda: normalize_on_host(x, MEAN, STD).to("cpu", non_blocking=True))
    assert naive == [(torch.float32, None, x.numel())]
    assert record_moves(lambda: x.to(torch.float32))[1] == []  # a dtype change alone moves nothing
