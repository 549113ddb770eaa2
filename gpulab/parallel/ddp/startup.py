"""How ranks start and meet: the backend, each rank's device and threads, fork or spawn, the port.

The decisions :func:`gpulab.parallel.ddp.launch` makes before it starts a process, each one a
function so it can be tested (and reused by a torchrun script) on its own:

- :func:`resolve_backend`: nccl only when every rank owns a GPU (NCCL refuses two ranks on one
  GPU and has no CPU path), gloo otherwise;
- :func:`rank_device`: ``cuda:<local rank>`` under nccl, else the CPU;
- :func:`threads_per_rank`: ``cores // world_size``, because ranks share the cores;
- the start method (fork unless CUDA forbids it, see ``launch.py``) and whether ``fn`` can be
  sent to a spawned process at all;
- the rendezvous port: a free port on 127.0.0.1 (rank 0 hosts the TCPStore there; the launch is
  retried on another port if someone else takes it first).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys
from typing import Callable

import torch

from gpulab.parallel.ddp import _worker

__all__ = ["resolve_backend", "rank_device", "threads_per_rank"]

_BACKENDS = ("auto", "gloo", "nccl")
PORT_ATTEMPTS = 5  # a free port can be taken between choosing it and binding it: retry


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads for each of ``world_size`` ranks sharing this machine's cores (>= 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)


def _usable_gpus() -> int:
    # torch.cuda.device_count() asks NVML first and so does not initialise CUDA (which would make
    # every later fork unable to use the GPU); torch.cuda.is_available() would.
    try:
        return torch.cuda.device_count() if torch.cuda._is_compiled() else 0
    except Exception:  # noqa: BLE001 - a broken driver means "no GPUs" here
        return 0


def resolve_backend(backend: str, world_size: int) -> str:
    """``"auto"`` -> ``"nccl"`` when every rank can own a GPU (and NCCL is built in), else ``"gloo"``.

    Raises:
        ValueError: for an unknown backend, or ``"nccl"`` without one GPU per rank.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {_BACKENDS}; use 'auto' to let launch() choose")
    gpus = _usable_gpus()
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    if backend == "auto":
        return "nccl" if nccl and gpus >= world_size else "gloo"
    if backend == "nccl" and not (nccl and gpus >= world_size):
        have = "this torch has no NCCL (a CPU build?)" if not nccl else f"this machine has {gpus} usable GPU(s)"
        raise ValueError(f"backend='nccl' needs one CUDA GPU per rank ({world_size} ranks) but {have}; "
                         "use backend='gloo' (works on CPUs and shared GPUs) or backend='auto'")
    return backend


def rank_device(rank: int | None = None) -> torch.device:
    """The device a rank should compute on: ``cuda:<local rank>`` under nccl, else the CPU.

    Call it inside a launched (or torchrun-started) rank, after the process group is initialised.
    """
    import torch.distributed as dist

    if rank is None:
        rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _fork_poisoned() -> bool:
    """Would a forked child fail to use CUDA? (torch marks children forked after CUDA init.)"""
    if not torch.cuda._is_compiled():
        return False  # a CPU build cannot initialise CUDA
    if torch.cuda.is_initialized():
        return True
    probe = getattr(torch._C, "_cuda_isInBadFork", None)
    if probe is None or not hasattr(os, "fork"):
        return False
    pid = os.fork()  # a millisecond probe: ask a throw-away child whether torch flags it
    if pid == 0:
        os._exit(3 if probe() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 3


def _check_sendable(fn: Callable, args: tuple, why: str) -> None:
    """Raise ValueError (naming the fix) if spawn could not recreate ``fn`` and ``args`` in a child."""
    name = getattr(fn, "__qualname__", repr(fn))
    main = sys.modules.get("__main__")
    problem = ""
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        problem = f"{name} is defined in this notebook/interactive session, which a spawned process cannot import"
    else:
        try:
            pickle.dumps((fn, args))
        except Exception as err:  # noqa: BLE001 - any pickling failure means the same thing
            problem = f"{name} or its args cannot be pickled ({type(err).__name__}: {err})"
    if problem:
        raise ValueError(
            f"launch() cannot send the function to the worker processes: {problem}. It must use spawn "
            f"because {why}. Fix: move the function into a .py file next to the notebook and import it "
            "(from my_workers import worker), passing only picklable args; or, on Linux, restart the "
            "kernel and call launch() before anything initialises CUDA so fork can be used.")


def _choose_start_method(fn: Callable, args: tuple, backend: str, requested: str | None) -> str:
    available = multiprocessing.get_all_start_methods()
    if requested is not None:
        if requested not in available:
            raise ValueError(f"start_method={requested!r} is not available here; choose one of {available}")
        if requested != "fork":
            _check_sendable(fn, args, f"start_method={requested!r} was requested")
        elif backend == "nccl" and _fork_poisoned():
            raise ValueError("start_method='fork' with backend='nccl', but CUDA is already initialised in this "
                             "process, so forked ranks cannot use their GPU; restart the kernel and call launch() "
                             "before any CUDA call, or use start_method='spawn'")
        return requested
    if "fork" not in available:
        why = "this platform has no fork"
    elif backend == "nccl" and _fork_poisoned():
        why = "CUDA is already initialised in this process and a forked rank could not use its GPU"
    else:
        return "fork"
    _check_sendable(fn, args, why)
    return "spawn"


def _free_port() -> int:
    """A port the OS reports free right now (another process may still take it: we retry)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((_worker.HOST, 0))
        return s.getsockname()[1]
