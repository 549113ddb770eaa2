"""Start ``world_size`` ranks from Python, even from a notebook: :func:`launch`.

    launch(worker, 2)   # worker(rank, world_size) in each rank; returns [rank 0's value, rank 1's]

``mp.spawn(main_worker, nprocs=n)`` cannot start a function defined in a notebook (a fresh
interpreter looks it up by name in ``__main__``) and re-imports torch in every rank. ``launch``
forks instead where it can, so notebook functions, lambdas and closures work and a 2-rank start
takes well under a second; it spawns where fork cannot work (CUDA initialised here, Windows) and
then says what must be importable. Each rank's output is echoed with a ``[rank r]`` prefix; a
failing rank stops the others and raises :class:`RankFailedError` with its traceback; a hung
collective raises :class:`LaunchTimeoutError` after ``timeout``. No rank outlives the call.
The details of each choice are in the comment below the imports.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import multiprocessing.connection
import os
import signal
import tempfile
import time
import uuid
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch

from gpulab.parallel.launcher import _worker, startup
from gpulab.parallel.launcher._watchdog import Watchdog
from gpulab.parallel.launcher._worker import RankConfig
from gpulab.parallel.launcher.failures import (
    LaunchTimeoutError,
    RankFailedError,
    blame,
    class_from_blob,
    rank_failed_error,
    summary,
)
from gpulab.parallel.launcher.startup import (
    PORT_ATTEMPTS,
    _choose_start_method,
    resolve_backend,
    threads_per_rank,
)

# How launch works, and why.
# - fork: a forked rank is a copy of the caller's memory, so fn needs no pickling and torch is
#   already imported. The CUDA driver does not survive a fork, so fork is used only when the ranks
#   will not need CUDA or this process has not initialised it (torch.cuda.is_available() calls
#   cuInit; PYTORCH_NVML_BASED_CUDA_CHECK=1 checks through NVML instead). Python >= 3.14 defaults to
#   forkserver; fork is requested explicitly, so that default does not matter.
# - spawn otherwise (Windows; nccl ranks after CUDA was initialised here): fn and args must be
#   picklable and importable, defined in a .py file; if they are not, ValueError says how to fix it
#   before anything starts.
# - rendezvous: rank 0 hosts a TCPStore on 127.0.0.1 on a free port; if another process takes the
#   port first, the ranks are stopped and started again on another one.
# - failures: the rank blamed is the cause, not a rank whose collective failed because its peer
#   vanished (failures.py); on a timeout every rank is stopped and the error says where each waited.
# - no rank process (nor a DataLoader worker or subprocess it started) outlives launch, nor its
#   caller, even one killed with SIGKILL (_watchdog.py).
# - the caller's garbage stays with the caller: a forked rank copies unreachable cycles that the
#   caller's collector has not freed yet. Collected in the rank, one that holds a C++ object with a
#   thread (a TCPStore server, a gloo process group, a DataLoader's pin-memory thread) waits forever
#   in its destructor for a thread that the fork did not copy, and the rank hangs in whatever line
#   allocated ("Garbage-collecting" in the stack). So the caller collects just before forking, with
#   its collector paused until the ranks exist, and each forked rank freezes what it inherited
#   (gc.freeze: never collected there) before it turns collection on again.


__all__ = ["launch", "RankFailedError", "LaunchTimeoutError"]

_FAILURE_GRACE_S = 1.0  # after a first failure, how long the other ranks get to report their own


def _kill_group(pid: int) -> None:
    """SIGKILL a rank and everything in its process group (its DataLoader workers)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError, OSError):
        pass
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, OSError):
        pass


class _Echo:
    """Copies complete new lines of each rank's log to our stdout, prefixed with the rank."""

    def __init__(self, workdir: str, world_size: int, enabled: bool):
        self.paths = [_worker.log_path(workdir, r) for r in range(world_size)]
        self.offsets = [0] * world_size
        self.partial = [""] * world_size
        self.enabled = enabled

    def poll(self, final: bool = False) -> None:
        if not self.enabled:
            return
        for r, path in enumerate(self.paths):
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(self.offsets[r])
                    chunk = f.read()
                    self.offsets[r] = f.tell()
            except FileNotFoundError:
                continue
            lines = (self.partial[r] + chunk).split("\n")
            self.partial[r] = "" if final else lines.pop()
            for line in lines if not final else [ln for ln in lines if ln]:
                print(f"[rank {r}] {line}", flush=True)


def _read_record(workdir: str, rank: int, exitcode: int | None, seen_at: float) -> dict[str, Any]:
    """The rank's own record, or one written for it: it died at ``seen_at`` at the latest."""
    path = _worker.result_path(workdir, rank)
    if path.exists():
        # map_location: a CUDA tensor returned by a rank must not initialise CUDA here (fork rule).
        return torch.load(path, map_location="cpu", weights_only=False)
    how = (f"killed by {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0
           else f"exit code {exitcode}")
    return {"ok": False, "type": "ProcessDied", "time": seen_at, "peer_lost": False,
            "message": f"the process ended ({how}) without reporting (out of memory? a crash in C++? os._exit?)",
            "traceback": "(no Python traceback: see this rank's output above)"}


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    backend: str = "auto",
    timeout: float = 120,
    *,
    port: int | None = None,
    start_method: str | None = None,
    threads: int | None = None,
    echo: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes joined in a process group.

    Each rank has ``torch.distributed`` initialised (through a TCPStore that rank 0 hosts on
    127.0.0.1), torchrun's environment variables set, and ``threads`` intra-op threads. See the
    module docstring for how the processes are started and why.

    Args:
        fn: the rank's work; may be defined in a notebook cell. Its return value comes back.
        world_size: number of ranks (processes), >= 1.
        args: extra positional arguments for ``fn``.
        backend: ``"auto"`` (nccl if every rank can own a GPU, else gloo), ``"gloo"`` or ``"nccl"``.
        timeout: seconds for the whole run (start-up included) and for each collective.
        port: try this rendezvous port first (a free one is used, with a warning, if it is taken).
        start_method: force ``"fork"`` or ``"spawn"`` (default: chosen as the module docstring says).
        threads: intra-op threads per rank; default ``cores // world_size`` (at least 1), so the
            ranks do not oversubscribe the cores they share. A rank forked from a caller whose
            thread pool has more than one thread gets 1: GNU OpenMP (torch's CPU thread pool) hangs
            in such a child as soon as it uses more (torch's DataLoader workers take 1 for the same reason).
        echo: print each rank's output here, prefixed ``[rank r]``.

    Returns:
        The return values of ``fn``, in rank order (tensors come back on the CPU).

    Raises:
        ValueError: bad ``world_size``/``timeout``/``backend``, nccl without a GPU per rank, or a
            ``fn`` that cannot be sent to the ranks (the message says how to fix each).
        RankFailedError: a rank raised or died; its traceback is in the message. It is also an
            instance of the rank's exception type where that can be subclassed (``except
            ValueError`` catches a ValueError raised in a rank); ``exc_class`` holds that type.
        LaunchTimeoutError: ranks were still running after ``timeout`` seconds (a hung collective).

    Warning:
        A forked rank shares nothing with the caller after the fork: changes it makes to objects
        (a model, a list) stay in the rank. Return what the caller needs. The other way round, a
        rank inherits every module the caller has imported, and pays again for every lazy import
        it triggers itself: torch's ``DistributedDataParallel`` imports ``torch._dynamo`` on first
        use (about 3 s on 2 cores, in every rank of every launch), so ``import torch._dynamo`` in
        the caller first when the ranks will build torch DDP.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1 (the number of processes), got {world_size!r}")
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not callable(fn):
        raise ValueError(f"fn must be a function called as fn(rank, world_size, *args), got {fn!r}")
    args = tuple(args)
    backend = resolve_backend(backend, world_size)
    method = _choose_start_method(fn, args, backend, start_method)
    if method == "fork" and torch.get_num_threads() > 1:  # this process's OpenMP pool may be running
        if threads is not None and threads > 1:
            warnings.warn(f"threads={threads}: a rank forked from a process with {torch.get_num_threads()} intra-op "
                          "threads runs one (OpenMP's pool cannot be used again after a fork); call "
                          "torch.set_num_threads(1) before the first parallel op here, or start_method='spawn'",
                          stacklevel=2)
        threads = 1
    threads = threads or threads_per_rank(world_size)
    deadline = time.monotonic() + timeout
    wanted = port
    for _ in range(PORT_ATTEMPTS):
        try:
            return _run(fn, args, world_size, backend, method, wanted or startup._free_port(), threads, timeout, deadline, echo)
        except _PortTaken as err:
            if wanted is not None:
                warnings.warn(f"port {wanted} is already in use on {_worker.HOST}; using a free port instead",
                              stacklevel=2)
            wanted, last = None, err
    raise RuntimeError(f"could not find a free rendezvous port on {_worker.HOST} in {PORT_ATTEMPTS} tries ({last})")


class _PortTaken(Exception):
    pass


@contextlib.contextmanager
def _collected_before_fork(forking: bool) -> Iterator[None]:
    """Free the caller's garbage here, and keep the collector off until the ranks are forked.

    A forked rank starts with the collector off (the fork copies that state) and turns it on in
    ``_worker.rank_main`` after ``gc.freeze()``; the comment below the imports says why.
    """
    if not forking:
        yield
        return
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run(fn: Callable[..., Any], args: tuple, world_size: int, backend: str, method: str, port: int, threads: int,
         timeout: float, deadline: float, echo: bool) -> list[Any]:
    """One attempt: start the ranks on ``port``, supervise them, clean up whatever happens."""
    ctx = multiprocessing.get_context(method)
    with tempfile.TemporaryDirectory(prefix="gpulab-launch-") as workdir:
        # Ranks go when the caller goes, and so does everything they start: PDEATHSIG kills each rank
        # (see _worker), the watchdog kills each rank's process group (see _watchdog for why both).
        watchdog = Watchdog()
        cfg = RankConfig(world_size, backend, port, float(timeout), threads, workdir, os.getpid(), uuid.uuid4().hex,
                         watchdog.fd if method == "fork" else None,  # a spawned rank has no copy to close
                         gc_enabled=gc.isenabled())
        procs: dict[int, Any] = {}
        echo_out = _Echo(workdir, world_size, echo)
        try:
            with _collected_before_fork(method == "fork"):
                for rank in range(world_size):
                    p = ctx.Process(target=_worker.rank_main, args=(fn, rank, args, cfg), daemon=False,
                                    name=f"gpulab-rank{rank}")
                    p.start()
                    try:
                        os.setpgid(p.pid, p.pid)  # also done in the child; whichever runs first wins the race
                    except (OSError, AttributeError):
                        pass
                    procs[rank] = p
                    watchdog.watch(p.pid)
            return _supervise(procs, workdir, world_size, timeout, deadline, echo_out)
        finally:
            for p in procs.values():
                if p.exitcode is None:
                    _kill_group(p.pid)
                p.join()
            watchdog.close()
            echo_out.poll(final=True)


def _supervise(procs: dict[int, Any], workdir: str, world_size: int, timeout: float, deadline: float,
               echo_out: _Echo) -> list[Any]:
    results: dict[int, Any] = {}
    failures: list[tuple[int, dict[str, Any]]] = []
    pending = set(procs)
    first_failure = None
    while pending:
        now = time.monotonic()
        if first_failure is not None and now - first_failure > _FAILURE_GRACE_S:
            break  # the others are most likely stuck waiting for the failed rank
        if now >= deadline:
            raise LaunchTimeoutError(sorted(pending), world_size, timeout, _dump_stacks(procs, pending, workdir))
        ready = multiprocessing.connection.wait([procs[r].sentinel for r in pending], timeout=min(0.1, deadline - now))
        seen_at = time.time()  # a rank that dies without reporting died before this
        echo_out.poll()
        for rank in [r for r in pending if procs[r].sentinel in ready]:
            _kill_group(procs[rank].pid)  # stray grandchildren; the exited rank is a zombie until joined
            procs[rank].join()
            pending.discard(rank)
            record = _read_record(workdir, rank, procs[rank].exitcode, seen_at)
            if record["ok"]:
                results[rank] = record["value"]
            else:
                failures.append((rank, record))
                first_failure = first_failure or time.monotonic()
                if record["type"] == "PortInUse":
                    pending.clear()  # nothing ran yet: stop everyone now and retry on another port
    if failures:
        failures = blame(failures)  # the cause first (by cause, then by time); the rest follow from it
        rank, rec = failures[0]
        if rec["type"] == "PortInUse":
            raise _PortTaken(rec["message"])
        others = [f"rank {r} {o['type']}: {summary(o['message'])}" for r, o in failures[1:]]
        raise rank_failed_error(rank, world_size, rec["type"], rec["message"], rec["traceback"], others,
                                class_from_blob(rec.get("class")))
    return [results[r] for r in range(world_size)]


def _dump_stacks(procs: dict[int, Any], ranks: set[int], workdir: str) -> dict[int, str]:
    """Ask each hung rank for its Python stacks (faulthandler on SIGUSR1) before it is killed."""
    if not hasattr(signal, "SIGUSR1"):
        return {}
    for r in ranks:
        try:
            os.kill(procs[r].pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(0.5)
    stacks = {}
    for r in ranks:
        try:
            text = _worker.stack_path(workdir, r).read_text(errors="replace")
        except OSError:
            continue
        # faulthandler lists the most recent call first; frames below rank_main are launch's own.
        lines = text.splitlines()
        cut = next((i for i, ln in enumerate(lines) if "in rank_main" in ln), len(lines))
        stacks[r] = "\n".join(lines[:cut])
    return stacks
