"""gpulab.autograde.runners.ray: make grade on a Ray cluster (several raylets on this machine), with a node
killed mid-class and the head stopped mid-run; against the scores the same submissions must get."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import lab_class

from gpulab.autograde import gradebook
from gpulab.autograde import plan as planning
from gpulab.autograde import run as grading_run
from gpulab.autograde.limits import Limits
from gpulab.autograde.record import NOT_YET
from gpulab.autograde.runners import ray as cluster
from gpulab.confine import isolation

LAB = "00_setup"
FULL = ("ada", "cy")    # the source notebook: every answer
BLANK = ("bo", "dee")   # the release copy: no answer


def _course(tmp: Path) -> Path:
    return lab_class(tmp / "course", LAB, FULL, BLANK)


def _table(course: Path) -> dict[str, dict[str, str]]:
    with open(course / "grades.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len({r["student"] for r in rows}), f"a student has two rows: {rows}"
    return {r["student"]: r for r in rows}


def _check_scores(course: Path) -> None:
    table = _table(course)
    assert set(table) == set(FULL + BLANK)
    for s in FULL:  # full marks, less the written answers that wait for the instructor
        manual = gradebook.manual_points(course, LAB, s)
        assert manual > 0 and float(table[s]["score"]) == float(table[s]["max_score"]) - manual > 0, table[s]
    for s in BLANK:
        assert float(table[s]["score"]) == 0, table[s]


@pytest.fixture
def ray_cluster():
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1, resources={cluster.WHOLE_NODE: 1}) for _ in range(2)]
    c.wait_for_nodes()
    yield c, nodes
    c.shutdown()


def _limits() -> Limits:
    return Limits(memory_mb=2048, allow_weaker=bool(isolation.detect().off()))


@pytest.mark.notebook
@pytest.mark.timeout(900)
def test_a_node_killed_then_the_head_killed_lose_no_student_and_count_none_twice(tmp_path: Path, ray_cluster,
                                                                                  capsys) -> None:
    """The three faults of one class: a grading node dies while it grades (the run goes on without it), then
    the head itself dies mid-run; the next run grades only what is missing. Every student ends with one
    row, and the scores one machine gives."""
    c, nodes = ray_cluster
    course = _course(tmp_path)
    cmd = [sys.executable, "-m", "gpulab.autograde", "--course", str(course), "--lab", LAB, "--jobs", "1",
           "--memory-mb", "2048", "--quiet", "--ray-address", c.address]
    if _limits().allow_weaker:
        cmd.append("--allow-weaker-sandbox")
    head = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def graded() -> list[str]:
        if not (course / "grades.csv").exists():
            return []
        return [s for s, r in _table(course).items() if r["notes"] != NOT_YET]

    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and head.poll() is None and not graded():
            time.sleep(0.2)
        c.remove_node(nodes[0])  # both nodes were busy: a raylet and the task it ran, gone
        while time.monotonic() < deadline and head.poll() is None and len(graded()) < 2:
            time.sleep(0.2)      # the run goes on without that node
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # then the head dies, without a chance to clean up
        head.wait()
    done = graded()
    assert 2 <= len(done) < 4, _table(course)
    rows = grading_run.grade(course, LAB, jobs=1, limits=_limits(), progress=False, ray_address=c.address)
    said = capsys.readouterr().out
    assert f"{len(done)} submission(s) it graded are kept, {4 - len(done)} to grade" in said, said
    assert len(rows) == 4
    _check_scores(course)
    # a run that finished is not resumed: the next one grades everything again
    assert planning.interrupted_rows(course, [(s, LAB) for s in FULL + BLANK]) == {}


def test_task_options_follow_the_lab() -> None:
    limits = Limits(memory_mb=1024)
    setup, ddp, search = (cluster.task_options(lab, limits, 0) for lab in ("00_setup", "06_ddp", "10_search"))
    assert setup["num_cpus"] == 1 and "num_gpus" not in setup and "resources" not in setup
    assert ddp["num_cpus"] == 2 and setup["memory"] == limits.cgroup_memory_mb() * 2**20
    assert search["resources"] == {cluster.WHOLE_NODE: 1}
    assert cluster.task_options("06_ddp", limits, 8)["num_gpus"] == 2
    assert cluster.task_options("06_ddp", limits, 1)["num_gpus"] == 1


def test_a_bundled_file_cannot_escape_its_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="escapes"):
        cluster._write(tmp_path / "box", {"../../etc/x": b""})


def test_no_cluster_at_the_address_names_the_fix() -> None:
    pytest.importorskip("ray")
    with pytest.raises(ConnectionError, match="ray start --head"):
        cluster.RayGrader("127.0.0.1:1")
