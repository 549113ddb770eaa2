"""gpulab.autograde.box.probe: a snippet runs where and as a graded kernel runs (its namespaces, uid,
jail and environment); on a GPU machine CUDA works there: a context, a matmul, a compiled function."""

from __future__ import annotations

import pytest

from gpulab.autograde.box.probe import COMPILE_PROBE, CUDA_PROBE, run_as_kernel
from gpulab.confine import isolation

PLAN = isolation.detect()

SEEN = """
import os, resource, torch
print("uid", os.getuid())
print("opt", sorted(os.listdir("/opt")) if os.path.isdir("/opt") else None)
print("home", os.environ["HOME"].endswith("/tmp/home"), "secret" in os.environ)
print("rlimit", resource.getrlimit(resource.RLIMIT_DATA)[0] // 2**20)
print("sum", float(torch.ones(3).sum()))
"""


def test_a_snippet_runs_as_the_graded_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpulab.confine import cuda_paths

    if cuda_paths.machine().present:
        pytest.skip("a GPU machine: no data rlimit there (the GPU test below runs instead)")
    monkeypatch.setenv("secret", "canary")
    proc = run_as_kernel(SEEN, timeout_s=120, plan=PLAN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sum 3.0" in proc.stdout and "home True False" in proc.stdout and "rlimit 4096" in proc.stdout
    if PLAN.namespaces:
        assert "opt []" in proc.stdout or "opt None" in proc.stdout  # the rest of the machine is hidden
    if PLAN.kernel_uid:
        assert "uid 0" not in proc.stdout


def test_past_its_timeout_the_snippet_is_stopped() -> None:
    proc = run_as_kernel("import time; print('started', flush=True); time.sleep(60)", timeout_s=3, plan=PLAN)
    assert proc.returncode == 124 and "started" in proc.stdout and "stopped after 3 s" in proc.stderr


@pytest.mark.gpu
def test_cuda_works_in_the_sandbox() -> None:
    proc = run_as_kernel(CUDA_PROBE + COMPILE_PROBE, timeout_s=300, plan=PLAN)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "zeros ok cuda:0" in out and "matmul ok" in out and "compile ok" in out
    assert "'CUDA_DEVICE_ORDER': 'PCI_BUS_ID'" in out
