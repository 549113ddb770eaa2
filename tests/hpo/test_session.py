"""gpulab.hpo.session without the ``search`` extra: a clear error that names the fix, before Ray starts;
with it, a session that keeps the idle workers packed trials need."""

import subprocess
import sys
import time

import pytest


def _start_without(module: str) -> subprocess.CompletedProcess:
    code = (f"import sys; sys.modules[{module!r}] = None\n"  # the import of that module now fails
            "from gpulab.hpo.session import RaySession\n"
            "RaySession(num_cpus=1).start()\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_missing_search_extra_names_the_fix() -> None:
    for module in ("ray", "optuna"):
        proc = _start_without(module)
        assert proc.returncode != 0
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: lab 10 needs Ray Tune and Optuna"), proc.stderr[-2000:]
        assert "make setup" in last and ".[search]" in last


def test_import_gpulab_does_not_import_ray_or_optuna() -> None:
    code = ("import sys, gpulab, gpulab.hpo, gpulab.grading, gpulab.parallel\n"
            "print(sorted(m for m in ('ray', 'optuna') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_a_session_keeps_the_idle_workers_that_packed_trials_need() -> None:
    """Ray's default kills idle workers beyond one per CPU about a second after they finish, so
    packed trials (two per core) paid a worker start on each run: lab 10's graded packing check
    measured 0.09x once on a loaded machine. The session keeps them."""
    pytest.importorskip("ray", reason="lab 10 needs the search extra: pip install -e '.[search]'")
    from gpulab.grading import lab10
    from gpulab.hpo import ray_session
    from gpulab.hpo.session import ray_processes

    def workers() -> set[int]:
        return {p.pid for p in ray_processes() if p.name().startswith("ray::") or "default_worker" in " ".join(p.cmdline())}

    with ray_session(num_cpus=2):
        lab10.warm_probe({"cpu": 0.5})  # 8 tasks of half a core: 4 at once
        started = workers()
        time.sleep(3)  # Ray's default threshold is 1 s
        gone = started - workers()
        assert len(started) > 2 and not gone, f"Ray stopped {len(gone)} of {len(started)} idle workers"
