"""gpulab.grading.lab03 (lab 03's graders): the solutions' values equal the references' on random
inputs, and the ways of getting the right-looking answer without doing the work (a constant chunk
shape, a plain shuffle for a chunk-aware one, reads skipped, a file left open) give other values.
The measured checks count the bytes HDF5 reads from the file (``measure.count``, ``read_chars``):
the solutions stay under the bars the test cells state, and chunks too big for shuffled reads or an
order that leaves its chunks do not."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, Sampler

from gpulab.autograde.box.mask import masked_names, write_masks
from gpulab.data.hdf5 import H5Dataset, make_images, write_h5
from gpulab.evidence.codec import encode
from gpulab.grading import lab03
from gpulab.grading.measured import measure_here
from gpulab.verdict.check import decode, verdict
from gpulab.verdict.rules import judge

MiB = 1 << 20


def same(actual, expected) -> bool:
    """What the grader decides for check_equal (values encoded and decoded as evidence)."""
    return verdict({"kind": "equal", "what": "x"}, decode(encode(actual)), decode(encode(expected))) is None


def choose_storage(num_samples, sample_shape, dtype):
    """The lab's solution."""
    sample_nbytes = int(np.prod(sample_shape)) * np.dtype(dtype).itemsize
    rows = min(num_samples, max(1, -(-10 * 1024 // sample_nbytes)))
    chunk_nbytes = rows * sample_nbytes
    in_cache = max(1, (4 * MiB) // chunk_nbytes)
    nslots = 100 * in_cache + 1
    while any(nslots % d == 0 for d in range(2, int(nslots**0.5) + 1)):
        nslots += 1
    return {"chunks": (rows, *sample_shape), "rdcc_nbytes": int(in_cache * chunk_nbytes), "rdcc_nslots": nslots}


class ChunkShuffle(Sampler):
    """The lab's solution."""

    def __init__(self, num_samples, chunk_size, seed=0):
        self.num_samples, self.chunk_size, self.seed, self.epoch = num_samples, chunk_size, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.num_samples

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        for c in torch.randperm(-(-self.num_samples // self.chunk_size), generator=g).tolist():
            start = c * self.chunk_size
            yield from (start + torch.randperm(min(self.chunk_size, self.num_samples - start), generator=g)).tolist()


class PlainShuffle(ChunkShuffle):
    def __iter__(self):
        return iter(
            torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + self.epoch)).tolist()
        )


class ChunksInOrder(ChunkShuffle):
    def __iter__(self):
        return iter(range(self.num_samples))


class GlobalState(ChunkShuffle):
    def __iter__(self):
        g = torch.Generator().manual_seed(int(torch.randint(0, 1000, ())))  # the global random state
        for c in torch.randperm(-(-self.num_samples // self.chunk_size), generator=g).tolist():
            start = c * self.chunk_size
            yield from range(start, min(start + self.chunk_size, self.num_samples))


class LazyH5(Dataset):
    """The lab's solution."""

    def __init__(self, path):
        import h5py

        self.path = path
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        with h5py.File(path, "r") as f:
            self.length = len(f["labels"])
        self.file, self.pid = None, None

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        import os

        import h5py

        if self.file is None or self.pid != os.getpid():
            self.file, self.pid = h5py.File(self.path, "r"), os.getpid()
        return torch.from_numpy(self.file["images"][index]), int(self.file["labels"][index])

    def __getstate__(self):
        state = dict(self.__dict__)
        state["file"], state["pid"] = None, None
        return state


class OpensAtOnce(LazyH5):
    def __init__(self, path):
        import h5py

        super().__init__(path)
        self.keep = h5py.File(path, "r")

    def __getstate__(self):
        state = super().__getstate__()
        state["keep"] = None
        return state


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lab03")
    images, labels = make_images(256, (3, 32, 32), seed=1)
    gz = write_h5(folder / "gz.h5", images, labels, "chunked", (32, 3, 32, 32), "gzip", disable=True)
    return folder, images, labels, gz


# --- choose_storage -------------------------------------------------------------------------------

NEAR_CONSTANT = {  # answers that ignore the arguments but for the shape they must echo
    "one sample per chunk, fixed cache": lambda n, s, d: {
        "chunks": (1, *s),
        "rdcc_nbytes": 4 * MiB,
        "rdcc_nslots": 10007,
    },
    "64 samples per chunk": lambda n, s, d: {"chunks": (min(n, 64), *s), "rdcc_nbytes": 4 * MiB, "rdcc_nslots": 100003},
    "10 KiB chunks, a huge slot table": lambda n, s, d: {
        "chunks": (min(n, max(1, -(-10240 // (math.prod(s) * np.dtype(d).itemsize)))), *s),
        "rdcc_nbytes": 4 * MiB,
        "rdcc_nslots": 1_000_000_007,
    },
    "10 KiB chunks, a cache of one chunk": lambda n, s, d: {
        "chunks": (min(n, max(1, -(-10240 // (math.prod(s) * np.dtype(d).itemsize)))), *s),
        "rdcc_nbytes": 10240,
        "rdcc_nslots": 101,
    },
}


@pytest.mark.parametrize("seed", range(4))
def test_the_solution_has_the_references_facts_and_near_constants_do_not(seed) -> None:
    cases = lab03.storage_cases(random.Random(seed), 40)
    assert len(cases) == 40 and all(math.prod(s) * np.dtype(d).itemsize <= MiB for _, s, d in cases)
    want = {c: lab03.storage_facts(lab03.reference_storage(*c), (c[0], *c[1]), c[2]) for c in cases}
    assert all(all(v is True or isinstance(v, (int, list)) for v in facts.values()) for facts in want.values())
    assert same({c: lab03.storage_facts(choose_storage(*c), (c[0], *c[1]), c[2]) for c in cases}, want)
    const = {"chunks": (64, 3, 64, 64), "rdcc_nbytes": 4 * MiB, "rdcc_nslots": 10007}
    assert not same({c: lab03.storage_facts(const, (c[0], *c[1]), c[2]) for c in cases}, want)
    for name, answer in NEAR_CONSTANT.items():
        assert not same({c: lab03.storage_facts(answer(*c), (c[0], *c[1]), c[2]) for c in cases}, want), name


def test_storage_facts_name_what_is_wrong() -> None:
    assert lab03.storage_facts("no", (5, 2), "uint8") == {"keys (of chunks, rdcc_nbytes, rdcc_nslots)": "a str"}
    bad = lab03.storage_facts({"chunks": (9, 2), "rdcc_nbytes": 8 * MiB, "rdcc_nslots": 0.5}, (5, 2), "uint8")
    assert bad["axes of chunks"] == 2 and not bad["each chunk size between 1 and its axis' length"]
    assert not bad["rdcc_nbytes an int from one chunk to 4 MiB"]
    assert not bad["rdcc_nslots a prime, 100x to 200x the chunks the cache holds"]
    split = lab03.storage_facts({"chunks": (4, 1), "rdcc_nbytes": MiB, "rdcc_nslots": 101}, (50_000, 2), "float32")
    assert split["each chunk size between 1 and its axis' length"] and not split["chunks hold whole samples"]
    # 2,560 samples of 4 bytes (10 KiB) per chunk, a 4-chunk cache and 401 slots: every rule holds
    good = lab03.storage_facts({"chunks": (2560, 1), "rdcc_nbytes": 40960, "rdcc_nslots": 401}, (50_000, 1), "float32")
    assert all(
        v is True for k, v in good.items() if k not in ("keys (of chunks, rdcc_nbytes, rdcc_nslots)", "axes of chunks")
    )
    assert not lab03.storage_facts(
        {"chunks": (2560, 1), "rdcc_nbytes": 40960, "rdcc_nslots": 400}, (50_000, 1), "float32"
    )["rdcc_nslots a prime, 100x to 200x the chunks the cache holds"]


def test_shuffled_reads_give_the_same_checksum_on_any_layout_and_catch_a_skipped_read(files) -> None:
    folder, images, labels, _ = files
    base, mine = lab03.storage_readers(
        choose_storage(len(images), images.shape[1:], images.dtype), images, labels, folder, "t"
    )
    assert base.chunk_rows == 256 and mine.chunk_rows == 4
    a, b = lab03.shuffled_reads(mine, 50)(7), lab03.shuffled_reads(base, 50)(7)
    assert torch.equal(a, b) and len(a) == 51
    assert not torch.equal(a, lab03.shuffled_reads(mine, 50)(8))
    skipped = lab03.read_checksum(mine.__getitem__, random.Random(7).sample(range(len(images)), 50)[:-1])
    assert not torch.equal(skipped, a)
    forged = lab03.read_checksum(lambda i: (torch.zeros(1), int(labels[i])), random.Random(7).sample(range(256), 50))
    assert not torch.equal(forged, a)


# --- ChunkShuffle ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(3))
def test_sampler_facts_pass_the_solution_and_fail_wrong_samplers(seed) -> None:
    cases = lab03.sampler_cases(random.Random(seed), 12)
    want = lab03.sampler_facts(lab03.reference_sampler, cases)
    assert same(lab03.sampler_facts(ChunkShuffle, cases), want)
    for wrong in (PlainShuffle, GlobalState):
        assert not same(lab03.sampler_facts(wrong, cases), want), wrong
    stats = lab03.sampler_statistics(lab03.reference_sampler, seed)
    assert all(stats.values()) and same(lab03.sampler_statistics(ChunkShuffle, seed), stats)
    assert not same(lab03.sampler_statistics(ChunksInOrder, seed), stats)


def test_chunk_reads_read_the_same_chunks_in_any_order(files) -> None:
    _, _, _, gz = files
    ds = H5Dataset(gz, rdcc_nbytes=MiB)
    mine = lab03.chunk_reads(ds, 3, lambda n, k, seed: ChunkShuffle(n, k, seed=seed))(5)
    assert len(mine) == 3 * 32 + 1
    assert torch.equal(mine, lab03.chunk_reads(ds, 3, lambda n, k, seed: PlainShuffle(n, k, seed=seed))(5))
    assert torch.equal(mine, lab03.chunk_reads(ds, 3, lab03.reference_sampler)(5))
    short = lab03.chunk_reads(ds, 3, lambda n, k, seed: list(range(n - 1)) + [n - 2])(5)  # one index twice
    assert not torch.equal(mine, short)
    assert not torch.equal(mine, lab03.chunk_reads(ds, 3, lambda n, k, seed: range(n + 5))(5))


def _bytes_read(work, seeds=(11, 12)) -> list:
    """``work`` run once unmeasured, then measured on ``seeds`` as the grader measures it."""
    work(10)
    return [measure_here(work, s)[0] for s in seeds]


def test_the_bytes_read_pass_chunk_aware_reads_and_fail_a_shuffled_order(files) -> None:
    """chunk_shuffle_fast's bar: 4 chunks read through a one-chunk cache may read what they hold
    uncompressed; here 3 chunks of 32 images of 3 KiB (96 KiB each) through a 100 KiB cache."""
    _, images, _, gz = files
    ds = H5Dataset(gz, rdcc_nbytes=100 * 1024, rdcc_nslots=10007)
    ds[0]
    bar = dict(counter="read_chars", at_most=3 * 32 * images[0].nbytes)
    for order in (ChunkShuffle, lab03.reference_sampler):
        assert judge("measure.count", _bytes_read(lab03.chunk_reads(ds, 3, order)), None, **bar) is None, order
    why = judge("measure.count", _bytes_read(lab03.chunk_reads(ds, 3, PlainShuffle)), None, **bar)
    assert why is not None and "read_chars was" in why
    ds.close()


def big_chunks(num_samples, sample_shape, dtype):
    """Every rule of the facts kept, but as many samples per chunk as fit in 1 MiB: wrong for shuffled reads."""
    sample_nbytes = math.prod(sample_shape) * np.dtype(dtype).itemsize
    rows = max(1, min(num_samples, MiB // sample_nbytes))
    return {"chunks": (rows, *sample_shape), "rdcc_nbytes": 4 * rows * sample_nbytes, "rdcc_nslots": 401}


def test_the_bytes_read_pass_small_chunks_and_fail_big_ones_that_keep_the_rules(tmp_path) -> None:
    """storage_is_fast's bar, 64 KiB read per shuffled sample: the solution's chunks of a few images
    read about their own size; 1 MiB chunks, which keep every rule of the facts, read far more."""
    images, labels = make_images(2048, (3, 32, 32), seed=2)
    args = (len(images), images.shape[1:], images.dtype)
    assert all(
        v is True
        for k, v in lab03.storage_facts(big_chunks(*args), images.shape, images.dtype).items()
        if k.startswith(("each", "chunks", "10", "rdcc"))
    )
    bar = dict(counter="read_chars", at_most=50 * 64 * 1024)
    mine = lab03.storage_reader(choose_storage(*args), images, labels, tmp_path, "small")
    assert judge("measure.count", _bytes_read(lab03.shuffled_reads(mine, 50)), None, **bar) is None
    big = lab03.storage_reader(big_chunks(*args), images, labels, tmp_path, "big")
    why = judge("measure.count", _bytes_read(lab03.shuffled_reads(big, 50)), None, **bar)
    assert why is not None and "read_chars was" in why
    mine.close()
    big.close()


# --- LazyH5 ---------------------------------------------------------------------------------------


def test_lazy_facts_agree_with_the_reference_and_see_an_open_file(files) -> None:
    _, _, _, gz = files
    picks = [3, 200, 17, 64, 64]
    want = lab03.lazy_facts(H5Dataset, gz, picks)
    assert want["HDF5 files left open by the constructor"] == 0 and want["len"] == 256
    assert same(lab03.lazy_facts(LazyH5, gz, picks), want)
    assert not same(lab03.lazy_facts(OpensAtOnce, gz, picks), want)
    assert lab03.gpulab_bases(LazyH5) == [] and lab03.gpulab_bases(type("Mine", (H5Dataset,), {})) == [
        "gpulab.data.h5dataset.H5Dataset"
    ]


def test_worker_reads_count_one_open_per_worker(files, tmp_path) -> None:
    _, images, labels, gz = files
    order = list(range(255, -1, -3))
    got = lab03.worker_reads(LazyH5, gz, order, tmp_path / "log")
    assert got["opens per process"] == [1, 1] and got["the parent opened it again"] is False
    assert torch.equal(got["images"], torch.from_numpy(images[order]))
    assert same(got, lab03.worker_reads(H5Dataset, gz, order, tmp_path / "log2"))


# --- masking --------------------------------------------------------------------------------------


def test_the_references_are_the_exercises_answers_and_can_be_masked(tmp_path) -> None:
    assert masked_names(lab03.REFERENCES) == [
        "gpulab.data.hdf5.rows_for_random_reads",
        "gpulab.data.chunk_cache.suggest_cache",
        "gpulab.data.chunk_cache.next_prime",
        "gpulab.data.chunk_sampler.ChunkShuffleSampler",
    ]
    masked = {
        original.name: copy.read_text()
        for copy, original in write_masks(lab03.REFERENCES, tmp_path)
        if copy.suffix == ".py"
    }
    assert set(masked) == {"hdf5.py", "chunk_cache.py", "chunk_sampler.py"}
    assert "def suggest_chunks" in masked["hdf5.py"] and "def write_h5" in masked["hdf5.py"]
    assert "def simulate_chunk_cache" in masked["chunk_cache.py"]


def test_the_demos_chunk_rule_does_not_use_the_masked_one(monkeypatch) -> None:
    from gpulab.data import hdf5

    def masked(*args, **kwargs):
        raise __import__("gpulab").MaskedReference("gpulab.data.hdf5.rows_for_random_reads")

    monkeypatch.setattr(hdf5, "rows_for_random_reads", masked)
    assert hdf5.suggest_chunks((2048, 3, 64, 64), np.uint8, access="chunk") == (64, 3, 64, 64)
    with pytest.raises(__import__("gpulab").MaskedReference):
        hdf5.suggest_chunks((2048, 3, 64, 64), np.uint8, access="sample")


def test_the_reference_sampler_takes_a_number_of_samples() -> None:
    assert list(lab03.reference_sampler(10, 4, seed=3)) == list(
        __import__("gpulab").data.chunk_sampler.ChunkShuffleSampler(range(10), 4, seed=3)
    )
