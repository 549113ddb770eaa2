"""gpulab.hpo.resources: the request each search of lab 10 gives Ray, on machines of 0, 1 and 4
GPUs, read from the lab's own notebook; and the check of the GPUs a trial saw. No Ray runtime is
started here: tests/hpo/test_hpo.py runs trials on a Ray with faked GPUs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from gpulab.hpo import SEARCHES, check_trial_devices, one_per_device, packing_factor, search_resources
from gpulab.hpo.resources import UNSET

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "source" / "10_search" / "10_search.ipynb"

# (num_cpus, num_gpus) -> what every search must ask Ray for, per trial
EXPECTED = {
    (2, 0): {"grid": {"cpu": 1.0}, "random": {"cpu": 1.0}, "asha": {"cpu": 1.0}, "tpe": {"cpu": 1.0},
             "packed": {"cpu": 0.5}},
    # one GPU per trial: a zero-GPU trial would see every GPU (Ray 2.60) and all 16 would share cuda:0
    (16, 1): {"grid": {"gpu": 1.0, "cpu": 1.0}, "random": {"gpu": 1.0, "cpu": 1.0}, "asha": {"gpu": 1.0, "cpu": 1.0},
              "tpe": {"gpu": 1.0, "cpu": 1.0}, "packed": {"gpu": 0.25, "cpu": 1.0}},
    # 16 packed trials share 8 CPUs
    (8, 4): {"grid": {"gpu": 1.0, "cpu": 1.0}, "random": {"gpu": 1.0, "cpu": 1.0}, "asha": {"gpu": 1.0, "cpu": 1.0},
             "tpe": {"gpu": 1.0, "cpu": 1.0}, "packed": {"gpu": 0.25, "cpu": 0.5}},
}
TUNE_DEFAULT = {"cpu": 1.0}  # what a trainable not wrapped in tune.with_resources asks for


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_search_resources_for_every_search(machine):
    cpus, gpus = machine
    assert {s: search_resources(s, cpus, gpus) for s in SEARCHES} == EXPECTED[machine]
    assert packing_factor(gpus) == (4 if gpus else 2)


def test_search_resources_packs_with_the_given_function_and_rejects_bad_input():
    calls = []

    def pack(k, cpus, gpus):
        calls.append((k, cpus, gpus))
        return {"gpu": 1 / k, "cpu": 1.0}

    assert search_resources("packed", 16, 2, pack=pack) == {"gpu": 0.25, "cpu": 1.0}
    assert search_resources("packed", 16, 2, pack=pack, trials_per_device=3)["gpu"] == pytest.approx(1 / 3)
    assert calls == [(4, 16, 2), (3, 16, 2)]
    assert one_per_device(2, 4) == {"gpu": 1.0, "cpu": 0.5}  # fewer CPUs than GPUs: shared out
    with pytest.raises(ValueError, match="unknown search 'bayes'.*grid, random, asha, tpe, packed"):
        search_resources("bayes", 2, 0)
    for cpus, gpus in ((0, 0), (2, -1), (2, 1.5), (True, 0)):
        with pytest.raises(ValueError, match="must be an int"):
            search_resources("grid", cpus, gpus)


def _result(tid, seen, device="cpu", cuda_devices=0):
    return SimpleNamespace(metrics={"trial_id": tid, "accuracy": 0.5, "device": device,
                                    "cuda_visible_devices": seen, "cuda_devices": cuda_devices})


def test_check_trial_devices_accepts_what_the_request_gave():
    # a CPU machine whose Ray session set the override: no GPU visible
    assert check_trial_devices([_result("a", "")], {"cpu": 1.0}, 0) == {"a": "cpu, sees 0 GPU(s)"}
    # 4 GPUs: whole GPUs and shares each show exactly one id
    one = [_result("a", "2", "cuda:0", 1), _result("b", "0", "cuda:0", 1)]
    assert set(check_trial_devices(one, {"gpu": 1.0, "cpu": 1.0}, 4).values()) == {"cuda:0, sees 1 GPU(s)"}
    assert check_trial_devices([_result("c", "3", "cuda:0", 1)], {"gpu": 0.25, "cpu": 1.0}, 4)
    # no GPU on the machine: an unset variable hides nothing, and there is nothing to hide
    assert check_trial_devices([_result("d", UNSET)], {"cpu": 1.0}, 0) == {"d": "cpu, sees 0 GPU(s)"}


def test_check_trial_devices_names_the_trial_and_the_fix():
    # Ray 2.60 without the override: a zero-GPU trial sees all 4 GPUs and trains on cuda:0
    with pytest.raises(RuntimeError, match=r"trial b asked Ray for \{'cpu': 1.0\} and so for 0 GPU\(s\), but it saw 4.*"
                                           r"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1.*search_resources"):
        check_trial_devices([_result("a", ""), _result("b", UNSET, "cuda:0", 4)], {"cpu": 1.0}, 4)
    with pytest.raises(RuntimeError, match="trial a .* saw 2"):
        check_trial_devices([_result("a", "0,1", "cuda:0", 2)], {"gpu": 1.0, "cpu": 1.0}, 4)
    with pytest.raises(RuntimeError, match="fewer GPUs than it asked for"):
        check_trial_devices([_result("a", "")], {"gpu": 0.5, "cpu": 1.0}, 4)
    with pytest.raises(KeyError, match="did not report the devices"):
        check_trial_devices([SimpleNamespace(metrics={"trial_id": "a", "accuracy": 0.5})], {"cpu": 1.0}, 0)


# --- the lab's notebook: what each of its Tune searches asks Ray for -----------------------------

def _code_cells() -> dict[str, str]:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    return {c.id: c.source for c in nb.cells if c.cell_type == "code"}


def _is_attr(node: ast.AST, owner: str, name: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.value, ast.Name)
            and node.value.id == owner)


def _evaluate(node: ast.expr, assigned: dict[str, ast.expr], env: dict) -> object:
    """``node``'s value in ``env``; a name the cell assigns itself is evaluated from its assignment."""
    while True:
        try:
            return eval(compile(ast.Expression(node), "<lab 10 cell>", "eval"), env)
        except NameError as err:
            if err.name not in assigned or err.name in env:
                raise
            env[err.name] = _evaluate(assigned[err.name], assigned, env)


def notebook_requests(num_cpus: int, num_gpus: int) -> dict[str, dict[str, float]]:
    """Search name (its ``run_config(name=...)``) -> the resources each trial of that ``tune.Tuner``
    of the lab asks Ray for, on a machine of ``num_cpus`` CPUs and ``num_gpus`` GPUs, with the
    lab's solution of ``packed_resources``."""
    cells = _code_cells()
    solution: dict = {}
    exec(cells["c023"], solution)  # the packed_resources exercise, solved
    requests = {}
    for source in cells.values():
        tree = ast.parse(source)
        assigned: dict[str, ast.expr] = {}  # a name's first assignment (a fallback to None comes later)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, node.value)
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and _is_attr(call.func, "tune", "Tuner")):
                continue
            run_config = next(k.value for k in call.keywords if k.arg == "run_config")
            name = next(k.value.value for k in run_config.keywords if k.arg == "name")
            trainable = call.args[0]
            if isinstance(trainable, ast.Call) and _is_attr(trainable.func, "tune", "with_resources"):
                env = {"NUM_CPUS": num_cpus, "NUM_GPUS": num_gpus, "search_resources": search_resources,
                       "packing_factor": packing_factor, "packed_resources": solution["packed_resources"]}
                request = _evaluate(trainable.args[1], assigned, env)
            else:
                request = TUNE_DEFAULT
            requests[name] = {k: float(v) for k, v in dict(request).items() if v}
    return requests


@pytest.mark.parametrize("machine", sorted(EXPECTED))
def test_every_search_of_lab10_asks_ray_for_its_devices(machine):
    """The lab's five Tune searches, read from its source notebook, on machines of 0, 1 and 4 GPUs."""
    cpus, gpus = machine
    assert notebook_requests(cpus, gpus) == EXPECTED[machine]


@pytest.mark.gpu
def test_on_a_real_gpu_a_baseline_trial_trains_on_its_own_gpu_and_a_packed_one_shares_it():
    """Ray with the machine's GPUs: the random search's trial (one GPU) and the packed search's
    trials (a quarter each) train on cuda:0 and see exactly one GPU; check_trial_devices agrees."""
    pytest.importorskip("ray", reason="lab 10 needs the search extra: pip install -e '.[search]'")
    from ray import tune

    from gpulab.devices import cuda_device_count
    from gpulab.hpo import ray_session, search_resources, train_classifier

    gpus = cuda_device_count()
    with ray_session(num_cpus=4, num_gpus=gpus) as session:
        for search, trials in (("random", 1), ("packed", 4)):
            request = search_resources(search, 4, gpus)
            space = {"lr": 0.05, "width": 8, "epochs": 1, "seed": tune.grid_search(list(range(trials)))}
            results = tune.Tuner(tune.with_resources(train_classifier, request), param_space=space,
                                 run_config=session.run_config(),
                                 tune_config=tune.TuneConfig(metric="accuracy", mode="max")).fit()
            assert results.num_errors == 0
            assert all(r.metrics["device"].startswith("cuda") and r.metrics["cuda_devices"] == 1 for r in results)
            check_trial_devices(results, request, num_gpus=gpus)
