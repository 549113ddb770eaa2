"""The open-before-fork bug, run safely: an h5py handle shared with DataLoader workers.

Each scenario builds a dataset in a parent process, reads one sample there (as a notebook does
when it peeks at the data), then reads a fixed shuffled order through a 2-worker DataLoader
and compares every sample with a direct read. Everything runs in a *child* Python process with
a time limit, so a hang or a crash cannot take a notebook down with it:

    python -m gpulab.data.fork_demo data.h5 shared/fork shared/spawn lazy/spawn

Scenarios (``<dataset>/<start method>``):

* ``shared``: :class:`~gpulab.data.hdf5.EagerH5Dataset`, opened in ``__init__``, handle inherited;
* ``shared-fileobj``: the same, but HDF5 reads through one Python file object, whose file
  offset all forked processes share (``seek`` in one, ``read`` in another);
* ``lazy`` / ``lazy-fileobj``: :class:`~gpulab.data.hdf5.H5Dataset`, opened in each worker.

Outcomes: ``ok``, ``corrupt`` (samples differ from a direct read), ``error`` (an exception, e.g.
``TypeError: h5py objects cannot be pickled`` under spawn) and ``timeout`` (a hang).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader

from gpulab.data.hdf5 import EagerH5Dataset, H5Dataset

__all__ = ["SCENARIOS", "run_scenario", "open_before_fork_demo"]

SCENARIOS = ("shared/fork", "shared-fileobj/fork", "shared/spawn", "lazy/fork", "lazy-fileobj/fork", "lazy/spawn")


class _ThroughFileObject:
    """Open the HDF5 file through a Python file object (h5py's ``fileobj`` driver)."""

    def _open_file(self) -> h5py.File:
        return h5py.File(open(self.path, "rb"), "r", **self.cache.kwargs())  # h5py owns it


class _SharedFileObjDataset(_ThroughFileObject, EagerH5Dataset):
    """Opened before the fork, through one file object: the workers share its offset."""


class _LazyFileObjDataset(_ThroughFileObject, H5Dataset):
    """Opened in each worker, through a file object of its own."""


_DATASETS = {"shared": EagerH5Dataset, "shared-fileobj": _SharedFileObjDataset,
             "lazy": H5Dataset, "lazy-fileobj": _LazyFileObjDataset}


def run_scenario(path: str | os.PathLike, scenario: str, repeats: int = 3, num_workers: int = 2,
                 timeout_s: float = 20.0) -> dict[str, Any]:
    """Run one scenario in *this* process (use :func:`open_before_fork_demo` from a notebook).

    Returns:
        ``{"scenario", "outcome", "bad_samples", "samples", "error", "seconds"}``; a forked
        scenario is repeated ``repeats`` times (corruption is a race) and counts over all.
    """
    kind, _, method = scenario.partition("/")
    if kind not in _DATASETS or method not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"unknown scenario {scenario!r}; choose from {SCENARIOS}")
    t0 = time.perf_counter()
    with h5py.File(path, "r") as f:
        expected = f["images"][:]
    result: dict[str, Any] = {"scenario": scenario, "outcome": "ok", "bad_samples": 0, "samples": 0, "error": ""}
    dataset = _DATASETS[kind](path)
    dataset[0]  # the parent peeks at the data: a lazy dataset opens its handle here too
    for trial in range(repeats if method == "fork" else 1):
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(trial)).tolist()
        loader = DataLoader(dataset, batch_size=64, sampler=order, num_workers=num_workers,
                            multiprocessing_context=method, timeout=timeout_s)
        try:
            images = torch.cat([batch[0] for batch in loader]).numpy()
        except Exception as err:  # the outcome is the lesson
            timed_out = "timed out" in str(err)
            result.update(outcome="timeout" if timed_out else "error",
                          error=f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:200]}")
            break
        bad = int((images.reshape(len(order), -1) != expected[order].reshape(len(order), -1)).any(axis=1).sum())
        result["bad_samples"] += bad
        result["samples"] += len(order)
        if bad:
            result["outcome"] = "corrupt"
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def open_before_fork_demo(path: str | os.PathLike, scenarios: tuple[str, ...] = SCENARIOS,
                          repeats: int = 3, timeout_s: float = 90.0) -> list[dict[str, Any]]:
    """Run ``scenarios`` in a child Python process, killed (with its workers) after ``timeout_s``.

    Returns:
        One result dict per scenario (see :func:`run_scenario`); scenarios the time limit cut
        off come back with ``outcome="timeout"``.
    """
    cmd = [sys.executable, "-m", "gpulab.data.fork_demo", "--repeats", str(repeats), os.fspath(path), *scenarios]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # its own process group: workers die with it
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    results = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if proc.returncode not in (0, -signal.SIGKILL) and not results:
        raise RuntimeError(f"the fork demo failed (exit {proc.returncode}):\n{err[-2000:]}")
    done = {r["scenario"] for r in results}
    return results + [{"scenario": s, "outcome": "timeout", "bad_samples": 0, "samples": 0,
                       "error": f"killed after {timeout_s:.0f} s", "seconds": timeout_s}
                      for s in scenarios if s not in done]


def main(argv: list[str] | None = None) -> None:
    """``python -m gpulab.data.fork_demo PATH [--repeats N] SCENARIO...``: one JSON line each."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    np.seterr(all="ignore")
    for scenario in args.scenarios:
        print(json.dumps(run_scenario(args.path, scenario, repeats=args.repeats)), flush=True)


if __name__ == "__main__":
    main()
