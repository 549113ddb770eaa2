"""What runs inside each rank started by :func:`gpulab.parallel.launcher.launch` (internal).

The parent (``launch.py``) picks the port, starts the ranks and supervises them; this module is the other
half: in the child process it

1. makes the rank the leader of its own process group, so the parent can stop it together with
   any DataLoader workers or subprocesses it started (``os.killpg``), and asks Linux to kill it if
   the parent dies (its group then goes too: see ``_watchdog.py``);
2. sends everything the rank prints (Python and C++ alike: fd 1 and 2) to a log file that the
   parent echoes with a ``[rank r]`` prefix, and arms ``faulthandler`` so the parent can ask a
   hung rank where it is stuck (SIGUSR1);
3. sets the environment torchrun would set (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
   ``MASTER_ADDR``, ``MASTER_PORT``, ``OMP_NUM_THREADS``) and the rank's intra-op threads;
4. joins the process group through a TCPStore that rank 0 hosts on the chosen port (rank 0 reports
   ``PortInUse`` if another process has it, and the parent retries on another port), runs ``fn(rank, world_size, *args)``
   and writes either the return value or the traceback to a file the parent reads. An error
   record keeps the exception's class (by reference, for ``except ValueError`` in the caller) and
   whether the error came from a vanished peer (so the parent blames the cause: ``failures.py``).

Files rather than pipes or queues carry the results back: a queue holding a large result blocks
the child until the parent reads it, and the parent only reads once the child has exited.
"""

from __future__ import annotations

import ctypes
import faulthandler
import gc
import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from gpulab.parallel.launcher import failures

HOST = "127.0.0.1"


@dataclass(frozen=True)
class RankConfig:
    """Everything a rank needs besides ``fn`` and its arguments (picklable, for spawn)."""

    world_size: int
    backend: str
    port: int
    timeout_s: float
    threads: int
    workdir: str
    parent_pid: int
    launch_id: str  # keys in the store are prefixed with it: a rank that reached the wrong store waits harmlessly
    watchdog_fd: int | None = None  # forked ranks inherit the watchdog's pipe and must close it (else no EOF)
    gc_enabled: bool = True  # the caller's collector setting, restored in a forked rank after gc.freeze()


def log_path(workdir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its stdout and stderr."""
    return Path(workdir) / f"rank{rank}.log"


def stack_path(workdir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` dumps its Python stacks when the parent sends SIGUSR1."""
    return Path(workdir) / f"rank{rank}.stack"


def result_path(workdir: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes ``{"ok": True, "value": ...}`` or its error record."""
    return Path(workdir) / f"rank{rank}.result"


def _die_with_parent(parent_pid: int) -> None:
    """Linux only: SIGKILL this rank if the parent process dies (a restarted kernel, kill -9).

    The kernel delivers it even to a rank stuck in C++ (a collective), which a Python-level handler
    could not promise. It does not reach what the rank starts (a fork clears the setting): the
    watchdog kills the rank's process group for those.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _capture_output(workdir: str, rank: int):
    """Point fd 1/2 and sys.stdout/stderr at the rank's log file; arm faulthandler."""
    log = open(log_path(workdir, rank), "a", buffering=1, encoding="utf-8", errors="replace")
    os.dup2(log.fileno(), 1)  # C++ warnings from gloo/c10 land here too
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    stacks = open(stack_path(workdir, rank), "w")
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    return log, stacks


def _set_env(rank: int, cfg: RankConfig) -> None:
    # The same variables torchrun sets, so code written for torchrun runs unchanged here.
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(cfg.world_size),
        LOCAL_WORLD_SIZE=str(cfg.world_size), MASTER_ADDR=HOST, MASTER_PORT=str(cfg.port),
        OMP_NUM_THREADS=str(cfg.threads), MKL_NUM_THREADS=str(cfg.threads),
    )


def _write(path: Path, record: dict[str, Any]) -> None:
    import torch

    tmp = path.with_suffix(".tmp")
    torch.save(record, tmp)  # pickles tensors efficiently; the parent loads with map_location="cpu"
    os.replace(tmp, path)  # atomic: the parent never reads half a file


class PortInUse(RuntimeError):
    """Rank 0 could not listen on the chosen port: another process took it first."""


def _rendezvous(rank: int, cfg: RankConfig):
    """Rank 0 hosts the TCPStore (as torchrun's MASTER_PORT rank does); the others connect to it."""
    import torch.distributed as dist

    # A store hosted by the caller instead was measured to stall forked ranks' connections for
    # 5 s now and then (torch 2.13, libuv server): rank 0 hosts it, after the fork.
    try:
        store = dist.TCPStore(HOST, cfg.port, cfg.world_size, rank == 0, timedelta(seconds=cfg.timeout_s),
                              wait_for_workers=False)
    except RuntimeError as err:
        if rank == 0 and ("EADDRINUSE" in str(err) or "address already in use" in str(err).lower()):
            raise PortInUse(f"port {cfg.port} on {HOST} is already in use") from None
        raise
    return dist.PrefixStore(f"gpulab/{cfg.launch_id}/", store)


def rank_main(fn: Callable[..., Any], rank: int, args: tuple, cfg: RankConfig) -> None:
    """Entry point of one rank (the ``target`` of its ``multiprocessing.Process``)."""
    if cfg.watchdog_fd is not None:  # forked: the caller's objects stay uncollected here (see launch.py)
        gc.freeze()
        if cfg.gc_enabled:
            gc.enable()
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted (rare); the parent then stops only the rank itself
        pass
    if cfg.watchdog_fd is not None:
        # Only the caller may hold the watchdog pipe's write end: its death must be the EOF. Replaced by
        # /dev/null rather than closed, because the fork copied the caller's file object that owns this
        # fd number, and a later open() must not get a number that object may close.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, cfg.watchdog_fd, inheritable=False)
        os.close(devnull)
    _die_with_parent(cfg.parent_pid)
    log, stacks = _capture_output(cfg.workdir, rank)
    _set_env(rank, cfg)

    import torch
    import torch.distributed as dist

    # Ranks share the machine's cores: one intra-op thread pool per rank of `cores` threads each
    # would oversubscribe them (torchrun sets OMP_NUM_THREADS=1 for the same reason).
    torch.set_num_threads(cfg.threads)
    failed = False
    try:
        device = None
        if cfg.backend == "nccl":  # one GPU per rank, placed by lab 00's rule (as rank_device does)
            from gpulab.devices.machine import MachineSpec, place_ranks

            device = torch.device(place_ranks(MachineSpec.this_machine(), cfg.world_size)[rank])
            torch.cuda.set_device(device)
        store = _rendezvous(rank, cfg)
        # device_id binds the NCCL communicator to this rank's GPU now, not at its first collective
        dist.init_process_group(cfg.backend, store=store, rank=rank, world_size=cfg.world_size,
                                timeout=timedelta(seconds=cfg.timeout_s), device_id=device)
        value = fn(rank, cfg.world_size, *args)
        dist.barrier()  # rank 0 hosts the store: it must not exit while another rank still needs it
        dist.destroy_process_group()
        try:
            _write(result_path(cfg.workdir, rank), {"ok": True, "value": value})
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            raise TypeError(f"rank {rank} returned a {type(value).__name__} that cannot be sent back to "
                            f"the caller ({err}); return tensors, numbers, lists or dicts instead") from err
    except BaseException as err:  # everything is reported to the parent
        when = time.time()  # one clock for every rank's records: the machine's
        failed = True
        _write(result_path(cfg.workdir, rank), {
            "ok": False, "type": type(err).__name__, "class": failures.class_blob(type(err)), "message": str(err),
            "traceback": traceback.format_exc(), "time": when, "peer_lost": failures.peer_lost(err)})
    finally:
        log.flush()
        stacks.flush()
    if failed:
        sys.exit(1)
