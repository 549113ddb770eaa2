"""gpulab.hpo.session without the ``search`` extra: a clear error that names the fix, before Ray starts."""

import subprocess
import sys


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
