"""gpulab.memory.profiled: torch.profiler's memory view per step shows a leak as the same net bytes
every step (the bytes LeakFinder sees kept), a steady loop as zero; its table and snapshot come from
the same run."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from gpulab.memory import LeakFinder
from gpulab.memory.profiled import MemoryProfile

F32 = 4


def _loop(prof, keep_every_step: bool, steps: int = 6, finder=None):
    kept = []
    batches = prof.watch(range(steps))
    for _ in (finder.watch(batches) if finder else batches):
        x = torch.ones(1000)  # 4000 bytes made every step; the previous step's is freed here
        if keep_every_step:
            kept.append(x)
    return kept


def test_a_leak_is_the_same_net_bytes_every_step_and_matches_leakfinder() -> None:
    with LeakFinder() as finder, MemoryProfile(with_stack=False) as prof:
        kept = _loop(prof, keep_every_step=True, finder=finder)
    assert prof.net_per_step() == [1000 * F32] * 6
    # the same run through LeakFinder: the live bytes grow by exactly the profiler's net per step
    assert [b - a for a, b in zip(finder.history, finder.history[1:])] == prof.net_per_step()[1:]
    del kept


def test_a_steady_loop_nets_zero_after_its_first_step() -> None:
    with MemoryProfile(with_stack=False) as prof:
        _loop(prof, keep_every_step=False)
    assert prof.net_per_step() == [1000 * F32] + [0] * 5  # each step frees the one before


def test_the_table_ranks_ops_by_the_memory_they_allocate() -> None:
    with MemoryProfile(with_stack=False) as prof:
        _loop(prof, keep_every_step=False)
    table = prof.table(row_limit=3)
    assert "Self CPU Mem" in table and "aten::" in table


def test_a_loop_that_raises_still_closes_its_step() -> None:
    with pytest.raises(torch.OutOfMemoryError):
        with MemoryProfile(with_stack=False) as prof:
            for i in prof.watch(range(5)):
                torch.ones(100)
                if i == 2:
                    raise torch.OutOfMemoryError("out of memory in step 2")
    assert len(prof.net_per_step()) == 3


def test_snapshot_and_html_name_the_function_that_allocated(tmp_path) -> None:
    def keep_rows(prof):
        return [torch.ones(256, 256) for _ in prof.watch(range(3))]

    with MemoryProfile() as prof:
        kept = keep_rows(prof)
    from gpulab.memory import snapshot as snap

    top = snap.sites(prof.snapshot(), depth=1)[0]
    assert (top.nbytes, top.blocks) == (3 * 256 * 256 * F32, 3)
    assert top.frames[0].name in ("keep_rows", "<listcomp>")  # Python 3.12 inlines comprehensions (PEP 709)
    page = prof.write_html(tmp_path / "memory.html").read_text()
    assert "MemoryViz.js" in page
    del kept


def test_misuse_names_the_fix() -> None:
    prof = MemoryProfile(with_stack=False)
    with pytest.raises(RuntimeError, match="inside"):
        next(prof.watch([1]))
    with prof:
        with pytest.raises(RuntimeError, match="after"):
            prof.net_per_step()
    with pytest.raises(RuntimeError, match="new MemoryProfile"):
        prof.__enter__()
    with pytest.raises(RuntimeError, match="with_stack=True"):
        prof.snapshot()
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        prof.net_per_step("gpu")
    if not prof.cuda:
        with pytest.raises(ValueError, match="no GPU"):
            prof.net_per_step("cuda")
    with pytest.raises(ValueError, match="label"):
        MemoryProfile("")


@pytest.mark.gpu
def test_cuda_net_per_step() -> None:
    kept = []
    with MemoryProfile(with_stack=False) as prof:
        for _ in prof.watch(range(4)):
            kept.append(torch.empty(2**18, device="cuda"))  # 1 MiB kept per step
    assert prof.cuda and prof.net_per_step("cuda") == [2**20] * 4
    assert prof.net_per_step() == [2**20] * 4  # on a GPU, the default is the GPU


def test_net_per_step_reads_the_gpu_by_default_when_the_profile_recorded_one() -> None:
    """Lab 08's leak showed about 0 B per step on a GPU: the default read the CPU's column."""
    import types

    with MemoryProfile(with_stack=False) as prof:
        for _ in prof.watch(range(2)):
            pass
    step = types.SimpleNamespace(name=prof.label, time_range=types.SimpleNamespace(start=0), cpu_memory_usage=0,
                                 device_memory_usage=2**20)
    prof._events, prof.cuda = [step], True  # what a profile on a GPU records for a step that keeps 1 MiB there
    assert prof.net_per_step() == [2**20] and prof.net_per_step("cpu") == [0]


def test_no_module_is_imported_while_the_python_tracer_runs() -> None:
    """A module imported under with_stack=True frees its code object, and torch's Python tracer
    keeps a pointer to it (UnicodeDecodeError at parse time, pytorch/pytorch#136040): MemoryProfile
    warms up first. A fresh process, as a student's kernel."""
    script = (
        "import sys, torch\n"
        "from gpulab.memory.profiled import MemoryProfile\n"
        "prof = MemoryProfile()\n"
        "start = prof.profiler.__enter__\n"
        "def enter():\n"
        "    global before\n"
        "    before = set(sys.modules)\n"
        "    return start()\n"
        "prof.profiler.__enter__ = enter\n"
        "with prof:\n"
        "    for _ in prof.watch(range(2)):\n"
        "        torch.ones(10) * 2\n"
        "print(sorted(set(sys.modules) - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_table_leaves_out_python_calls_of_other_threads() -> None:
    """with_stack records every thread's Python calls (a notebook kernel's ZMQ threads) and torch
    charges memory to them by time: the table keeps the ops."""
    stop = threading.Event()
    worker = threading.Thread(target=lambda: [time.sleep(0.001) for _ in iter(stop.is_set, True)], daemon=True)
    worker.start()
    try:
        with MemoryProfile() as prof:
            kept = [torch.ones(4096) for _ in prof.watch(range(3))]
    finally:
        stop.set()
        worker.join()
    table = prof.table(row_limit=50)
    assert "aten::" in table and ".py(" not in table and "<built-in" not in table
    del kept
