"""gpulab.grading.lab02 (lab 02's graders): the observations of correct code equal the references'
(and the counts the exercises ask for), and each way of getting the right-looking answer without
doing the work (an echo that reads ahead or loads twice, a cache that decodes lazily or freezes the
augmentation, a normalisation on the host, a pipeline that echoes or skips it) is observed doing so."""

from __future__ import annotations

import copy
import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from gpulab.accel import SimAccelerator
from gpulab.autograde.box.mask import masked_names
from gpulab.data.caching import InMemoryCache
from gpulab.data.echo import BatchEcho
from gpulab.data.pipelines import PipelineSetup, model_step, tuned_pipeline
from gpulab.data.synthetic import SyntheticImages
from gpulab.data.transfer import normalize_on_host, to_device_normalize
from gpulab.data.workers import make_loader
from gpulab.evidence.codec import encode
from gpulab.grading import lab02
from gpulab.verdict.check import decode, verdict


def same(actual, expected) -> bool:
    """What the grader decides for check_equal (values encoded and decoded as evidence)."""
    return verdict({"kind": "equal", "what": "x"}, decode(encode(actual)), decode(encode(expected))) is None


def close(actual, expected, **tol) -> bool:
    """What the grader decides for check_close."""
    return verdict({"kind": "close", "what": "x", **tol}, decode(encode(actual)), decode(encode(expected))) is None


def test_the_references_are_the_exercises_answers() -> None:
    assert masked_names(lab02.REFERENCES) == [
        "gpulab.data.transfer.to_device_normalize",
        "gpulab.data.transfer.normalize_on_host",
        "gpulab.data.caching.InMemoryCache",
        "gpulab.data.echo.BatchEcho",
        "gpulab.data.pipelines.tuned_pipeline",
        "gpulab.data.worker_sweep.sweep_workers",
        "gpulab.data.worker_sweep.pick_workers",
    ]


def test_outcome_sends_the_answer_or_the_error() -> None:
    assert lab02.outcome(max, 1, 2) == 2
    assert lab02.outcome(int, "x") == "raises ValueError"
    assert lab02.outcome(json.loads, "{") == "raises ValueError"  # a subclass counts as ValueError
    assert lab02.outcome(len, 5) == "raises TypeError"
    assert lab02.outcome(lambda: 1 / 0) == "raises ZeroDivisionError"


# --- BatchEcho ------------------------------------------------------------------------------------


class Echo:
    """A student's BatchEcho."""

    def __init__(self, loader, factor):
        if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
            raise ValueError(f"bad factor {factor!r}")
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


class Copies(Echo):
    def __iter__(self):
        for batch in self.loader:
            for _ in range(self.factor):
                yield copy.deepcopy(batch)  # equal values, but not the batch that was loaded


class SaysOne(Echo):
    def __len__(self):
        return len(self.loader)  # hides its factor


class Unchecked(Echo):
    def __init__(self, loader, factor):
        if factor < 1:  # True and 1.5 pass, "2" raises TypeError
            raise ValueError(f"bad factor {factor!r}")
        self.loader, self.factor = loader, factor


def expected_echo(cases, epochs):
    """What the exercise asks for: one pass per epoch, one load before the first yield, each batch factor times."""
    return {
        f"{n} batches, factor {f}": {
            "len": n * f,
            **{
                f"epoch {e}": {
                    "passes over the loader so far": e,
                    "loads before the first yield": min(n, 1),
                    "which loaded batch each yield is": [i for i in range(n) for _ in range(f)],
                }
                for e in range(1, epochs + 1)
            },
        }
        for n, f in cases
    }


def test_echo_cases_are_random_with_an_empty_loader_and_a_factor_of_one() -> None:
    for seed in range(5):
        cases = lab02.echo_cases(random.Random(seed), 6)
        assert len(cases) == 6 and cases == lab02.echo_cases(random.Random(seed), 6)
        assert any(n == 0 for n, _ in cases) and any(n > 0 and f == 1 for n, f in cases)
    assert lab02.echo_cases(random.Random(0)) != lab02.echo_cases(random.Random(1))


@pytest.mark.parametrize("seed", range(3))
def test_observe_echo_sees_the_counts_the_exercise_asks_for(seed) -> None:
    cases = [(3, 2), (4, 1), (2, 4), (0, 3), *lab02.echo_cases(random.Random(seed))]
    want = lab02.observe_echo(BatchEcho, cases, epochs=3)
    assert want == expected_echo(cases, 3)
    assert same(lab02.observe_echo(Echo, cases, epochs=3), want)


@pytest.mark.parametrize(
    "cls,where,wrong",
    [
        (ReadsAhead, "loads before the first yield", 3),
        (LoadsAgain, "passes over the loader so far", 2),
        (LoadsAgain, "which loaded batch each yield is", [0, 1, 2, 3, 4, 5]),
        (Copies, "which loaded batch each yield is", [-1] * 6),
    ],
)
def test_observe_echo_sees_echoes_that_do_not_echo(cls, where, wrong) -> None:
    cases = [(3, 2), (0, 3)]
    got, want = lab02.observe_echo(cls, cases), lab02.observe_echo(BatchEcho, cases)
    assert got["3 batches, factor 2"]["epoch 1"][where] == wrong
    assert not same(got, want)


def test_observe_echo_sees_a_wrong_len_and_sends_what_raised() -> None:
    got = lab02.observe_echo(SaysOne, [(3, 2)])["3 batches, factor 2"]
    assert got["len"] == 3 and got["epoch 1"] == expected_echo([(3, 2)], 1)["3 batches, factor 2"]["epoch 1"]

    def broken(loader, factor):
        raise RuntimeError("not written yet")

    assert lab02.observe_echo(broken, [(2, 2)]) == {"2 batches, factor 2": {"raised": "RuntimeError: not written yet"}}


def test_observe_echo_loader_sees_each_real_batch_factor_times_in_a_row() -> None:
    n, batch, factor, seed = 30, 8, 3, 11
    want = lab02.observe_echo_loader(BatchEcho, n, batch, factor, seed)
    labels = [int(y) for y in SyntheticImages(n, seed=seed).labels]
    runs = [labels[i : i + batch] for i in range(0, n, batch)]
    for epoch in ("epoch 1", "epoch 2"):
        assert want[epoch] == {
            "yields": 4 * factor,
            "each batch factor times in a row": True,
            "labels": [y for run in runs for _ in range(factor) for y in run],
        }
    assert same(lab02.observe_echo_loader(Echo, n, batch, factor, seed), want)
    again = lab02.observe_echo_loader(LoadsAgain, n, batch, factor, seed)
    assert not again["epoch 1"]["each batch factor times in a row"] and not same(again, want)
    assert not same(lab02.observe_echo_loader(Copies, n, batch, factor, seed), want)


def test_bad_factors_tell_a_full_check_from_a_partial_one() -> None:
    bad = (0, -1, 1.5, True, "2")
    want = lab02.bad_factors(BatchEcho, bad)
    assert want == {repr(f): "raises ValueError" for f in bad}
    assert same(lab02.bad_factors(Echo, bad), want)
    assert lab02.bad_factors(Unchecked, bad) == {
        "0": "raises ValueError",
        "-1": "raises ValueError",
        "1.5": "accepted",
        "True": "accepted",
        "'2'": "raises TypeError",
    }


# --- DecodedCache ---------------------------------------------------------------------------------


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


def test_observe_cache_sees_one_decode_per_sample_and_an_augmentation_per_read() -> None:
    n, seed, reads = 24, 5, (0, 7, 23)
    want = lab02.observe_cache(lab02.reference_cache, n, seed, reads=reads, workers=2)
    ds = SyntheticImages(n, seed=seed)
    images = []
    for i in reads:
        random.seed(f"{seed}:{i}")
        images.append(ds[i][0])
    plain = SyntheticImages(n, augment=False, seed=seed + 1)
    assert {k: v for k, v in want.items() if not isinstance(v, (torch.Tensor, dict))} == {
        "indices decoded while built": list(range(n)),
        "len": n,
        "labels read": [int(y) for y in ds.labels],
        "decodes while reading every sample": 0,
        "augmentations while reading every sample": n,
    }
    assert torch.equal(want["images read (fixed random states)"], torch.stack(images))
    assert torch.equal(want["read by 2 forked workers"]["images"], torch.stack([plain[i][0] for i in range(n)]))
    assert want["read by 2 forked workers"]["labels"] == [int(y) for y in plain.labels]
    assert same(lab02.observe_cache(Cache, n, seed, reads=reads, workers=2), want)


def test_observe_cache_sees_a_lazy_and_a_frozen_cache() -> None:
    n, seed, reads = 24, 5, (0, 7, 23)
    want = lab02.observe_cache(lab02.reference_cache, n, seed, reads=reads)
    lazy = lab02.observe_cache(Lazy, n, seed, reads=reads)
    assert lazy["indices decoded while built"] == [] and lazy["decodes while reading every sample"] == n
    assert not same(lazy, want)
    frozen = lab02.observe_cache(Frozen, n, seed, reads=reads)
    assert frozen["indices decoded while built"] == list(range(n)) and frozen["decodes while reading every sample"] == 0
    assert frozen["augmentations while reading every sample"] == 0
    assert not torch.equal(frozen["images read (fixed random states)"], want["images read (fixed random states)"])
    assert not same(frozen, want)
    assert lab02.reference_cache(SyntheticImages(4)).filled == 4  # filled up front, as the exercise asks


# --- to_device_normalize --------------------------------------------------------------------------


def normalize(x, mean, std, device, dtype=torch.float32):
    """A student's to_device_normalize."""
    c = x.shape[-3]
    m, s = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)
    if m.numel() != c or s.numel() != c:
        raise ValueError(f"{c} channels")
    x = x.to(device)
    return ((x.float() / 255 - m.to(device).view(c, 1, 1)) / s.to(device).view(c, 1, 1)).to(dtype)


def on_host(x, mean, std, device, dtype=torch.float32):
    return normalize_on_host(x, mean, std).to(device, dtype)  # 4 bytes a value cross


def float32_only(x, mean, std, device, dtype=torch.float32):
    return normalize(x, mean, std, device)  # ignores dtype


def unchecked(x, mean, std, device, dtype=torch.float32):
    m, s = torch.as_tensor(mean).view(-1, 1, 1), torch.as_tensor(std).view(-1, 1, 1)  # broadcasting fails instead
    return ((x.to(device).float() / 255 - m) / s).to(dtype)


@pytest.mark.parametrize("seed", range(3))
def test_observe_normalize_sees_the_values_and_the_dtype_that_crossed(seed) -> None:
    cases = lab02.normalize_cases(random.Random(seed))
    assert len(cases) == 8 and all(x.dtype == torch.uint8 for x, _, _ in cases.values())
    want = lab02.observe_normalize(to_device_normalize, cases)
    assert want["3 channels, 2 means"] == want["3 channels, 4 stds"] == "raises ValueError"
    for name, (x, m, s) in cases.items():
        if not isinstance(want[name], str):
            assert want[name]["crossed as"] == "uint8"
            torch.testing.assert_close(want[name]["values"], normalize_on_host(x, m, s))
    assert close(lab02.observe_normalize(normalize, cases), want)
    host = lab02.observe_normalize(on_host, cases)
    assert {v["crossed as"] for v in host.values() if not isinstance(v, str)} == {"float32"} and not close(host, want)
    wrong = lab02.observe_normalize(unchecked, cases)
    assert wrong["3 channels, 2 means"] == "raises RuntimeError" and not close(wrong, want)


def test_observe_normalize_sees_the_dtype_asked_for() -> None:
    cases = lab02.normalize_cases(random.Random(0))
    want = lab02.observe_normalize(to_device_normalize, cases, torch.float16)
    assert all(
        v["values"].dtype == torch.float16 and v["crossed as"] == "uint8"
        for v in want.values()
        if not isinstance(v, str)
    )
    assert close(lab02.observe_normalize(normalize, cases, torch.float16), want, rtol=1e-2, atol=1e-2)
    assert not close(lab02.observe_normalize(float32_only, cases, torch.float16), want, rtol=1e-2, atol=1e-2)
    host = lab02.observe_normalize(on_host, cases, torch.float16)
    assert {v["crossed as"] for v in host.values() if not isinstance(v, str)} == {"float16"}
    x = torch.zeros((1, 3, 2, 2), dtype=torch.uint8)
    assert lab02.observe_normalize(lambda *a, **k: None, {"c": (x, [0.5] * 3, [0.2] * 3)}) == {
        "c": {"values": None, "crossed as": "nothing crossed"}
    }


# --- make_pipeline --------------------------------------------------------------------------------


def test_canonical_digests_ignore_crops_and_flips_but_not_the_image() -> None:
    ds = SyntheticImages(8, seed=4)
    decoded = torch.stack([ds.load(i)[0] for i in range(8)]).numpy()
    want = lab02.canonical_digests(decoded)
    assert want.dtype == np.uint64 and len(set(want.tolist())) == 8
    random.seed(0)
    for _ in range(10):
        augmented = torch.stack([ds[i][0] for i in range(8)]).numpy()
        assert not np.array_equal(augmented, decoded)
        assert np.array_equal(lab02.canonical_digests(augmented), want)
    changed = decoded.copy()
    changed[3, 0, 16, 16] ^= 1  # one central pixel
    assert (lab02.canonical_digests(changed) != want).tolist() == [i == 3 for i in range(8)]
    assert lab02.canonical_digests(decoded[:0]).shape == (0,)
    assert not lab02.canonical_digests(decoded[:, :, :8, :8]).any()  # too small for the padding: zeros


SETUP = PipelineSetup(num_samples=64, batch_size=16, decode_repeats=1, compute_s=0.001, seed=3)


def _pipeline(normalize: str = "device", cache=Cache, echo: int = 1, seed: int | None = None):
    """A student's make_pipeline, or one of the ways of getting it wrong."""

    def make_pipeline(setup, accel):
        norm = (setup.mean, setup.std) if normalize == "host" else None
        images = SyntheticImages(setup.num_samples, seed=setup.seed if seed is None else seed, normalize=norm)
        loader = make_loader(cache(images), batch_size=setup.batch_size)
        loader = BatchEcho(loader, echo) if echo > 1 else loader
        compute = model_step(accel, setup.compute_s)

        def step_fn(batch):
            images, targets = batch
            if normalize == "device":
                c = images.shape[1]
                m, s = torch.tensor(setup.mean).view(c, 1, 1), torch.tensor(setup.std).view(c, 1, 1)
                return compute(((images.float() / 255 - m) / s, targets))
            return compute((images.float(), targets))  # "host" (already float) or "never"

        return loader, step_fn

    return make_pipeline


@pytest.fixture(scope="module")
def reference_probe():
    return lab02.probe_pipeline(tuned_pipeline, SETUP, SimAccelerator())


def test_probe_pipeline_reads_what_crosses_and_what_the_model_gets(reference_probe) -> None:
    want = reference_probe
    labels = np.bincount(SyntheticImages(64, seed=SETUP.seed).labels, minlength=11).tolist()
    for epoch in ("epoch 1", "epoch 2"):
        assert {k: v for k, v in want[epoch].items() if k != "digest of those images"} == {
            "images the model received": 64,
            "labels that crossed (count per class)": labels,
            "dtype of the images that crossed": ["uint8"],
            "dtype the model received": ["float32"],
            "most images the same bytes as in the run before": False,
        }
    assert want["len(loader)"] == 4 and want["shape of the first image batch that crossed"] == (16, 3, 32, 32)
    assert want["epoch 1"]["digest of those images"] != want["epoch 2"]["digest of those images"]  # keyed by the run
    assert same(lab02.probe_pipeline(_pipeline(), SETUP, SimAccelerator()), want)
    assert same(
        lab02.probe_pipeline(
            _pipeline(cache=lambda ds: InMemoryCache(ds, fill=True, disable=True)), SETUP, SimAccelerator()
        ),
        want,
    )


@pytest.mark.parametrize(
    "kind,field,wrong",
    [
        (dict(normalize="host"), "dtype of the images that crossed", ["float32"]),
        (dict(normalize="never"), "digest of those images", None),
        (dict(echo=2), "images the model received", 128),
        (dict(seed=0), "labels that crossed (count per class)", None),
        (dict(cache=Frozen), "most images the same bytes as in the run before", True),
    ],
)
def test_probe_pipeline_sees_pipelines_that_skip_the_work(reference_probe, kind, field, wrong) -> None:
    got = lab02.probe_pipeline(_pipeline(**kind), SETUP, SimAccelerator())
    want = reference_probe
    assert got["epoch 2"][field] != want["epoch 2"][field]
    assert wrong is None or got["epoch 2"][field] == wrong
    assert not same(got, want)


def test_probe_pipeline_names_a_pipeline_that_is_not_a_pair() -> None:
    got = lab02.probe_pipeline(lambda setup, accel: [1, 2], SETUP, SimAccelerator())
    assert got == {"make_pipeline returned": "list, not a tuple (loader, step_fn)"}


def test_timed_setup_draws_a_workload_and_sets_the_simulated_link() -> None:
    accel = SimAccelerator()
    setup = lab02.timed_setup(random.Random(0), accel, compute_s=0.01, batch_size=16)
    again = lab02.timed_setup(random.Random(0), SimAccelerator(), compute_s=0.01, batch_size=16)
    assert (setup.num_samples, setup.seed) == (again.num_samples, again.seed)
    assert 20 <= setup.steps_per_epoch <= 28 and setup.num_samples == 16 * setup.steps_per_epoch
    short = lab02.timed_setup(random.Random(0), SimAccelerator(), compute_s=0.01, batch_size=16, steps=(6, 6))
    assert short.steps_per_epoch == 6
    assert setup.compute_s == 0.01 and 1 <= setup.decode_repeats <= 1024 and setup.batch_cpu_s > 0
    assert accel.h2d_bytes_per_s == pytest.approx(16 * 4 * 3 * 32 * 32 / (0.01 / 6))


# --- the num_workers sweep ------------------------------------------------------------------------


def _sweep_without_persistence(dataset, counts, *, batch_size, num_batches, epochs=2):
    out = {}
    for k in counts:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=k)  # new workers every epoch
        seen = 0
        for _ in range(epochs):
            for i, (x, _) in enumerate(loader):
                seen += len(x)
                if i + 1 == num_batches:
                    break
        out[k] = float(seen)
    return out


def test_the_reference_sweep_is_observed_reading_through_persistent_workers() -> None:
    from gpulab.data.worker_sweep import sweep_workers

    got = lab02.observe_sweep(sweep_workers, [0, 1, 3])
    assert [v["worker processes that read"] for v in got.values()] == [0, 1, 3]
    assert [v["read in the main process"] for v in got.values()] == [True, False, False]
    assert all(
        v["returned"] == [k] and v["rate a positive number"] and v["read at least 24 samples"]
        for k, v in zip([0, 1, 3], got.values())
    )


def test_a_sweep_that_restarts_its_workers_or_reads_nothing_is_observed_doing_so() -> None:
    from gpulab.data.worker_sweep import sweep_workers

    want = lab02.observe_sweep(sweep_workers, [0, 2])
    restarts = lab02.observe_sweep(_sweep_without_persistence, [0, 2])
    assert restarts["num_workers=2"]["worker processes that read"] == 4 and not same(restarts, want)
    forged = lab02.observe_sweep(lambda ds, counts, **kw: {k: 1000.0 for k in counts}, [0, 2])
    assert not forged["num_workers=0"]["read at least 24 samples"] and not same(forged, want)
    assert lab02.observe_sweep(lambda ds, counts, **kw: [1.0], [0])["num_workers=0"]["returned"] == "a list"
    raises = lab02.observe_sweep(lambda ds, counts, **kw: 1 / 0, [0])
    assert raises["num_workers=0"]["returned"] == "raises ZeroDivisionError"


@pytest.mark.parametrize("seed", range(6))
def test_pick_cases_tell_the_fewest_workers_from_the_fastest_and_from_the_first(seed) -> None:
    from gpulab.data.worker_sweep import pick_workers

    cases = lab02.pick_cases(random.Random(seed))
    want = [pick_workers(r, s) for r, s in cases]
    assert want == [min(k for k in r if r[k] >= (1 - s) * max(r.values())) for r, s in cases]
    fastest = [max(r, key=r.get) for r, _ in cases]
    first = [next(k for k in r if r[k] >= (1 - s) * max(r.values())) for r, s in cases]
    assert fastest != want and first != want


def test_pick_workers_refuses_what_it_cannot_choose_from() -> None:
    from gpulab.data.worker_sweep import pick_workers

    for rates, slack in (({}, 0.05), ({0: 1.0}, 1.0), ({0: 1.0}, -0.1)):
        assert lab02.outcome(pick_workers, rates, slack=slack) == "raises ValueError"


def test_on_a_gpu_the_recorder_reads_the_model_inputs_back_without_waiting_for_the_queue() -> None:
    """The graded pipeline's recorder digests every image the model received. On a GPU, reading
    them back with ``.cpu()`` at each step waits for the device's queue, so the host can never run
    ahead: on an H200 every pipeline, gpulab's too, measured 0.71x of the device's own time and
    lab 02's source notebook failed its graded check. Its copies must be queued, and digested once
    they have landed, with the same result as on a CPU."""
    from fake_cuda import FakeCuda

    from gpulab.accel.base import Accelerator

    setup = PipelineSetup(num_samples=48, batch_size=16, decode_repeats=1, compute_s=0.001, seed=3)
    batches = [torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8) for _ in range(3)]

    def feed(rec, device):
        rec.begin_run(5)
        for images in batches:
            rec.compute(0.05, to_device_normalize(images, setup.mean, setup.std, device))
        return rec

    on_cpu = feed(lab02.PipelineRecorder(SimAccelerator(), setup), "cpu").end_run()
    with FakeCuda(num_gpus=1) as fake:

        class Queue(Accelerator):  # a GPU whose model step is queued work
            kind = "cuda"

            def compute(self, seconds, inputs=None):
                fake.launch(seconds)

            def synchronize(self):
                torch.cuda.synchronize()

        rec = feed(lab02.PipelineRecorder(Queue(), setup), "cuda")
        assert fake.syncs == [], "a step waited for the GPU's queue"
        rec.synchronize()
        on_gpu = rec.end_run()
    assert on_gpu == on_cpu and on_gpu["images the model received"] == 48


NO_CACHE = """def make_pipeline(setup, accel):
    dataset = SyntheticImages(setup.num_samples, decode_repeats=setup.decode_repeats, seed=setup.seed)  # uint8
    loader = make_loader(dataset, batch_size=setup.batch_size)
    compute = model_step(accel, setup.compute_s)

    def step_fn(batch):
        images, targets = batch
        return compute((to_device_normalize(images, setup.mean, setup.std, accel.torch_device), targets))

    return loader, step_fn
"""


def test_the_grader_times_epochs_and_fails_a_pipeline_that_decodes_on_every_read() -> None:
    """tests/cellgrade.py, as make grade judges: the model answer keeps the device 90 % busy over the
    grader's timed epochs (modelled device time); one without the cache (uint8, normalised on the
    device, every check but the time passes) takes several times the device's work and fails."""
    from cellgrade import grade_cells

    got = grade_cells(
        "02_pipeline",
        {"source": {}, "no_cache": {"make_pipeline_impl": NO_CACHE}},
        tests=["fastest_pipeline"],
        prelude=["c001"],
    )
    assert got["source"]["fastest_pipeline"].passed, got["source"]["fastest_pipeline"]
    slow = got["no_cache"]["fastest_pipeline"]
    assert not slow.passed and "the device was idle more than a tenth of the epoch" in slow.message, slow
