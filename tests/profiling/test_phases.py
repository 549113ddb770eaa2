"""gpulab.profiling.phases and lab 01's grader for it: torch.profiler on one's own loop, checked against a
stopwatch that opens no profiler range, on the same run; right and wrong answers told apart."""

from __future__ import annotations

import random
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from gpulab.evidence.codec import encode
from gpulab.grading import lab01
from gpulab.profiling.phases import DATA, STEP, Stopwatch, profile_phases, trace_shares
from gpulab.verdict import check as judge

CASE = {"active": 3, "batch_size": 8, "sample_cost_s": 0.002, "lr": 0.05}
RIGHT_PLACEMENT = {"recorded fetches": 3, "fetches outside your data ranges": 0, "fetches inside your step ranges": 0,
                   "recorded steps": 3, "steps outside your step ranges": 0, "steps inside your data ranges": 0}


def _verdict(kind: str, actual, expected, **params) -> str | None:
    spec = {"kind": kind, "what": "case", **params}
    return judge.verdict(spec, judge.decode(encode(actual)), judge.decode(encode(expected)))


def test_stopwatch_times_what_it_wraps():
    watch = Stopwatch()
    batches = list(watch.loader([0.01, 0.0, 0.02]))
    assert batches == [0.01, 0.0, 0.02] and len(watch.data_s) == 3
    step = watch.step(time.sleep)
    for b in batches:
        step(b)
    assert watch.step_s[0] >= 0.01 and watch.step_s[2] >= 0.02
    shares = watch.shares(skip=1)
    assert shares[DATA] + shares[STEP] == pytest.approx(1.0) and shares[STEP] > 0.9
    with pytest.raises(ValueError, match="none after skipping 3"):
        watch.shares(skip=3)


def test_profiler_ranges_agree_with_the_stopwatch(tmp_path):
    """A data-bound loop (busy loader, cheap step) and a step-bound one: the reference's ranges
    give the stopwatch's shares to within 3 points, and the loop trains like a plain one."""
    data_share = {}
    for cost in (0.004, 0.0):
        case = {**CASE, "sample_cost_s": cost}
        run = lab01.phases_run(profile_phases, 3, case, str(tmp_path / "t.json"))
        assert run["batches"] == 5
        assert {k: run["ranges"][k] for k in ("data", "step", "ProfilerStep#2", "ProfilerStep#4")} == {
            "data": 3, "step": 3, "ProfilerStep#2": 1, "ProfilerStep#4": 1}
        assert run["placement"] == RIGHT_PLACEMENT
        assert run["profiler"][DATA] + run["profiler"][STEP] == pytest.approx(1.0)  # of the ranges' sum, as the stopwatch
        for k in (DATA, STEP):
            assert abs(run["profiler"][k] - run["stopwatch"][k]) < 0.03, (cost, run)
        data_share[cost] = run["stopwatch"][DATA]
        torch.testing.assert_close(run["params"], lab01.plain_loop(3, case))
    assert data_share[0.004] > 5 * data_share[0.0]  # 32 ms of CPU per batch against a loader that costs nothing


def test_trace_shares_needs_steps(tmp_path):
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("data"):
            torch.ones(3).sum()
    prof.export_chrome_trace(str(tmp_path / "no_steps.json"))
    with pytest.raises(ValueError, match="no ProfilerStep"):
        trace_shares(tmp_path / "no_steps.json", ["data"])


def _for_loop(loader, train_step, trace_path, active=6):
    """A wrong answer: `for batch in loader` puts the wait for a batch outside the data range."""
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=active)) as prof:
        for batch in loader:
            with record_function("data"):
                pass
            with record_function("step"):
                train_step(batch)
            prof.step()
    prof.export_chrome_trace(trace_path)
    return prof


def _one_range_open(loader, train_step, trace_path, active=6):
    """A wrong answer: the data range left open around the step (the step counted as data)."""
    it = iter(loader)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=active)) as prof:
        for _ in range(2 + active):
            with record_function("data"):
                batch = next(it)
                with record_function("step"):
                    train_step(batch)
            prof.step()
    prof.export_chrome_trace(trace_path)
    return prof


def _step_first(loader, train_step, trace_path, active=6):
    """A second right design: prof.step() at the top of each iteration, the ranges opened by hand,
    and a while loop that ends on the loader's StopIteration."""
    it = iter(loader)
    prof = profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=active))
    prof.start()
    first = True
    while True:
        if not first:
            prof.step()
        first = False
        data = record_function("data")
        data.__enter__()
        try:
            batch = next(it)
        except StopIteration:
            data.__exit__(None, None, None)
            break
        data.__exit__(None, None, None)
        with record_function("step"):
            train_step(batch)
    prof.stop()
    prof.export_chrome_trace(trace_path)
    return prof


def _skips_warmup(loader, train_step, trace_path, active=6):
    """A wrong answer: no warm-up step (and one batch left untrained)."""
    it = iter(loader)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=0, active=active)) as prof:
        for _ in range(1 + active):
            with record_function("data"):
                batch = next(it)
            with record_function("step"):
                train_step(batch)
            prof.step()
    prof.export_chrome_trace(trace_path)
    return prof


@pytest.mark.filterwarnings("ignore:Profiler won.t be using warmup")
def test_grader_tells_wrong_answers_apart(tmp_path):
    seed, case = 11, lab01.phases_case(random.Random(2))
    want = lab01.phases_run(profile_phases, seed, case, str(tmp_path / "ref.json"))
    keys = ("batches", "ranges")
    keys = keys + ("placement",)
    right = lab01.phases_run(profile_phases, seed, case, str(tmp_path / "right.json"))
    assert _verdict("equal", {k: right[k] for k in keys}, {k: want[k] for k in keys}) is None
    other = lab01.phases_run(_step_first, seed, case, str(tmp_path / "other.json"))
    assert _verdict("equal", other["placement"], want["placement"]) is None, other["placement"]
    assert {k: other["ranges"].get(k) for k in ("data", "step")} == {"data": case["active"], "step": case["active"]}
    torch.testing.assert_close(other["params"], lab01.plain_loop(seed, case))

    wrong = lab01.phases_run(_for_loop, seed, {**case, "sample_cost_s": 0.003}, str(tmp_path / "for.json"))
    assert _verdict("between", wrong["profiler"][DATA] - wrong["stopwatch"][DATA], None, lo=-0.03, hi=0.03)
    assert wrong["placement"]["fetches outside your data ranges"] == case["active"]
    assert _verdict("equal", wrong["placement"], want["placement"]) is not None
    nested = lab01.phases_run(_one_range_open, seed, case, str(tmp_path / "nested.json"))
    assert nested["placement"]["steps inside your data ranges"] == case["active"], nested["placement"]
    assert _verdict("equal", nested["placement"], want["placement"]) is not None
    short = lab01.phases_run(_skips_warmup, seed, case, str(tmp_path / "short.json"))
    assert _verdict("equal", {k: short[k] for k in keys}, {k: want[k] for k in keys}) is not None
    assert _verdict("close", short["params"], lab01.plain_loop(seed, case), rtol=1e-4, atol=1e-5) is not None
