"""gpulab.grading.lab06_script: the student's spawn-based script run as a program. A correct script
gives one process's parameters (two jobs at once included), a script that forgets set_epoch does
not, and a script that is missing, unanswered, crashing, hanging or on a fixed port gets an error
that says which."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
import torch

from gpulab.grading import lab06
from gpulab.grading.lab06_script import ScriptError, require_script, run_script, run_scripts, single_process_training

NOTEBOOK = Path(__file__).parents[2] / "notebooks" / "source" / "06_ddp" / "06_ddp.ipynb"


def _solution() -> str:
    """The script the source notebook's %%writefile cell writes (the lab's own solution)."""
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "spawn_script_impl")
    lines = cell.source.splitlines()
    assert lines[0] == "%%writefile ddp_spawn.py"
    return "\n".join(line for line in lines[1:] if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line) + "\n"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lab06") / "ddp_spawn.py"
    path.write_text(_solution())
    return path


def _variant(tmp_path: Path, name: str, old: str, new: str) -> Path:
    source = _solution()
    assert old in source
    path = tmp_path / name
    path.write_text(source.replace(old, new))
    return path


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_the_solution_trains_like_one_process_even_with_a_second_job_beside_it(good):
    jobs = run_scripts(good, [0, 123], timeout=180)
    for job, seed in zip(jobs, [0, 123]):
        assert job["world_size"] == 2
        assert _max_diff(job["params"], single_process_training(seed)["params"]) < lab06.class_tolerance(2)
    assert _max_diff(jobs[0]["params"], jobs[1]["params"]) > 1e-3  # the seed reached the script


def test_a_script_that_forgets_set_epoch_is_told_apart(tmp_path):
    path = _variant(tmp_path, "no_epoch.py", "sampler.set_epoch(epoch)", "pass")
    job = run_script(path, 0, timeout=180)
    assert _max_diff(job["params"], single_process_training(0)["params"]) > 1e-3


def test_a_fixed_port_fails_when_two_jobs_share_the_machine(tmp_path):
    path = _variant(tmp_path, "fixed_port.py", 'f"file://{tmp}/rendezvous", args)', '"tcp://127.0.0.1:29517", args)')
    with pytest.raises(ScriptError, match="port"):
        run_scripts(path, [0, 1], timeout=60)


def test_a_crashing_rank_is_reported_with_its_traceback(tmp_path):
    path = _variant(tmp_path, "crash.py", "    job = make_job(args.seed)\n",
                    "    if rank == 1:\n        raise ValueError('rank 1 read a corrupt batch')\n    job = make_job(args.seed)\n")
    with pytest.raises(ScriptError, match="(?s)exited with code.*corrupt batch"):
        run_script(path, 0, timeout=120)


def test_a_rank_that_dies_in_native_code_is_run_again_once(tmp_path):
    """gloo's C++ can abort a rank at teardown (CI saw it once): no fault of the script, so the job
    runs once more; a rank that is killed every time is reported as such."""
    mark = tmp_path / "aborted-once"
    teardown = "    dist.destroy_process_group()\n"
    once = _variant(tmp_path, "abort_once.py", teardown,
                    f"    if rank == 1 and not __import__('os').path.exists({str(mark)!r}):\n"
                    f"        open({str(mark)!r}, 'w').close()\n        __import__('os').abort()\n" + teardown)
    job = run_script(once, 0, timeout=180)
    assert mark.exists()
    assert _max_diff(job["params"], single_process_training(0)["params"]) < 1e-4
    always = _variant(tmp_path, "abort_always.py", teardown,
                      "    if rank == 1:\n        __import__('os').abort()\n" + teardown)
    with pytest.raises(ScriptError, match="killed by a signal, twice"):
        run_script(always, 0, timeout=180)


def test_a_hanging_script_is_stopped_with_its_children(tmp_path):
    path = tmp_path / "hang.py"
    path.write_text("import multiprocessing as mp, time\n\ndef sleep():\n    time.sleep(600)\n\n"
                    "if __name__ == '__main__':\n    p = mp.get_context('spawn').Process(target=sleep)\n"
                    "    p.start()\n    print('child', p.pid, flush=True)\n    p.join()\n")
    with pytest.raises(ScriptError, match="did not finish within 5 s") as err:
        run_script(path, 0, timeout=5)
    child = int(str(err.value).split("child ")[1].split()[0])
    deadline = time.monotonic() + 10   # SIGKILL is delivered asynchronously; the orphan is reaped by init
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_script_that_saves_nothing_or_the_wrong_thing_is_named(tmp_path):
    path = tmp_path / "quiet.py"
    path.write_text("print('trained, honest')\n")
    with pytest.raises(ScriptError, match="saved nothing"):
        run_script(path, 0, timeout=30)
    path.write_text("import sys, torch\nout = sys.argv[sys.argv.index('--out') + 1]\ntorch.save([1, 2], out)\n")
    with pytest.raises(ScriptError, match="not a dict"):
        run_script(path, 0, timeout=60)


def test_a_missing_or_unanswered_script_stops_before_running(tmp_path):
    with pytest.raises(NotImplementedError, match="%%writefile"):
        require_script(tmp_path / "ddp_spawn.py")
    stub = tmp_path / "ddp_spawn.py"
    stub.write_text("def main_worker(rank, world_size):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n")
    with pytest.raises(NotImplementedError, match="not answered"):
        run_script(stub, 0)


def test_the_expected_run_reads_each_epoch_in_the_samplers_order():
    job = single_process_training(5, epochs=1)
    again = single_process_training(5, epochs=1)
    assert all(torch.equal(job["params"][k], again["params"][k]) for k in job["params"])
    assert _max_diff(job["params"], single_process_training(6, epochs=1)["params"]) > 1e-3
