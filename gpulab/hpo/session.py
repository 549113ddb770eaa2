"""Start Ray for a search and always take it down again: no raylet, GCS or worker left behind.

``ray.init()`` starts a small cluster on this machine: the GCS (the cluster's metadata store),
a raylet (the scheduler, which forks one worker process per task or actor), a log monitor, an
autoscaler monitor and a couple of agents; here that takes 5-15 s on 2 busy cores. A notebook
that forgets ``ray.shutdown()`` keeps all of them running, and a test that does leaks them into
the next. :class:`RaySession` owns that life cycle::

    with ray_session(num_cpus=2) as session:       # ray.init(num_cpus=2, include_dashboard=False)
        tuner = tune.Tuner(train_classifier, param_space=...,
                           run_config=session.run_config())   # results under a temp dir, quiet
        results = tuner.fit()
    # here: ray.shutdown() ran, every Ray process that this session started has exited (psutil)

Which GPUs a trial sees: Ray sets ``CUDA_VISIBLE_DEVICES`` in a trial's process to the GPUs it
was given, but Ray 2.60 does so only for a trial given at least one GPU; a trial that asks for
none still sees them all. The session sets ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` (Ray's switch
for its former behaviour), so such a trial sees none (``CUDA_VISIBLE_DEVICES=""``) and trains on
the CPU, as its request says (:mod:`gpulab.hpo.resources`).

Where things go: Ray's session files (logs, sockets) and Tune's results live in one temporary
folder (``$TMPDIR``, so a grading sandbox's own tmp), never ``/tmp/ray`` or ``~/ray_results``,
and the folder is removed on shutdown. Unix sockets must fit in 107 bytes, so a long ``$TMPDIR``
falls back to ``/dev/shm``.

The cluster path changes one argument: on the head machine ``ray start --head --port=6379``, on
each other machine ``ray start --address=HEAD:6379``, and in the notebook
``ray_session(address="HEAD:6379")`` (``ray.init(address=...)``); shutting down then only
disconnects this driver and leaves the cluster running.

Idea and API: Ray's ``ray.init`` / ``ray.shutdown`` (docs.ray.io, "Starting Ray").
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from gpulab.hpo.resources import OVERRIDE_ON_ZERO

__all__ = ["RaySession", "ray_session", "ray_processes", "import_ray", "QUIET_ENV"]

# Environment for a quiet, offline Ray: no usage-stats upload (there is no network in a grading
# sandbox), Tune's classic reporter (which honours verbose=0), no warning about checkpoint syncs.
# The experiment's state (for Tuner.restore) is saved at the start and end of a search and at
# most every 30 s between: a lab's searches are short, and each save costs the driver time.
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AIR_NEW_OUTPUT": "0", "RAY_DEDUP_LOGS": "0",
             "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "1000", "TUNE_GLOBAL_CHECKPOINT_S": "30"}
# session_YYYY-mm-dd_HH-MM-SS_ffffff_PID/sockets/plasma_store is about 63 characters; AF_UNIX
# paths stop at 107 bytes.
_MAX_TEMP_DIR = 40
# Ray gives a new raylet 30 s (hard-coded) to register with the GCS; on a machine loaded past
# that, try again (twice) before giving up
_START_ATTEMPTS = 3
# what a Ray process looks like: the node's binaries and the proctitles Ray's workers set
_RAY_NAMES = ("raylet", "gcs_server")
_RAY_CMD_MARKS = ("/ray/_private/", "/ray/autoscaler/", "/ray/dashboard/", "/ray/core/src/", "default_worker.py")


def _is_ray(proc: psutil.Process) -> bool:
    try:
        name = proc.name()
        if name in _RAY_NAMES or name.startswith("ray::"):
            return True
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
    return cmd.startswith("ray::") or any(m in cmd for m in _RAY_CMD_MARKS)


def import_ray() -> ModuleType:
    """``import ray`` (and check Tune and Optuna are there), with the fix named when they are not."""
    try:
        import optuna  # noqa: F401 - only checked
        import ray
        import ray.tune
    except ImportError as err:
        raise ImportError(f"lab 10 needs Ray Tune and Optuna, which are not installed ({err}). Run `make setup`, "
                          "which installs them, or `pip install -e '.[search]'`") from None
    return ray


def ray_processes(root_pid: int | None = None) -> list[psutil.Process]:
    """Ray processes (raylet, GCS, workers, agents) below ``root_pid`` (default: this process).

    A driver that calls ``ray.init()`` starts the GCS, the raylet and the monitors as its
    children; the raylet forks the workers, so they are grandchildren.
    """
    try:
        root = psutil.Process(os.getpid() if root_pid is None else root_pid)
        below = root.children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in below if _is_ray(p)]


def _short_temp_dir() -> Path:
    """A fresh folder for Ray's session files whose path leaves room for Ray's socket names."""
    base = Path(tempfile.gettempdir())
    for candidate in (base, Path("/dev/shm"), Path("/tmp")):
        if len(str(candidate)) + len("/gpulab-ray-xxxxxxxx") <= _MAX_TEMP_DIR and os.access(candidate, os.W_OK):
            return Path(tempfile.mkdtemp(prefix="gpulab-ray-", dir=candidate))
    raise RuntimeError(f"$TMPDIR={base} is too long for Ray's unix sockets (107 bytes) and /dev/shm and /tmp are "
                       f"not writable; set TMPDIR to a short writable folder, e.g. TMPDIR=/tmp")


class RaySession:
    """One Ray runtime for this process, started by :meth:`start` and always stopped by
    :meth:`shutdown` (also on ``with`` exit, on an exception, on KeyboardInterrupt, at exit).

    Args:
        num_cpus: CPUs Ray may hand to trials (default: all cores). Ignored with ``address``.
        num_gpus: GPUs Ray may hand out (default: what Ray detects). Ignored with ``address``.
        address: an existing cluster (``"HEAD:6379"``, ``"auto"``) instead of a local one.
        quiet: silence Ray's and Tune's logging and progress tables (errors still reach the
            ResultGrid).
        object_store_mb: size of the shared-memory object store (Ray's default takes 30 % of
            RAM; searches here pass only small configs and metrics). Ray's minimum is 75.
        grace_s: seconds to wait for Ray's processes to exit after ``ray.shutdown()`` before
            they are terminated.

    Raises:
        ValueError: for ``num_cpus`` < 1 or ``object_store_mb`` < 75.
    """

    def __init__(self, num_cpus: int | None = None, num_gpus: int | None = None, *, address: str | None = None,
                 quiet: bool = True, object_store_mb: int = 100, grace_s: float = 10.0) -> None:
        if num_cpus is not None and num_cpus < 1:
            raise ValueError(f"num_cpus must be >= 1, got {num_cpus}; Ray needs at least one CPU to run a trial")
        if object_store_mb < 75:
            raise ValueError(f"object_store_mb={object_store_mb} is below Ray's minimum of 75 MiB; use 75 or more")
        self.num_cpus, self.num_gpus, self.address = num_cpus, num_gpus, address
        self.quiet, self.object_store_mb, self.grace_s = quiet, object_store_mb, grace_s
        self.temp_dir: Path | None = None
        self.startup_s = 0.0
        self.leftovers: list[str] = []  # processes that had to be killed on shutdown
        self._tracked: dict[int, float] = {}  # pid -> create_time of every Ray process seen
        self._started = False

    @property
    def storage_path(self) -> str:
        """Where Tune writes results and checkpoints (inside the session's temp folder)."""
        if self.temp_dir is None:
            raise RuntimeError("the session is not started; call start() or use `with ray_session(...)`")
        return str(self.temp_dir / "results")

    def start(self) -> "RaySession":
        """``ray.init`` with the dashboard off, quiet, files in a temp folder.

        Raises:
            RuntimeError: if Ray is already initialised in this process (shut it down first).
            ImportError: Ray Tune or Optuna is not installed (the ``search`` extra; it names the fix).
        """
        ray = import_ray()

        if ray.is_initialized():
            raise RuntimeError("Ray is already running in this process; call ray.shutdown() (or the other session's "
                               "shutdown()) before starting a new session")
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        # a trial given no GPU must not see any (Ray 2.60 leaves them visible): the raylet and its
        # workers inherit this process's environment; a cluster's workers get it with the job
        os.environ[OVERRIDE_ON_ZERO] = "1"
        if self.quiet:
            for name in ("ray", "ray.tune", "ray.train", "ray.data"):
                logging.getLogger(name).setLevel(logging.ERROR)
            warnings.filterwarnings("ignore", module=r"ray(\.|$)")
        self.temp_dir = _short_temp_dir()
        kwargs: dict[str, Any] = dict(include_dashboard=False, logging_level=logging.ERROR if self.quiet else logging.INFO,
                                      log_to_driver=not self.quiet, configure_logging=True)
        if self.address is None:
            kwargs.update(num_cpus=self.num_cpus or os.cpu_count() or 1, _temp_dir=str(self.temp_dir),
                          object_store_memory=self.object_store_mb * 2**20)
            if self.num_gpus is not None:
                kwargs["num_gpus"] = self.num_gpus
            # Ray kills idle workers beyond one per CPU about a second after they finish; packed
            # trials (several per core or GPU) then pay a worker start each time (measured on 2 busy
            # cores: a packed run 0.24 s warm, 0.75-4.0 s after 3 s idle). Keep idle workers a minute.
            kwargs["_system_config"] = {"idle_worker_killing_time_threshold_ms": 60_000}
        else:  # the cluster's workers were not started from here: the job carries the variable
            kwargs["runtime_env"] = {"env_vars": {OVERRIDE_ON_ZERO: "1"}}
        t0 = time.perf_counter()
        for attempt in range(1, _START_ATTEMPTS + 1):
            atexit.register(self.shutdown)
            self._started = True
            try:
                ray.init(address=self.address, **kwargs)
                break
            except BaseException as err:
                self._track()  # what the failed start left running, so that shutdown reaps it
                self.shutdown()
                if attempt == _START_ATTEMPTS or "timed out during startup" not in str(err):
                    raise
                self.temp_dir = _short_temp_dir()
                if self.address is None:
                    kwargs["_temp_dir"] = str(self.temp_dir)
        self.startup_s = time.perf_counter() - t0
        self._track()
        return self

    def _track(self) -> None:
        for p in ray_processes():
            try:
                self._tracked[p.pid] = p.create_time()
            except psutil.NoSuchProcess:
                pass

    def resources(self) -> dict[str, float]:
        """The cluster's resources as Ray counts them (``CPU``, ``GPU``, memory...)."""
        import ray

        return dict(ray.cluster_resources())

    def run_config(self, **kwargs: Any) -> Any:
        """A ``tune.RunConfig`` for this session: storage in the temp folder, no progress table,
        one checkpoint kept per trial. Keyword arguments override those defaults."""
        from ray import tune

        kwargs.setdefault("storage_path", self.storage_path)
        kwargs.setdefault("verbose", 0 if self.quiet else 1)
        kwargs.setdefault("checkpoint_config", tune.CheckpointConfig(num_to_keep=1))
        return tune.RunConfig(**kwargs)

    def shutdown(self) -> list[str]:
        """``ray.shutdown()``, then wait for every Ray process this session saw to exit; kill any
        that did not within ``grace_s``. Safe to call twice.

        Returns:
            Descriptions of the processes that had to be killed (also kept in ``leftovers``).
        """
        import ray

        if not self._started:
            return []
        self._started = False
        atexit.unregister(self.shutdown)
        if self.address is None:
            self._track()  # workers started since start(), before the raylet that owns them goes
        try:
            ray.shutdown()
        finally:
            self.leftovers = self._reap()
            if self.temp_dir is not None:
                shutil.rmtree(self.temp_dir, ignore_errors=True)
        return self.leftovers

    def _reap(self) -> list[str]:
        procs = []
        for pid, created in self._tracked.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:  # not a new process that reused the pid
                    procs.append(p)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=self.grace_s)
        killed = []
        for p in alive:
            try:
                killed.append(f"{p.pid} {p.name()}")
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._tracked.clear()
        return killed

    def __enter__(self) -> "RaySession":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        where = self.address or f"local, num_cpus={self.num_cpus or os.cpu_count()}"
        state = "running" if self._started else "stopped"
        return f"RaySession({where}, {state}, started in {self.startup_s:.1f} s)"


def ray_session(num_cpus: int | None = None, num_gpus: int | None = None, **kwargs: Any) -> RaySession:
    """A :class:`RaySession` to use in ``with``: ``with ray_session(num_cpus=2) as session: ...``.

    In a notebook where starting Ray once matters (it takes seconds), use
    ``session = ray_session(2).start()`` in the first cell and ``session.shutdown()`` in the last;
    the session also shuts down when the kernel exits.
    """
    return RaySession(num_cpus, num_gpus, **kwargs)
