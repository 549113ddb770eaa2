"""Starting ranks (labs 06, 09, 11): :func:`launch` runs ``fn(rank, world_size)`` in ``world_size``
processes, even from a notebook, and supervises them.

- ``launch``: fork (or spawn), the rendezvous, each rank's output echoed, the results in order;
- ``startup``: the decisions made before a process starts (backend, device, threads, port);
- ``_worker``: what runs inside a rank; ``_watchdog``: no rank outlives its caller;
- ``failures``: what a failed launch reports, and which rank it blames.

As ``torch.nn.parallel`` does with ``replicate``, the function :func:`launch` hides its module's
name here: import the module as ``from gpulab.parallel.launcher.launch import ...``.
"""

from gpulab.parallel.launcher.launch import LaunchTimeoutError, RankFailedError, launch
from gpulab.parallel.launcher.startup import rank_device, resolve_backend, threads_per_rank

__all__ = ["launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank"]
