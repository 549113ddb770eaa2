"""gpulab.parallel.launcher.launch: ranks start (even for closures), report back in order, fail loudly and
leave no process behind.

Every test that starts ranks uses fork (about 0.2 s a launch); one test pays for a real spawn.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import types

import psutil
import pytest
import torch
import torch.distributed as dist

from gpulab.devices import cuda_device_count
from gpulab.parallel import LaunchTimeoutError, RankFailedError, launch, rank_device, threads_per_rank
from gpulab.parallel.launcher import startup


def _descendants() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in " ".join(p.cmdline()):
                continue  # multiprocessing's own helper for spawn: one per interpreter, not a rank
            out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture
def no_orphans():
    """Fail the test if launch() left any child process behind."""
    before = {p.pid for p in _descendants()}
    yield
    time.sleep(0.2)
    left = [p for p in _descendants() if p.pid not in before]
    assert not left, f"launch left processes behind: {[(p.pid, p.name()) for p in left]}"


def test_results_in_rank_order_with_a_closure(no_orphans, capsys):
    offset = 10  # a closure over a local: only fork can send this to the ranks

    def worker(rank, world_size, scale):
        t = torch.tensor([float(rank)])
        dist.all_reduce(t)  # 0 + 1 + 2
        print("hello from", rank)
        return {"rank": rank, "sum": t.item() * scale + offset, "env": (os.environ["RANK"], os.environ["WORLD_SIZE"]),
                "threads": torch.get_num_threads(), "device": str(rank_device(rank)), "backend": dist.get_backend()}

    out = launch(worker, 3, args=(2.0,))
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["sum"] == 3 * 2.0 + offset for o in out)
    assert [o["env"] for o in out] == [("0", "3"), ("1", "3"), ("2", "3")]
    assert all(o["threads"] == threads_per_rank(3) for o in out)
    assert {o["device"] for o in out} == {"cpu"} and {o["backend"] for o in out} == {"gloo"}
    printed = capsys.readouterr().out
    assert "[rank 2] hello from 2" in printed and "[rank 0] hello from 0" in printed


def test_world_size_one_and_tensors_come_back():
    out = launch(lambda rank, world_size: torch.arange(4) * (rank + 1), 1, echo=False)
    torch.testing.assert_close(out[0], torch.arange(4))


def _crash_rank1(rank, world_size, pidfile):
    if rank == 1:
        time.sleep(0.3)
        raise ValueError("boom from the test")
    # rank 0: start DataLoader workers (grandchildren), then stay busy: it must be killed, and
    # its workers with it (a rank that exits by itself would stop its daemonic workers on its own)
    loader = torch.utils.data.DataLoader(range(100), num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    with open(pidfile, "w") as f:
        f.write(" ".join(str(w.pid) for w in it._workers))
    time.sleep(60)


def test_a_crashing_rank_stops_all_and_reraises_its_traceback(no_orphans, tmp_path):
    pidfile = tmp_path / "workers"
    t0 = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        launch(_crash_rank1, 2, args=(str(pidfile),), timeout=60, echo=False)
    assert time.monotonic() - t0 < 20, "the surviving rank was not stopped promptly"
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank 1 of 2 failed with ValueError: boom from the test" in str(err)
    assert "Traceback" in str(err) and "_crash_rank1" in str(err) and __file__.split("/")[-1] in str(err)
    workers = [int(p) for p in pidfile.read_text().split()]
    assert len(workers) == 2
    time.sleep(0.2)
    assert not [p for p in workers if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE], \
        "the crashed job's DataLoader workers survived"


def test_a_rank_that_dies_without_a_traceback(no_orphans):
    def worker(rank, world_size):
        if rank == 0:
            os._exit(7)
        dist.barrier()

    with pytest.raises(RankFailedError, match="exit code 7"):
        launch(worker, 2, timeout=60, echo=False)


def test_an_unsendable_return_value_is_reported():
    with pytest.raises(RankFailedError, match="cannot be sent back"):
        launch(lambda rank, world_size: (lambda: None), 1, echo=False)


def test_a_hung_collective_is_stopped_by_the_timeout(no_orphans):
    def worker(rank, world_size):
        if rank == 0:
            dist.all_reduce(torch.ones(1))  # rank 1 never joins
        else:
            time.sleep(60)

    t0 = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as info:
        launch(worker, 2, timeout=3, echo=False)
    assert time.monotonic() - t0 < 12
    msg = str(info.value)
    assert "timeout=3s" in msg and info.value.ranks == [0, 1]
    assert "all_reduce" in info.value.stacks[0], "the message should show where rank 0 was stuck"
    assert "same collectives in the same order" in msg


def _busy_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def _port(rank, world_size):
    return int(os.environ["MASTER_PORT"])


def test_a_port_already_taken_is_replaced_by_a_free_one(no_orphans):
    with _busy_port() as s:
        taken = s.getsockname()[1]
        with pytest.warns(UserWarning, match=f"port {taken} is already in use"):
            ports = launch(_port, 2, port=taken, echo=False)
    assert ports[0] == ports[1] != taken


def test_the_free_port_is_retried_if_another_process_takes_it(monkeypatch):
    with _busy_port() as s:
        taken = s.getsockname()[1]
        picks = iter([taken])  # the first "free" port is taken by the time we bind it: a race
        real = startup._free_port
        calls = []
        monkeypatch.setattr(startup, "_free_port", lambda: calls.append(1) or next(picks, None) or real())
        ports = launch(_port, 2, echo=False)
    assert len(calls) == 2 and ports[0] != taken


@pytest.mark.parametrize("world_size", [0, -1, 1.5, True, "2"])
def test_bad_world_size(world_size):
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        launch(_port, world_size)


def test_bad_backend_and_timeout():
    with pytest.raises(ValueError, match="'auto'"):
        launch(_port, 2, backend="mpi")
    with pytest.raises(ValueError, match="timeout"):
        launch(_port, 2, timeout=0)


@pytest.mark.skipif(cuda_device_count() >= 2, reason="this machine has the GPUs")
def test_nccl_without_gpus_names_the_fix():
    with pytest.raises(ValueError, match="backend='gloo'"):
        launch(_port, 2, backend="nccl")


def test_an_unpicklable_function_cannot_be_spawned():
    with pytest.raises(ValueError, match=r"cannot send the function.*\.py file"):
        launch(lambda rank, world_size: rank, 2, start_method="spawn")


def test_a_notebook_function_cannot_be_spawned(monkeypatch):
    notebook = types.ModuleType("__main__")  # a Jupyter kernel's __main__ has no __file__
    monkeypatch.setitem(sys.modules, "__main__", notebook)
    fn = types.FunctionType(_port.__code__, notebook.__dict__, "main_worker")
    fn.__module__ = "__main__"
    with pytest.raises(ValueError, match="defined in this notebook"):
        launch(fn, 2, start_method="spawn")


def test_without_fork_an_unpicklable_function_gets_a_clear_error(monkeypatch):
    monkeypatch.setattr(startup.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(ValueError, match="this platform has no fork"):
        launch(lambda rank, world_size: rank, 2)


def test_spawn_start_method_runs_an_importable_function(no_orphans):
    """The path taken on Windows and after CUDA init: fresh interpreters (slow: each imports torch)."""
    ports = launch(_port, 2, start_method="spawn", timeout=120, echo=False)
    assert ports[0] == ports[1] > 0


def _all_reduce_rank_plus_one(rank, world_size):  # module level: spawned ranks must import it by name
    t = torch.ones(1, device=rank_device(rank)) * (rank + 1)
    dist.all_reduce(t)
    return dist.get_backend(), t.item()


@pytest.mark.multigpu
def test_nccl_all_reduce_on_gpus():
    """After an earlier test initialised CUDA, launch uses spawn, which pickles the function by name:
    a closure defined in the test failed there, so this passed alone and failed in a full run."""
    assert launch(_all_reduce_rank_plus_one, 2) == [("nccl", 3.0), ("nccl", 3.0)]


@pytest.mark.multigpu
def test_nccl_after_cuda_init_in_the_caller_uses_spawn():
    torch.zeros(1, device="cuda")  # initialise CUDA here: fork is no longer usable for nccl ranks
    assert startup._choose_start_method(_port, (), "nccl", None) == "spawn"
    assert launch(_port, 2, backend="nccl", echo=False)[0] > 0


def _threads_after_a_matmul(rank: int, world_size: int) -> int:
    a = torch.randn(256, 256)
    (a @ a).sum()  # hung here, in OpenMP, when the rank was forked with 2 threads after the parent used its pool
    return torch.get_num_threads()


def test_a_forked_rank_runs_one_thread_after_the_parent_used_openmp() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.randn(512, 512) @ torch.randn(512, 512)  # the caller's thread pool is in use, as in any notebook
        with pytest.warns(UserWarning, match="one"):
            got = launch(_threads_after_a_matmul, 2, threads=2, echo=False, timeout=60, start_method="fork")
    finally:
        torch.set_num_threads(before)
    assert got == [1, 1]


def _collect_in_the_rank(rank: int, world_size: int) -> bool:
    import gc

    gc.collect()  # hung here when the caller's garbage held a TCPStore server
    return gc.isenabled()


def test_the_callers_garbage_is_not_collected_in_a_forked_rank(no_orphans) -> None:
    """CI hung a 2-rank launch in "Garbage-collecting": the rank freed a cycle it had copied from the
    caller, whose C++ destructor waits for a thread that the fork did not copy."""
    import gc
    from datetime import timedelta

    store = dist.TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=10))  # a server thread, here only
    cycle: dict = {"store": store}
    cycle["self"] = cycle
    gc.disable()  # keep the cycle alive as garbage until the fork, as a busy caller's collector can
    try:
        del store, cycle
        got = launch(_collect_in_the_rank, 2, timeout=20, echo=False, start_method="fork")
        assert gc.isenabled() is False, "launch must give the caller its collector back as it found it"
    finally:
        gc.enable()
    assert got == [False, False], "a forked rank keeps the caller's collector setting"
    got = launch(_collect_in_the_rank, 2, timeout=20, echo=False, start_method="fork")
    assert got == [True, True], "a forked rank must collect again once it has frozen what it inherited"
