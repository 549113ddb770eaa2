"""One Python snippet run as a graded kernel is run: in a submission's namespaces and cgroup, under
the kernel's uid, through the jail's limits, with the sandbox's environment and, on a GPU machine,
the device files and CUDA folders :mod:`gpulab.confine.cuda_paths` finds. ``make gpu-check``'s
CUDA probe and the GPU test of the sandbox use it to show CUDA works where the graded kernel runs.

    python -m gpulab.autograde.box.probe [--compile] [--timeout 20]    # exit 0: CUDA works in the sandbox
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

from gpulab.autograde.box.prepare import grading_root, memory_args
from gpulab.autograde.box.run import die_with_grader, sandbox_env
from gpulab.autograde.limits import Limits
from gpulab.confine import cuda_paths, isolation

# What a CUDA kernel must manage in the sandbox: a context, a kernel launch, the result back, the
# same GPU as NVML names; each step prints as it ends, so a timeout still says how far it got.
CUDA_PROBE = """
import os, resource, torch
print("env", {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}, flush=True)
print("rlimit_data", resource.getrlimit(resource.RLIMIT_DATA)[0], flush=True)
print("cuda available", torch.cuda.is_available(), torch.cuda.device_count(), flush=True)
x = torch.zeros(1, device="cuda")
print("zeros ok", x.device, flush=True)
a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
assert torch.allclose((a @ a).cpu(), a.cpu() @ a.cpu(), rtol=1e-3, atol=1e-3)
print("matmul ok", torch.cuda.get_device_name(0), flush=True)
"""
COMPILE_PROBE = """
f = torch.compile(lambda t: torch.sin(t) * 2 + 1)
t = torch.randn(1024, device="cuda")
assert torch.allclose(f(t), torch.sin(t) * 2 + 1, atol=1e-5)
print("compile ok", flush=True)
"""


def run_as_kernel(code: str, timeout_s: float = 120, limits: Limits | None = None,
                  plan: isolation.Plan | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` where and as a graded kernel runs (returncode 124 past ``timeout_s``;
    every process it started is gone on return)."""
    limits = limits or Limits()
    plan = plan if plan is not None else isolation.detect()
    root = grading_root(plan.namespaces)
    box = root / "probe" / "kernel"
    tmp = box / "tmp"
    for d in ("home", "matplotlib", "ipython", "runtime", "cache"):
        (tmp / d).mkdir(parents=True)
    sub = isolation.Submission(plan, limits.pids_max, limits.cgroup_memory_mb(), limits.tmp_mb, limits.shm_mb,
                               visible=[str(root)])
    cuda = cuda_paths.machine()
    if cuda.present:
        sub.see, sub.groups = cuda.folders, cuda.groups
    for d in (root / "probe", box):
        d.chmod(0o711)
    sub.give(tmp)
    writable = [str(tmp)] + (["/tmp"] if plan.namespaces else [])
    jail = [sys.executable, "-m", "gpulab.confine.jail", *memory_args(limits), "--home", str(tmp / "home"),
            *[a for w in writable for a in ("--write", w)], "--", sys.executable, "-c", code]
    cmd = sub.join_command() + sub.wrap(sub.kernel_prefix() + jail)
    try:
        proc = subprocess.Popen(cmd, cwd=tmp, env=sandbox_env(box, limits, plan.namespaces), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, preexec_fn=die_with_grader)
        try:
            out, err = proc.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            isolation.kill_tree(proc.pid)
            out, err = proc.communicate()
            return subprocess.CompletedProcess(cmd, 124, out, err + f"\nstopped after {timeout_s:g} s")
    finally:
        sub.finish()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.autograde.box.probe", description=__doc__.splitlines()[0])
    p.add_argument("--compile", action="store_true", help="also a torch.compile'd function (Triton's first compile)")
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args(argv)
    cuda = cuda_paths.machine()
    if not cuda.present:
        print("probe: no NVIDIA device files here (/dev/nvidiactl, /dev/nvidia0): no CUDA to probe", file=sys.stderr)
        return 2
    print(f"probe: devices {cuda.devices}; folders shown {cuda.folders}; groups {cuda.groups}; env {cuda.env}", flush=True)
    proc = run_as_kernel(CUDA_PROBE + (COMPILE_PROBE if args.compile else ""), args.timeout,
                         Limits(memory_mb=4096))
    print(proc.stdout + proc.stderr, flush=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
