"""The open-before-fork demo: the spawn failure, the lazy fix, and a bounded run time."""

from __future__ import annotations

import time

import pytest

from gpulab.data.fork_demo import open_before_fork_demo, run_scenario
from gpulab.data.hdf5 import make_images, write_h5


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_h5(tmp_path_factory.mktemp("fork") / "d.h5", *make_images(256, (3, 16, 16)), disable=True)


@pytest.mark.filterwarnings("ignore:Got pickle error")
def test_shared_handle_cannot_be_pickled_for_spawn(path) -> None:
    result = run_scenario(path, "shared/spawn")
    assert result["outcome"] == "error" and "h5py objects cannot be pickled" in result["error"]


def test_lazy_dataset_under_fork_reads_every_sample_right(path) -> None:
    result = run_scenario(path, "lazy/fork", repeats=2)
    assert result == {**result, "outcome": "ok", "bad_samples": 0, "samples": 512}


def test_unknown_scenario(path) -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        run_scenario(path, "lazy/thread")


def test_runs_in_a_child_process_and_is_cut_off_at_the_time_limit(path) -> None:
    results = open_before_fork_demo(path, ("shared/spawn", "lazy/fork"), repeats=1, timeout_s=120)
    assert [r["scenario"] for r in results] == ["shared/spawn", "lazy/fork"]
    assert [r["outcome"] for r in results] == ["error", "ok"]
    t0 = time.perf_counter()
    cut = open_before_fork_demo(path, ("lazy/fork",), timeout_s=0.5)  # cannot even import torch in time
    assert time.perf_counter() - t0 < 10
    assert cut == [{"scenario": "lazy/fork", "outcome": "timeout", "bad_samples": 0, "samples": 0,
                    "error": "killed after 0 s", "seconds": 0.5}]
