"""gpulab.hpo: the promotion rule, the trainable's checkpoints, and Ray sessions that clean up.

The rule is checked on hand-worked cases and against Ray Tune's own ASHA bracket; the trainable
against itself run in one piece; the Ray tests run real (tiny) Tune searches and then look with
psutil for any raylet, GCS or worker left behind. One Ray start costs several seconds here, so
the Tune searches share one session (module fixture) and the last test shuts it down. That
session tells Ray it has 2 GPUs: there are none, but Ray hands out their ids all the same, which
is what decides the GPUs a trial can see.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray", reason="lab 10 needs the search extra: pip install -e '.[search]'")

from gpulab.devices import cuda_device_count
from gpulab.grading import lab10 as grading_lab10
from gpulab.hpo import (
    HalvingReplay,
    asha_continues,
    check_trial_devices,
    learning_curves,
    packed_resources,
    ray_processes,
    ray_session,
    replay_halving,
    run_trial,
    rung_milestones,
    successive_halving,
    summarize,
    train_classifier,
    trial_epochs,
    trial_errors,
)

ray = pytest.importorskip("ray")
from ray import tune  # noqa: E402
from ray.tune.schedulers.async_hyperband import _Bracket  # noqa: E402

# --- the promotion rule --------------------------------------------------------------------------

@pytest.mark.parametrize("rungs, rf, expected", grading_lab10.HAND_WORKED)
def test_successive_halving_hand_worked(rungs, rf, expected):
    assert successive_halving(rungs, rf) == expected


def test_successive_halving_does_not_mutate_and_rejects_bad_factor():
    rungs = [{"a": 0.1, "b": 0.9, "c": 0.5}, {}]
    before = [dict(r) for r in rungs]
    assert successive_halving(rungs, 3) == [["b"], []]
    assert rungs == before
    assert successive_halving([], 3) == []
    for bad in (1, 0.5, -2, "3"):
        with pytest.raises(ValueError, match="reduction_factor"):
            successive_halving(rungs, bad)


def test_asha_continues_is_tunes_cutoff():
    """Our stop rule decides as Tune's own ASHA bracket on random result streams."""
    rng = random.Random(0)
    for _ in range(30):
        bracket = _Bracket(min_t=1, max_t=9, reduction_factor=3, s=0)
        recorded: list[float] = []
        for i in range(20):
            value = round(rng.random(), 2)
            trial = type("T", (), {"trial_id": f"t{i}"})()
            tune_says = bracket.on_result(trial, 1, value)
            assert asha_continues(recorded, value, 3) == (tune_says == "CONTINUE"), (recorded, value)
            recorded.append(value)


def test_rung_milestones_match_tune():
    for max_t, grace, rf in [(9, 1, 3), (27, 1, 3), (16, 1, 4), (8, 2, 2), (81, 3, 3)]:
        tune_rungs = sorted(m for m, _ in _Bracket(min_t=grace, max_t=max_t, reduction_factor=rf, s=0)._rungs)
        assert rung_milestones(max_t, grace, rf) == tune_rungs
    with pytest.raises(ValueError, match="grace_period"):
        rung_milestones(3, grace_period=5)


def test_replay_counts_trial_epochs():
    # 9 trials whose rank never changes: 9 x 1 + 3 x 2 + 1 x 6 = 21 trial-epochs instead of 81
    curves = {f"t{i}": [i / 10 + e / 100 for e in range(9)] for i in range(9)}
    rep = replay_halving(curves, [1, 3, 9], 3)
    assert isinstance(rep, HalvingReplay)
    assert rep.trial_epochs == 21 and rep.full_epochs == 81
    assert rep.reached == {**{f"t{i}": 1 for i in range(6)}, "t6": 3, "t7": 3, "t8": 9}
    assert rep.best == ("t8", pytest.approx(0.88))
    # a slow starter: best at epoch 9, worst at epoch 1, so halving stops the would-be winner
    curves["slow"] = [0.0] * 8 + [0.99]
    assert replay_halving(curves, [1, 3, 9], 3).reached["slow"] == 1
    with pytest.raises(ValueError, match="fewer than 9 epochs"):
        replay_halving({"a": [0.1, 0.2]}, [1, 3, 9], 3)


def test_packed_resources():
    assert packed_resources(1, 2) == {"cpu": 1.0}
    assert packed_resources(2, 2) == {"cpu": 0.5}
    assert packed_resources(3, 2)["cpu"] * 3 <= 1.0  # three shares still fit in one core
    assert packed_resources(4, 16, 1) == {"gpu": 0.25, "cpu": 1.0}
    assert packed_resources(4, 2, 1) == {"gpu": 0.25, "cpu": 0.5}
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match="trials_per_device"):
            packed_resources(bad, 2)


def test_trial_timer_steady_state_and_window_utilization():
    """Two slots, six trials of three 1 s epochs: 2 trial-epochs/s between 'both slots warm' and
    'last start'; the monitor's mean over that window, per kind."""
    from types import SimpleNamespace

    import numpy as np

    from gpulab.hpo.timing import TrialTimer, mean_utilization

    timer = TrialTimer()
    for tid, start in zip("ABCDEF", (0.0, 0.5, 3.0, 3.5, 6.0, 6.5)):
        timer.starts[tid], timer.ends[tid] = start, start + 3.0
        timer.results += [(start + e, tid) for e in (1.0, 2.0, 3.0)]
    assert timer.max_concurrent == 2
    assert timer.steady_window == (1.5, 6.5)
    assert timer.epochs_per_s == pytest.approx(10 / 5.0)
    assert timer.trials_per_hour == pytest.approx(2.0 * 3600 / 3)
    t = np.arange(0.0, 10.0, 0.5)
    cpu = np.where(t[:, None] < 5, [[100.0, 0.0]], [[50.0, 50.0]])  # (N, 2 cores)
    monitor = SimpleNamespace(t0=100.0, arrays=lambda: {"t": t, "cpu": cpu, "process": np.full(len(t), 60.0),
                                                        "gpu_util": np.zeros((len(t), 0))})
    assert mean_utilization(monitor, (100.0, 104.9), kind="cpu") == pytest.approx(50.0)
    assert mean_utilization(monitor, (100.0, 109.9)) == pytest.approx(30.0)  # 60 % of one core of 2
    assert np.isnan(mean_utilization(monitor, (100.0, 110.0), kind="gpu"))
    assert np.isnan(mean_utilization(monitor, (200.0, 300.0)))
    with pytest.raises(ValueError, match="kind"):
        mean_utilization(monitor, (0.0, 1.0), kind="disk")
    with pytest.raises(ValueError, match="no trial has finished"):
        TrialTimer().window


# --- the trainable, without Ray ------------------------------------------------------------------

def _run(config, state=None):
    metrics, states = [], []
    run_trial(config, lambda m, s: (metrics.append(m), states.append(s)), state=state)
    return metrics, states


def test_trial_restores_from_its_checkpoint():
    """Stopped after epoch 2 and restored, a trial ends exactly as one that ran straight through."""
    config = {"lr": 0.05, "width": 16, "epochs": 4}
    straight, states = _run(config)
    assert [m["epoch"] for m in straight] == [1, 2, 3, 4]
    resumed, _ = _run(config, state=states[1])
    assert [m["epoch"] for m in resumed] == [3, 4]
    assert [m["accuracy"] for m in resumed] == [m["accuracy"] for m in straight[2:]]
    assert straight[-1]["accuracy"] > 0.2  # learns: 10 classes, chance is 0.1


def test_trial_rejects_bad_config():
    with pytest.raises(ValueError, match="unknown config keys"):
        _run({"learning_rate": 0.1})
    with pytest.raises(ValueError, match="lr must be positive"):
        _run({"lr": 0.0})


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# --- real Ray Tune runs --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def session():
    with ray_session(num_cpus=2, num_gpus=2) as s:  # 2 GPUs only in Ray's bookkeeping
        yield s


def _tuner(session, space, failure=None, **tune_kw):
    tune_kw.setdefault("reuse_actors", True)
    return tune.Tuner(train_classifier, param_space=space,
                      tune_config=tune.TuneConfig(metric="accuracy", mode="max", **tune_kw),
                      run_config=session.run_config(failure_config=failure))


@pytest.mark.timeout(300)
def test_two_tiny_trials_match_the_trial_run_here(session):
    results = _tuner(session, {"lr": tune.grid_search([0.01, 0.1]), "width": 8, "epochs": 2}).fit()
    assert results.num_errors == 0
    assert trial_epochs(results) == 4
    curves = learning_curves(results)
    for result in results:
        here, _ = _run(result.config)  # the same config, in this process
        assert curves[result.metrics["trial_id"]] == [m["accuracy"] for m in here]
    assert Path(session.storage_path).is_dir() and str(session.temp_dir) in result.path
    s = summarize(results, wall_s=1.0)
    assert s.trials == 2 and s.best_accuracy == max(max(c) for c in curves.values())


@pytest.mark.timeout(300)
def test_a_trial_that_raises_is_reported_and_the_search_ends(session):
    space = {"lr": 0.05, "width": 8, "epochs": 3, "crash_at_epoch": tune.grid_search([0, 2])}
    t0 = time.perf_counter()
    results = _tuner(session, space).fit()
    assert time.perf_counter() - t0 < 120
    assert results.num_errors == 1
    (message,) = trial_errors(results).values()
    assert "TrialCrash" in message and "crashed after epoch 2" in message
    ok = [r for r in results if r.error is None]
    assert len(ok) == 1 and ok[0].metrics["training_iteration"] == 3


@pytest.mark.timeout(300)
def test_a_crashed_trial_is_restored_from_its_checkpoint(session):
    space = {"lr": 0.05, "width": 8, "epochs": 3, "crash_at_epoch": 2}
    results = _tuner(session, space, failure=tune.FailureConfig(max_failures=1)).fit()
    assert results.num_errors == 0
    (result,) = list(results)
    straight, _ = _run({"lr": 0.05, "width": 8, "epochs": 3})
    # epoch 1 came from the first run, epochs 2-3 from the restored one: same numbers as straight
    assert learning_curves(results)[result.metrics["trial_id"]] == [m["accuracy"] for m in straight]


@pytest.mark.timeout(300)
def test_a_time_limit_stops_the_search_cleanly(session):
    # each trial would take ~100 epochs x 48 steps x 20 ms: far beyond the 4 s budget
    space = {"lr": tune.grid_search([0.01, 0.02, 0.05, 0.1]), "width": 8, "epochs": 100, "io_wait_ms": 20.0}
    t0 = time.perf_counter()
    results = _tuner(session, space, time_budget_s=4).fit()
    wall = time.perf_counter() - t0
    assert wall < 60, f"a 4 s time budget took {wall:.0f} s to stop"
    assert results.num_errors == 0
    assert all(r.metrics.get("training_iteration", 0) < 100 for r in results)
    ray.get(ray.remote(lambda: 1).remote())  # Ray still works after the stop


@pytest.mark.timeout(300)
def test_a_trial_sees_exactly_the_gpus_it_asked_for(session):
    """Asking for no GPU, a trial sees none (Ray 2.60 alone would leave every GPU visible to it);
    asking for a whole GPU or a share of one, it sees exactly one: CUDA_VISIBLE_DEVICES, read inside
    the trial by train_classifier, as lab 10's check_trial_devices compares it with the request."""
    assert session.resources()["GPU"] == 2
    # one trial per request; the trial's seed picks its request (tune.with_resources takes a callable)
    requests = {0: {"cpu": 1.0}, 1: {"cpu": 1.0, "gpu": 1.0}, 2: {"cpu": 1.0, "gpu": 0.5}}
    trainable = tune.with_resources(train_classifier, lambda config: tune.PlacementGroupFactory(
        [{key.upper(): value for key, value in requests[config["seed"]].items()}]))
    space = {"lr": 0.05, "width": 8, "epochs": 1, "seed": tune.grid_search(sorted(requests))}
    results = tune.Tuner(trainable, param_space=space, run_config=session.run_config(),
                         tune_config=tune.TuneConfig(metric="accuracy", mode="max", reuse_actors=False)).fit()
    assert results.num_errors == 0
    seen = {r.config["seed"]: r.metrics["cuda_visible_devices"] for r in results}
    assert seen[0] == ""  # no GPU given: every GPU hidden
    assert seen[1] in ("0", "1") and seen[2] in ("0", "1")  # one GPU id each
    if cuda_device_count() == 0:  # a CPU build: no trial trains on a GPU (test_resources has the GPU case)
        assert all(r.metrics["device"] == "cpu" and r.metrics["cuda_devices"] == 0 for r in results)
    for r in results:
        assert check_trial_devices([r], requests[r.config["seed"]], num_gpus=2)
    with pytest.raises(RuntimeError, match="asked Ray for .* but it saw 1"):  # a GPU it was not given
        check_trial_devices([r for r in results if r.config["seed"] == 1], {"cpu": 1.0}, num_gpus=2)


@pytest.mark.timeout(300)
def test_promotion_asha_runs_as_a_tune_scheduler(session):
    """PromotionASHA in a real Tuner.fit(): it stops trials (fewer trial-epochs than no stopping) and
    lets some finish, as Tune's ASHAScheduler does on the same results; Tune's ASHA is not used inside,
    and a wrapper of it is counted."""
    from ray.tune.schedulers import ASHAScheduler

    from gpulab.hpo.asha import PromotionASHA

    case = grading_lab10.comparison_case(random.Random(0))
    runs = grading_lab10.tune_comparison(PromotionASHA, case)
    yours, tunes, everything = runs["yours"], runs["Tune's ASHAScheduler"], runs["no stopping"]
    assert yours["Tune ASHA calls"] == 0 and everything["trial-epochs"] == 12 * 9
    assert 12 <= yours["trial-epochs"] <= 0.6 * everything["trial-epochs"], runs
    assert 1 <= yours["trials finished"] and 0.5 <= yours["trial-epochs"] / tunes["trial-epochs"] <= 2, runs

    class Wrapped(ASHAScheduler):
        def __init__(self, max_t, grace_period=1, reduction_factor=3):
            super().__init__(max_t=max_t, grace_period=grace_period, reduction_factor=reduction_factor)

    assert grading_lab10.tune_comparison(Wrapped, case)["yours"]["Tune ASHA calls"] > 0


def test_shutdown_leaves_no_ray_process(session):
    pids = [p.pid for p in ray_processes()]
    assert pids, "a running session has Ray processes under this one"
    session.shutdown()  # ray.shutdown(), then wait for (or kill) every Ray process it saw
    assert not ray.is_initialized()
    assert not [pid for pid in pids if _alive(pid)]
    assert ray_processes() == []
    assert not session.temp_dir.exists()


@pytest.mark.timeout(300)
def test_an_interrupted_run_leaves_no_ray_process():
    """KeyboardInterrupt (a notebook's stop button) inside the session still shuts Ray down."""
    seen: list[int] = []
    with pytest.raises(KeyboardInterrupt):
        with ray_session(num_cpus=1):
            assert ray.get(ray.remote(lambda: os.getpid()).remote()) != os.getpid()  # a worker process ran
            seen += [p.pid for p in ray_processes()]
            raise KeyboardInterrupt
    assert len(seen) >= 3  # GCS, raylet, worker (and agents)
    assert not ray.is_initialized() and ray_processes() == []
    assert not [pid for pid in seen if _alive(pid)]


def test_bad_session_arguments():
    with pytest.raises(ValueError, match="num_cpus"):
        ray_session(num_cpus=0)
    with pytest.raises(ValueError, match="75"):
        ray_session(object_store_mb=10)
    with pytest.raises(RuntimeError, match="not started"):
        ray_session().storage_path
