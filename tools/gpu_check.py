"""``make gpu-check``: everything that needs a real GPU, in one run, for the day a GPU machine is lent.

    make gpu-check TORCH_INDEX=https://download.pytorch.org/whl/cu128   # or, in a ready environment:
    python tools/gpu_check.py [--skip-labs] [--skip-bench] [--dry-run]
    python tools/gpu_check.py --labs 08_oom,12_launch_bound --bench memory,launch_bound --deadline 420

1. every GPU-marked test (``pytest -m "gpu or multigpu"``), in file order and again shuffled
   (``--shuffle SEED``, tests/conftest.py): every GPU test must pass in any order;
2. labs 00, 01, 02, 06, 07, 08, 09, 10, 11 and 12 end to end as ``make grade`` grades them (tools/gradelab.py): the
   source notebook must score full marks and the release copy zero;
3. every benchmark but the grading one (a CPU cost), each result saved as
   ``benchmarks/results/<benchmark>-<gpu tag>.json`` beside the GPU, driver and torch it ran on.

``--labs`` and ``--bench`` pick some (comma-separated), ``--once`` skips the shuffled run,
``--skip-tests`` all the tests, and
``--deadline S`` skips every step that would start S seconds after the first (a lent GPU's time is
short): a skipped step is listed as such. Each command step is stopped after ``--step-timeout`` s.

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

LABS = ("00_setup", "01_bottleneck", "02_pipeline", "06_ddp", "07_model_parallel", "08_oom", "09_sharding", "10_search", "11_tensor_parallel", "12_launch_bound")
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


def plan(skip_labs: bool = False, skip_bench: bool = False, labs: list[str] | None = None,
         bench: list[str] | None = None, once: bool = False, skip_tests: bool = False) -> list[tuple[str, list[str] | str]]:
    """(name, command) for every step: a command line, or ``lab:<id>`` for a lab graded in-process.
    ``labs``/``bench`` pick some (in the order given) instead of all."""
    tests = [sys.executable, "-m", "pytest", "-m", "gpu or multigpu", "-q", "-p", "no:cacheprovider"]
    seed = random.randrange(10**6)
    steps: list[tuple[str, list[str] | str]] = [] if skip_tests else [("GPU-marked tests", tests)]
    if not (once or skip_tests):  # the same tests in another order: one that passes alone but not after another shows up
        steps.append((f"GPU-marked tests, shuffled (seed {seed})", [*tests, "--shuffle", str(seed)]))
    if not skip_labs:
        for lab in labs or LABS:
            if lab not in LABS:
                raise SystemExit(f"gpu-check: no lab {lab!r} here; pick from {', '.join(LABS)}")
            steps.append((f"lab {lab}", f"lab:{lab}"))
    if not skip_bench:
        found = {b.stem: b for b in sorted((REPO / "benchmarks").glob("*.py")) if b.name not in NOT_ON_GPU}
        for name in bench or found:
            if name not in found:
                raise SystemExit(f"gpu-check: no benchmark {name!r}; pick from {', '.join(found)}")
            steps.append((f"benchmark {name}", [sys.executable, str(found[name])]))
    return steps


def _grade(lab: str) -> tuple[int, str]:
    """Grade ``lab``; the text holds the scores, what the grader printed, and the source notebook's
    failing test cells with their messages (what a GPU run needs to say which check broke)."""
    import contextlib
    import io

    from gradelab import grade_lab, verdicts

    from gpulab.autograde.gradebook import manual_points

    printed = io.StringIO()
    with tempfile.TemporaryDirectory(prefix=f"gpu-check-{lab}-", ignore_cleanup_errors=True) as tmp:  # removed after
        root = Path(tmp) / "course"
        with contextlib.redirect_stdout(printed):
            rows, took = grade_lab(lab, root)
        got = {r.student: (r.score, r.max_score, r.notes) for r in rows}
        if "solution" not in got:  # the reference run failed: nothing was graded
            return 1, printed.getvalue().strip() + "\nnot graded"
        manual = manual_points(root, lab, "solution")  # written answers: the instructor's, not the autograder's
        failing = [f"  {cell}: {text}" for nb in sorted((root / "autograded" / "solution" / lab).glob("*.ipynb"))
                   for cell, text in verdicts(nb) if not text.startswith("PASS")]
    ok = got["solution"][0] == got["solution"][1] - manual and got["student"][0] == 0
    lines = [f"{s:9} {score:g}/{top:g} {notes}" for s, (score, top, notes) in got.items()]
    if failing:
        lines += ["the source notebook's failing test cells:", *failing]
    return (0 if ok else 1), "\n".join(lines + [f"graded in {took:.0f} s"])


def run(out: Path, steps: list[tuple[str, list[str] | str]], facts: dict, deadline: float | None = None,
        step_timeout: float | None = None) -> int:
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
        start = time.perf_counter()
        for title, command in steps:
            t0 = time.perf_counter()
            if deadline is not None and t0 - start > deadline:
                say(f"\n== {title}: skipped, past the {deadline:.0f} s deadline")
                summary.append((title, None, 0.0))
                continue
            say(f"\n== {title}")
            if isinstance(command, str):  # lab:<id>
                try:
                    rc, text = _grade(command.split(":", 1)[1])
                except Exception as e:  # a lab that cannot be graded here: say why, go on to the next step
                    rc, text = 1, f"{type(e).__name__}: {e}"
            else:
                try:
                    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=step_timeout)
                    rc, text = proc.returncode, proc.stdout + proc.stderr
                except subprocess.TimeoutExpired as e:
                    out_text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                    err_text = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
                    rc, text = 124, f"{out_text}{err_text}\nstopped after {step_timeout:.0f} s (--step-timeout)"
                    proc = None
                if title.startswith("benchmark") and rc == 0 and proc is not None:
                    result = json.loads(proc.stdout.strip().splitlines()[-1])
                    path = out / f"{Path(command[-1]).stem}-{name}.json"
                    path.write_text(json.dumps({"device": facts, "result": result}, indent=1) + "\n")
                    text += f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"
            say(text.rstrip()[-20000:])
            summary.append((title, rc, time.perf_counter() - t0))
        mark = {0: "ok  ", None: "skip"}
        say("\n" + "\n".join(f"{mark.get(rc, 'FAIL')} {t:32} {s:7.0f} s" for t, rc, s in summary))
        say(f"log: {log_path}")
    return 0 if all(rc in (0, None) for _, rc, _ in summary) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="where the results and the log go")
    p.add_argument("--skip-labs", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--labs", help="comma-separated lab ids, in this order (default: all of them)")
    p.add_argument("--bench", help="comma-separated benchmark names, in this order (default: all of them)")
    p.add_argument("--skip-tests", action="store_true", help="no GPU-marked tests (labs and benchmarks only)")
    p.add_argument("--once", action="store_true", help="run the GPU tests once, not again shuffled")
    p.add_argument("--deadline", type=float, help="skip the steps that would start after this many seconds")
    p.add_argument("--step-timeout", type=float, help="stop a test or benchmark step after this many seconds")
    p.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = p.parse_args(argv)
    facts = machine()
    if not facts["gpus"]:
        print(f"gpu-check: no CUDA GPU that torch can use here (torch {facts['torch']}, CUDA build {facts['cuda']}); "
              "nothing to check. `python -m gpulab doctor` says why; on a GPU machine install a CUDA build "
              "(make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128).")
        return 0
    split = lambda text: [x for x in (text or "").split(",") if x] or None
    steps = plan(args.skip_labs, args.skip_bench, split(args.labs), split(args.bench), args.once, args.skip_tests)
    if args.dry_run:
        print(f"gpu-check on {facts['gpus']} GPU(s) {facts['names']} would write {args.out}/*-{tag(facts)}.json and run:")
        for title, command in steps:
            print(f"  {title}: {command if isinstance(command, str) else ' '.join(command)}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    return run(out, steps, facts, args.deadline, args.step_timeout)


if __name__ == "__main__":
    sys.exit(main())
