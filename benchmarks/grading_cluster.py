"""make grade on a Ray cluster: throughput of 2 nodes against 1, a node killed mid-class (no student
lost, none counted twice), and a projection of a large class, labelled as one.

    flock /tmp/gpulab-grade.lock .venv/bin/python benchmarks/grading_cluster.py [--submissions 4]

The nodes are raylets of ``ray.cluster_utils.Cluster`` on this machine (one CPU each), so "2 nodes"
means two raylets sharing this machine's cores: on a 2-core machine 2x is the ceiling. The
projection multiplies recorded per-lab costs (``results/lab_costs-cpu.json``, a third of each lab's
pipeline time on a 2-core VM) by 500 students and spreads them over nodes of 16 cores as
``gpulab.autograde.runners.ray.task_options`` asks (CPUs per task; lab 10 alone on a node, after the rest).
It assumes a core of those nodes is as fast as one of the VM's, and ignores start-up and merging on
the head. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpulab.autograde.limits import Limits  # noqa: E402
from gpulab.autograde.record import NOT_YET  # noqa: E402
from gpulab.autograde.run import grade  # noqa: E402
from gpulab.autograde.runners import ray as cluster  # noqa: E402
from gpulab.confine import isolation  # noqa: E402
from gpulab.course.release import release  # noqa: E402

LAB = "00_setup"


def make_class(root: Path, n: int) -> Path:
    shutil.copytree(REPO / "notebooks" / "source", root / "source")
    shutil.copy(REPO / "notebooks" / "nbgrader_config.py", root)
    release(root, LAB)
    for i in range(n):
        shutil.copytree(root / "source" / LAB, root / "submitted" / f"s{i:03d}" / LAB)
    return root


def table(course: Path) -> list[dict[str, str]]:
    with open(course / "grades.csv") as fh:
        return list(csv.DictReader(fh))


def run(course: Path, nodes: int, kill: bool = False) -> float:
    """Seconds to grade the class on ``nodes`` one-CPU raylets (``kill``: one removed after the first row)."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    added = [c.add_node(num_cpus=1, resources={cluster.WHOLE_NODE: 1}) for _ in range(nodes)]
    c.wait_for_nodes()
    limits = Limits(memory_mb=2048, allow_weaker=bool(isolation.detect().off()))
    try:
        t0 = time.perf_counter()
        worker = threading.Thread(target=grade, args=(course, LAB),
                                  kwargs=dict(jobs=1, limits=limits, progress=False, ray_address=c.address, fresh=True))
        worker.start()
        if kill:
            while worker.is_alive() and not ((course / "grades.csv").exists()
                                             and any(r["notes"] != NOT_YET for r in table(course))):
                time.sleep(0.5)
            c.remove_node(added[0])
        worker.join()
        return time.perf_counter() - t0
    finally:
        c.shutdown()


def projection(students: int = 500, cores: int = 16) -> dict[str, float]:
    """Hours for ``students`` x every lab with a recorded cost on 1, 4 and 16 nodes of ``cores`` cores (see the module doc)."""
    costs = json.loads((REPO / "benchmarks" / "results" / "lab_costs-cpu.json").read_text())["graded_three_runs_s"]
    limits = Limits(memory_mb=2048)
    out = {}
    for nodes in (1, 4, 16):
        shared = alone = 0.0
        for lab, three in costs.items():
            per = three / 3
            opts = cluster.task_options(lab, limits, 0)
            if "resources" in opts:  # graded alone: one per node, after the rest
                alone += math.ceil(students / nodes) * per
            else:
                shared += students * per * opts["num_cpus"] / (nodes * cores)
        out[f"projected_hours_{students}_students_{nodes}_nodes_x{cores}"] = round((shared + alone) / 3600, 1)
    out["projected_labs"] = len(costs)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submissions", type=int, default=4)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpulab-cluster-") as tmp:
        course = make_class(Path(tmp) / "class", args.submissions)
        one = run(course, 1)
        two = run(course, 2)
        killed_s = run(course, 2, kill=True)
        rows = table(course)
        names = [r["student"] for r in rows]
        expected = {f"s{i:03d}" for i in range(args.submissions)}
        lost = len(expected - {r["student"] for r in rows if r["notes"] != NOT_YET and float(r["score"]) > 0})
    out = {"benchmark": "grading_cluster", "lab": LAB, "submissions": args.submissions, "nodes": 2,
           "rows": len(rows), "lost": lost, "duplicated": len(names) - len(set(names)),
           "one_node_s": round(one, 1), "two_nodes_s": round(two, 1), "two_vs_one_node_throughput": round(one / two, 2),
           "killed_node_run_s": round(killed_s, 1), "note": "nodes are one-CPU raylets sharing this machine",
           "projection": "PROJECTION, not a measurement: recorded per-lab costs x 500 students x every lab, over nodes of 16 cores",
           **projection()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
