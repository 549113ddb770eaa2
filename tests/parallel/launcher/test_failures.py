"""gpulab.parallel.launcher.launch under faults: it blames the rank that caused a failure (not the peer
whose collective failed because of it), no process outlives a caller killed with SIGKILL, and
RankFailedError keeps the rank's exception type (``except ValueError`` works around launch).

The scenarios come from fault scripts run against the launcher (issue 15). Each launch forks two
gloo ranks (about half a second here); the repeated scenario runs a few of them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from gpulab.parallel import RankFailedError, launch
from gpulab.parallel.launcher.failures import blame, peer_lost, rank_failed_error, summary

GLOO_PEER_GONE = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                  "[127.0.0.1]:46826. This is typically caused by a remote worker crashing. Check the logs "
                  "of the remote worker before reporting an error.")


# --- wrong blame -----------------------------------------------------------------------------

def test_blame_prefers_the_cause_over_an_earlier_stamped_consequence():
    # the parent stamps a silent death when it notices it: later than the error that death caused
    died = {"type": "ProcessDied", "time": 10.2, "peer_lost": False}
    waited = {"type": "RuntimeError", "time": 10.1, "peer_lost": True}
    assert [r for r, _ in blame([(0, waited), (1, died)])] == [1, 0]
    # two causes (or two consequences) keep the order of the clock they share
    a, b = {"time": 1.0, "peer_lost": False}, {"time": 2.0, "peer_lost": False}
    assert [r for r, _ in blame([(1, b), (0, a)])] == [0, 1]
    assert [r for r, _ in blame([(1, {**b, "peer_lost": True}), (0, {**a, "peer_lost": True})])] == [0, 1]


def test_peer_lost_recognises_a_vanished_peer_only():
    assert peer_lost(RuntimeError(GLOO_PEER_GONE))
    assert peer_lost(dist.DistNetworkError("Failed to recv, got 0 bytes."))
    assert not peer_lost(ValueError("bad batch size"))
    assert not peer_lost(torch.OutOfMemoryError("CUDA out of memory"))
    try:  # the user's handler of a collective failure raising: still a consequence
        try:
            raise RuntimeError(GLOO_PEER_GONE)
        except RuntimeError:
            raise ValueError("could not average the loss") from None
    except ValueError as err:
        assert err.__context__ is not None and peer_lost(err)


def _dies_while_peer_waits(rank, world_size, dead):
    if rank == dead:
        time.sleep(0.1)  # let the peer enter the collective first
        os._exit(3)  # no traceback, no record: the parent writes one when it sees the exit
    dist.all_reduce(torch.ones(1))


@contextlib.contextmanager
def _busy_caller(switch_interval: float = 0.05):
    """A caller whose other thread holds the GIL (a monitor, a progress bar): launch's supervising
    thread then notices a rank's death up to ``switch_interval`` late, as on a loaded machine."""
    old = sys.getswitchinterval()
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(switch_interval)
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()
        sys.setswitchinterval(old)


@pytest.mark.parametrize("busy", [False, True], ids=["quiet-caller", "busy-caller"])
def test_the_rank_that_died_is_blamed_not_the_one_waiting_for_it(busy):
    """Before the fix 3 runs in 27 blamed the waiting rank on a quiet caller, most runs on a busy one."""
    blamed = []
    with _busy_caller() if busy else contextlib.nullcontext():
        for dead in [1, 0, 1, 0]:  # rank 0 hosts the store: its death is seen through the store too
            with pytest.raises(RankFailedError) as info:
                launch(_dies_while_peer_waits, 2, args=(dead,), timeout=30, echo=False)
            blamed.append((dead, info.value.rank, info.value.exc_type))
    assert all(rank == dead and kind == "ProcessDied" for dead, rank, kind in blamed), \
        f"(died, blamed, type) per run: {blamed}"
    assert f"(then: rank {1 - dead} " in str(info.value), "the waiting rank's failure is still listed, after the cause"


# --- orphans ---------------------------------------------------------------------------------

CALLER = textwrap.dedent("""
    import os, subprocess, sys, time
    from gpulab.parallel import launch

    def worker(rank, world_size, folder):
        child = subprocess.Popen(["sleep", "300"])  # a plain subprocess of the rank
        with open(os.path.join(folder, f"sleep{rank}.tmp"), "w") as f:
            f.write(str(child.pid))
        os.replace(os.path.join(folder, f"sleep{rank}.tmp"), os.path.join(folder, f"sleep{rank}"))
        time.sleep(300)

    launch(worker, 2, args=(sys.argv[1],), timeout=600, echo=False)
""")


def _alive(p: psutil.Process) -> bool:
    try:  # is_running also checks the start time, so a recycled pid does not count
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and `sleep` as on Linux")
def test_nothing_outlives_a_caller_killed_with_sigkill(tmp_path):
    caller = subprocess.Popen([sys.executable, "-c", CALLER, str(tmp_path)])
    try:
        deadline = time.monotonic() + 120  # the caller imports torch first
        while not all((tmp_path / f"sleep{r}").exists() for r in (0, 1)):
            assert caller.poll() is None, "the caller exited before its ranks started their subprocesses"
            assert time.monotonic() < deadline, "the ranks never started their subprocesses"
            time.sleep(0.1)
        family = psutil.Process(caller.pid).children(recursive=True)
        sleeps = [psutil.Process(int((tmp_path / f"sleep{r}").read_text())) for r in (0, 1)]
        assert {s.pid for s in sleeps} <= {p.pid for p in family}
        assert len(family) >= 4, f"expected 2 ranks and 2 sleeps at least, got {family}"
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 10
    while any(map(_alive, family)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [(p.pid, p.name()) for p in family if _alive(p)]
    for p in family:  # do not leave them to the next test, whatever the verdict
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    assert not left, f"processes outlived their SIGKILLed caller: {left}"


# --- exception types -------------------------------------------------------------------------

class NeedsTwoArgs(Exception):
    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")


class CannotBeSubclassed(Exception):
    def __init_subclass__(cls, **kwargs):
        raise TypeError("final")


def _raises(rank, world_size, exc):
    if rank == world_size - 1:
        raise exc
    dist.barrier()


def test_a_rank_valueerror_is_caught_as_valueerror():
    with pytest.raises(ValueError, match="bad batch size") as info:
        launch(_raises, 2, args=(ValueError("bad batch size"),), timeout=30, echo=False)
    err = info.value
    assert isinstance(err, RankFailedError) and err.rank == 1 and err.exc_type == "ValueError"
    assert err.exc_class is ValueError and err.message == "bad batch size"
    assert "rank 1 of 2 failed with ValueError: bad batch size" in str(err) and "Traceback" in str(err)
    assert not isinstance(err, torch.OutOfMemoryError)


def test_an_oom_in_a_rank_is_told_apart_from_a_valueerror():
    try:
        launch(_raises, 1, args=(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),),
               echo=False)
    except ValueError:
        pytest.fail("an OOM was caught as a ValueError")
    except torch.OutOfMemoryError as err:
        assert isinstance(err, RankFailedError) and err.exc_class is torch.OutOfMemoryError
        assert "Tried to allocate 2.00 GiB" in str(err)
    else:
        pytest.fail("launch did not raise")


def test_a_class_with_its_own_init_and_a_local_class():
    with pytest.raises(NeedsTwoArgs) as info:
        launch(_raises, 1, args=(NeedsTwoArgs(7, "disk full"),), echo=False)
    assert "failed with NeedsTwoArgs: 7: disk full" in str(info.value)

    class Local(Exception):  # defined in a function: it cannot be named, so it cannot come back
        pass

    with pytest.raises(RankFailedError) as info:
        launch(_raises, 1, args=(Local("x"),), echo=False)
    assert info.value.exc_type == "Local" and info.value.exc_class is None


def test_types_that_must_not_or_cannot_be_mixed_in():
    args = (0, 2, "X", "msg", "Traceback ...")
    exit_err = rank_failed_error(*args, exc_class=SystemExit)  # a SystemExit would end the caller's Python
    assert type(exit_err) is RankFailedError and exit_err.exc_class is SystemExit
    final = rank_failed_error(*args, exc_class=CannotBeSubclassed)
    assert type(final) is RankFailedError and final.exc_class is CannotBeSubclassed
    key = rank_failed_error(*args, exc_class=KeyError)
    assert isinstance(key, KeyError) and str(key).startswith("rank 0 of 2 failed with X: msg"), \
        "KeyError's own __str__ (a repr) must not replace the message"
    oserr = rank_failed_error(*args, exc_class=FileNotFoundError)
    assert isinstance(oserr, FileNotFoundError) and isinstance(oserr, RankFailedError)
    again = pickle.loads(pickle.dumps(oserr))
    assert type(again) is type(oserr) and str(again) == str(oserr) and again.rank == 0


def _long_second_failure(rank, world_size, sentence):
    if rank == 1:
        raise ValueError("the first failure")
    time.sleep(0.2)  # fails too, later, inside launch's grace period
    raise RuntimeError(sentence + " A second sentence follows. And a third one, quite long " + "x" * 200)


def test_the_then_summary_keeps_whole_sentences():
    sentence = "This first sentence is " + "very " * 40 + "long and must not be cut halfway."
    with pytest.raises(ValueError) as info:
        launch(_long_second_failure, 2, args=(sentence,), timeout=30, echo=False)
    then = str(info.value).split("(then: ", 1)[1].split("\n")[0]
    assert then.startswith("rank 0 RuntimeError: ") and sentence in then, then
    assert "x" * 10 not in then, "the summary should stop at a sentence end"
    assert summary(GLOO_PEER_GONE).endswith("crashing. [...]")
    assert summary("one line\nand more") == "one line [...]" and summary(None) == ""
