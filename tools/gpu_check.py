"""``make gpu-check``: everything that needs a real GPU, in one run, for the day a GPU machine is lent.

    make gpu-check TORCH_INDEX=https://download.pytorch.org/whl/cu128   # or, in a ready environment:
    python tools/gpu_check.py [--skip-labs] [--skip-bench] [--dry-run]

1. every GPU-marked test (``pytest -m "gpu or multigpu"``), in file order and again shuffled
   (``--shuffle SEED``, tests/conftest.py): every GPU test must pass in any order;
2. labs 02, 06, 07, 08, 09, 10, 11 and 12 end to end as ``make grade`` grades them (tools/gradelab.py): the
   source notebook must score full marks and the release copy zero;
3. every benchmark but the grading one (a CPU cost), each result saved as
   ``benchmarks/results/<benchmark>-<gpu tag>.json`` beside the GPU, driver and torch it ran on.

The log, ``benchmarks/results/gpu-check-<gpu tag>.log``, opens with the GPUs, the driver and torch,
and ends with a table of every step. Without a GPU torch can use, it says so and exits 0: there is
nothing to check (``python -m gpulab doctor`` says why). Exit status 1 when a step failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tools"))

LABS = ("02_pipeline", "06_ddp", "07_model_parallel", "08_oom", "09_sharding", "10_search", "11_tensor_parallel", "12_launch_bound")
NOT_ON_GPU = ("grading.py",)  # benchmarks of the course tools: CPU work wherever they run


def machine() -> dict:
    """The GPUs torch can use, the driver and torch: what every result is stamped with."""
    import torch

    from gpulab.devices import cuda_device_count
    from gpulab.devices.nvml import close_nvml, open_nvml

    n = cuda_device_count()
    facts = {"gpus": n, "torch": torch.__version__, "cuda": torch.version.cuda, "driver": None, "names": []}
    if n:
        facts["names"] = [torch.cuda.get_device_name(i) for i in range(n)]
        opened = open_nvml()
        if opened.nvml is not None:
            try:
                drv = opened.nvml.nvmlSystemGetDriverVersion()
                facts["driver"] = drv.decode() if isinstance(drv, bytes) else str(drv)
            finally:
                close_nvml(opened.nvml)
    return facts


def tag(facts: dict) -> str:
    """A file-name tag for the machine: ``nvidia-h100-80gb-hbm3-x2``."""
    name = re.sub(r"[^a-z0-9]+", "-", facts["names"][0].lower()).strip("-")
    return f"{name}-x{facts['gpus']}"


def plan(skip_labs: bool = False, skip_bench: bool = False) -> list[tuple[str, list[str] | str]]:
    """(name, command) for every step: a command line, or ``lab:<id>`` for a lab graded in-process."""
    tests = [sys.executable, "-m", "pytest", "-m", "gpu or multigpu", "-q", "-p", "no:cacheprovider"]
    seed = random.randrange(10**6)
    steps: list[tuple[str, list[str] | str]] = [
        ("GPU-marked tests", tests),
        # the same tests in another order: one that passes alone but not after another shows up
        (f"GPU-marked tests, shuffled (seed {seed})", [*tests, "--shuffle", str(seed)])]
    if not skip_labs:
        steps += [(f"lab {lab}", f"lab:{lab}") for lab in LABS]
    if not skip_bench:
        steps += [(f"benchmark {b.stem}", [sys.executable, str(b)])
                  for b in sorted((REPO / "benchmarks").glob("*.py")) if b.name not in NOT_ON_GPU]
    return steps


def _grade(lab: str) -> tuple[int, str]:
    from gradelab import grade_lab

    from gpulab.course.gradebook import manual_points

    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{lab}-", ignore_cleanup_errors=True) as tmp:  # removed after
        root = Path(tmp) / "course"
        rows, took = grade_lab(lab, root)
        manual = manual_points(root, lab, "solution")  # written answers: the instructor's, not the autograder's
    got = {r.student: (r.score, r.max_score, r.notes) for r in rows}
    ok = got["solution"][0] == got["solution"][1] - manual and got["student"][0] == 0
    lines = [f"{s:9} {score:g}/{top:g} {notes}" for s, (score, top, notes) in got.items()]
    return (0 if ok else 1), "\n".join(lines + [f"graded in {took:.0f} s"])


def run(out: Path, steps: list[tuple[str, list[str] | str]], facts: dict) -> int:
    name = tag(facts)
    log_path = out / f"gpu-check-{name}.log"
    summary = []
    with log_path.open("w") as log:
        def say(text: str) -> None:
            print(text, flush=True)
            log.write(text + "\n")
            log.flush()

        say(f"gpu-check {datetime.datetime.now().isoformat(timespec='seconds')}: {facts['gpus']} GPU(s) "
            f"{facts['names']}, driver {facts['driver']}, torch {facts['torch']} (CUDA {facts['cuda']})")
        for title, command in steps:
            say(f"\n== {title}")
            t0 = time.perf_counter()
            if isinstance(command, str):  # lab:<id>
                rc, text = _grade(command.split(":", 1)[1])
            else:
                proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
                rc, text = proc.returncode, proc.stdout + proc.stderr
                if title.startswith("benchmark") and rc == 0:
                    result = json.loads(proc.stdout.strip().splitlines()[-1])
                    path = out / f"{Path(command[-1]).stem}-{name}.json"
                    path.write_text(json.dumps({"device": facts, "result": result}, indent=1) + "\n")
                    text += f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
            say(text.rstrip()[-20000:])
            summary.append((title, rc, time.perf_counter() - t0))
        say("\n" + "\n".join(f"{'ok  ' if rc == 0 else 'FAIL'} {t:32} {s:7.0f} s" for t, rc, s in summary))
        say(f"log: {log_path}")
    return 0 if all(rc == 0 for _, rc, _ in summary) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="where the results and the log go")
    p.add_argument("--skip-labs", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = p.parse_args(argv)
    facts = machine()
    if not facts["gpus"]:
        print(f"gpu-check: no CUDA GPU that torch can use here (torch {facts['torch']}, CUDA build {facts['cuda']}); "
              "nothing to check. `python -m gpulab doctor` says why; on a GPU machine install a CUDA build "
              "(make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128).")
        return 0
    steps = plan(args.skip_labs, args.skip_bench)
    if args.dry_run:
        print(f"gpu-check on {facts['gpus']} GPU(s) {facts['names']} would write {args.out}/*-{tag(facts)}.json and run:")
        for title, command in steps:
            print(f"  {title}: {command if isinstance(command, str) else ' '.join(command)}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return run(out, steps, facts)


if __name__ == "__main__":
    sys.exit(main())
