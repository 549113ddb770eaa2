"""How ranks start and meet: the backend, each rank's device and threads, fork or spawn, the port.

The decisions :func:`gpulab.parallel.launcher.launch` makes before it starts a process, each one a
function so it can be tested (and reused by a torchrun script) on its own:

- :func:`resolve_backend`: lab 00's rule (:func:`gpulab.devices.choose_backend`) applied to this
  machine (:meth:`gpulab.devices.MachineSpec.this_machine`), plus a clear error when ``"nccl"`` is
  asked for without one GPU per rank;
- :func:`rank_device`: lab 00's placement (:func:`gpulab.devices.place_ranks`) under nccl, the CPU
  under gloo;
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

from gpulab.devices.machine import MachineSpec, choose_backend, place_ranks
from gpulab.parallel.launcher import _worker

__all__ = ["resolve_backend", "rank_device", "threads_per_rank"]

_BACKENDS = ("auto", "gloo", "nccl")
PORT_ATTEMPTS = 5  # a free port can be taken between choosing it and binding it: retry


def threads_per_rank(world_size: int) -> int:
    """Intra-op threads for each of ``world_size`` ranks sharing this machine's cores (>= 1)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)


def resolve_backend(backend: str, world_size: int) -> str:
    """``"auto"`` -> :func:`~gpulab.devices.choose_backend` on this machine: ``"nccl"`` when every rank
    can own a GPU (and NCCL is built in), else ``"gloo"``.

    Raises:
        ValueError: for an unknown backend, a ``world_size`` that is not a positive int, or
            ``"nccl"`` without one GPU per rank.
    """
    if backend not in _BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {_BACKENDS}; use 'auto' to let launch() choose")
    machine = MachineSpec.this_machine()  # fork-safe: counts GPUs without initialising CUDA
    best = choose_backend(machine, world_size)
    if backend == "auto":
        return best
    if backend == "nccl" and best != "nccl":
        have = ("this torch has no NCCL (a CPU build?)" if not machine.nccl
                else f"this machine has {machine.usable_gpus} usable GPU(s)")
        raise ValueError(f"backend='nccl' needs one CUDA GPU per rank ({world_size} ranks) but {have}; "
                         "use backend='gloo' (works on CPUs and shared GPUs) or backend='auto'")
    return backend


def rank_device(rank: int | None = None) -> torch.device:
    """The device a rank should compute on: its GPU from :func:`~gpulab.devices.place_ranks` under
    nccl (``cuda:<local rank>``), else the CPU.

    Under gloo the CPU is kept even on a GPU machine: gloo was chosen because the ranks cannot each
    own a GPU (or NCCL is missing), gloo usually copies CUDA tensors through host memory anyway, and
    it implements only some collectives for CUDA tensors, so CPU tensors are the case that always works.

    Call it inside a launched (or torchrun-started) rank, after the process group is initialised.

    Args:
        rank: the rank's local index; default ``LOCAL_RANK`` (torchrun), else the process group's rank.
    """
    import torch.distributed as dist

    if rank is None:
        rank = int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))
    if dist.is_initialized() and dist.get_backend() == "nccl":
        # this node's view: its GPUs and its ranks (torchrun's LOCAL_WORLD_SIZE; gpulab's launcher is one node)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        return torch.device(place_ranks(MachineSpec.this_machine(), max(local_world, rank + 1))[rank])
    return torch.device("cpu")


def _fork_poisoned() -> bool:
    """Would a forked child fail to use CUDA? (torch marks children forked after CUDA init.)"""
    # torch.cuda._is_compiled (private): the "CUDA build?" test that touches no driver
    if not torch.cuda._is_compiled():
        return False  # a CPU build cannot initialise CUDA
    if torch.cuda.is_initialized():
        return True
    # torch._C._cuda_isInBadFork (private, hence getattr) is the flag behind torch's "Cannot
    # re-initialize CUDA in forked subprocess"; no public API asks it
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
        except Exception as err:  # any pickling failure means the same thing
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
