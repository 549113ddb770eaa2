"""gpulab.grading.lab07: the graders return what the student's pipeline did, as plain values. A real
pipeline gets through the barriers (forward, and the training step's forward and backward), code that
runs the stages one after the other does not, and says which; a timeline that breaks GPipe's schedule
is named; hung student code stops with StepTimeout; the timed work's result depends on its seed and
on all the work. And while lab 07 is graded, its masked references leave PipelinedModel working,
one micro-batch after the other. No test depends on machine speed.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
import types
import warnings

import pytest
import torch
from torch import nn

import gpulab
from gpulab.autograde.box.mask import mask_source, masked_names, write_masks
from gpulab.devices import logical_devices
from gpulab.grading import lab07
from gpulab.grading.lab07 import (
    OVERLAPPED,
    StepTimeout,
    reference_forward,
    run_with_timeout,
    schedule_facts,
    sequential_train_step,
    stages_overlap,
    train_step_overlap,
    train_step_schedule,
    whole_step,
)
from gpulab.parallel import PipelinedModel, SplitModel, StageEvent, batchnorm_to_groupnorm, split_model
from gpulab.parallel.pipeline import gpipe_train_step
from gpulab.parallel.pipeline import threads as threads_module


@pytest.fixture
def devices():
    return logical_devices(2, ["cpu"])


def _sequential(stages, devices, x, split_size):
    """The same micro-batches, one stage after the other: no overlap."""
    return PipelinedModel(SplitModel(list(stages), devices), split_size, overlap=False)(x)


def _mse(out, target):
    return (out - target).square().mean()


# --- run_with_timeout -----------------------------------------------------------------------------

def test_run_with_timeout_returns_raises_and_passes_grad_mode():
    assert run_with_timeout(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(KeyError, match="boom"):
        run_with_timeout(lambda: {}["boom"])
    with torch.no_grad():
        assert run_with_timeout(torch.is_grad_enabled) is False
        assert run_with_timeout(torch.is_grad_enabled, grad=True) is True
    assert run_with_timeout(torch.is_grad_enabled) is True


def test_run_with_timeout_gives_up_on_code_that_hangs_without_deciding_anything():
    never = threading.Event()
    t0 = time.perf_counter()
    with pytest.raises(StepTimeout, match="did not return within 1 s.*the other threads and the caller must stop too") as info:
        run_with_timeout(never.wait, timeout_s=1.0, what="pipelined_forward")
    assert time.perf_counter() - t0 < 5
    assert not isinstance(info.value, AssertionError)  # not a GradingError: the grader decides
    never.set()  # let the daemon thread finish


# --- the forward pass's barrier ---------------------------------------------------------------------

def test_a_real_pipeline_gets_through_the_barrier_and_returns_its_input(devices):
    x = torch.arange(4.0).unsqueeze(1)
    got = stages_overlap(reference_forward, devices, x)
    assert got["stages"] == OVERLAPPED and torch.equal(got["output"], x)


@pytest.mark.parametrize("meet", [0, 2, 5])
def test_the_barrier_meets_at_any_micro_batch(devices, meet):
    x = torch.randn(7, 2)
    got = stages_overlap(reference_forward, devices, x, meet)
    assert got["stages"] == OVERLAPPED and torch.equal(got["output"], x)


def test_stages_run_one_after_the_other_are_named_fast(devices):
    t0 = time.perf_counter()
    got = stages_overlap(_sequential, devices, torch.arange(4.0).unsqueeze(1), meet=1, timeout_s=1.0)
    assert got == {"stages": "one after the other: stage 0 never worked on micro-batch 2 while stage 1 worked on "
                             "micro-batch 1", "output": None}
    assert time.perf_counter() - t0 < 10  # the barrier times out; nothing waits forever


def test_a_pipeline_that_returns_the_wrong_thing_sends_it(devices):
    def drops_the_last_micro_batch(stages, devs, x, split_size):
        return reference_forward(stages, devs, x, split_size)[:-1]

    got = stages_overlap(drops_the_last_micro_batch, devices, torch.arange(4.0).unsqueeze(1))
    assert got["stages"] == OVERLAPPED and got["output"].shape == (3, 1)


def test_the_students_own_exception_is_not_a_verdict(devices):
    def stub(stages, devs, x, split_size):
        raise NotImplementedError()

    with pytest.raises(NotImplementedError):
        stages_overlap(stub, devices, torch.arange(4.0).unsqueeze(1))
    with pytest.raises(ValueError, match="needs at least 4 rows"):
        stages_overlap(reference_forward, devices, torch.arange(3.0).unsqueeze(1), meet=2)


# --- the training step: both passes' barriers, the loss and the gradients ----------------------------

def _forward_pipelined_backward_not(stages, devs, x, y, split_size, loss_fn, timeline=None):
    """Stage threads that keep one graph across the stages, then one .backward() in the caller:
    the forward overlaps, the backward runs every stage in this thread."""
    qs = [queue.SimpleQueue() for _ in range(len(stages) + 1)]
    micro = x.split(split_size)
    for m in micro:
        qs[0].put(m)

    def run(i):
        for _ in micro:
            qs[i + 1].put(stages[i](qs[i].get()))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stages))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    loss = loss_fn(torch.cat([qs[-1].get() for _ in micro]), y)
    loss.backward()
    return loss.item()


def test_gpipe_gets_through_both_barriers_with_the_batchs_loss_and_gradients(devices):
    got = train_step_overlap(gpipe_train_step, devices, torch.arange(4.0).unsqueeze(1))
    # loss = mean(x^2) = 3.5 with both weights 1; d loss / d weight = mean(2 x^2) = 7 for each
    assert got == {"forward": OVERLAPPED, "backward": OVERLAPPED, "loss": 3.5, "gradients": [7.0, 7.0]}


def test_gpipe_gets_through_barriers_met_anywhere(devices):
    x = torch.randn(6, 1)
    got = train_step_overlap(gpipe_train_step, devices, x, 3, 4)
    assert (got["forward"], got["backward"]) == (OVERLAPPED, OVERLAPPED)
    assert got["loss"] == pytest.approx(x.square().mean().item(), rel=1e-5)
    assert got["gradients"] == pytest.approx([2 * x.square().mean().item()] * 2, rel=1e-5)


def test_a_training_step_that_overlaps_only_the_forward_is_named_on_the_backward(devices):
    t0 = time.perf_counter()
    got = train_step_overlap(_forward_pipelined_backward_not, devices, torch.arange(4.0).unsqueeze(1), timeout_s=1.0)
    assert got["forward"] == OVERLAPPED and got["backward"].startswith("one after the other: stage 0 never back-propagated")
    assert got["loss"] is None
    assert time.perf_counter() - t0 < 15


def test_a_sequential_training_step_is_named_on_the_forward(devices):
    got = train_step_overlap(sequential_train_step, devices, torch.arange(4.0).unsqueeze(1), timeout_s=1.0)
    assert got["forward"].startswith("one after the other: stage 0 never worked on micro-batch 1")
    assert got["backward"] == "not reached"


def test_a_training_step_with_the_wrong_loss_or_gradients_sends_them(devices):
    def unweighted(stages, devs, x, y, split_size, loss_fn, timeline=None):
        return 4 * gpipe_train_step(stages, devs, x, y, split_size, loss_fn, timeline)  # a sum of 4 means

    assert train_step_overlap(unweighted, devices, torch.arange(4.0).unsqueeze(1))["loss"] == 14.0

    def halved(stages, devs, x, y, split_size, loss_fn, timeline=None):
        loss = gpipe_train_step(stages, devs, x, y, split_size, loss_fn, timeline)
        for p in stages[0].parameters():
            p.grad /= 2
        return torch.tensor(loss)  # a one-element tensor counts as the loss

    got = train_step_overlap(halved, devices, torch.arange(4.0).unsqueeze(1))
    assert got["gradients"] == [3.5, 7.0] and got["loss"] == 3.5


# --- GPipe's schedule ---------------------------------------------------------------------------------

def _timeline(devices, split_size=2):
    split = split_model(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), devices, boundaries=[2])
    events = []
    gpipe_train_step(list(split.stages), split.devices, torch.randn(8, 3), torch.randn(8, 2), split_size, _mse, events)
    return events


def test_a_gpipe_timeline_has_every_event_in_order(devices):
    assert schedule_facts(_timeline(devices), 2, 4) == {"events": 16, "missing": [], "unexpected": [],
                                                         "out of order": "none"}


def _moved(events, phase, stage, micro_batch, start, end=None):
    return [StageEvent(e.stage, e.micro_batch, e.phase, start, start + e.duration if end is None else end)
            if (e.phase, e.stage, e.micro_batch) == (phase, stage, micro_batch) else e for e in events]


def test_timelines_that_break_the_schedule_are_named(devices):
    events = _timeline(devices)
    first = min(e.start for e in events)
    dropped = schedule_facts([e for e in events if (e.phase, e.stage, e.micro_batch) != ("backward", 0, 3)], 2, 4)
    assert dropped["events"] == 15 and dropped["missing"] == [("backward", 0, 3)]
    assert schedule_facts(events + events[:1], 2, 4)["events"] == 17
    assert schedule_facts(_moved(events, "forward", 1, 2, first - 1.0), 2, 4)["out of order"] == \
        "forward: stage 1 started micro-batch 2 before stage 0 finished it"
    assert schedule_facts(_moved(events, "backward", 0, 0, first - 1.0, first - 0.5), 2, 4)["out of order"] == \
        "backward: stage 0 started micro-batch 0 before stage 1 finished it"
    last_forward_of_1 = max(e.end for e in events if (e.phase, e.stage) == ("forward", 1))
    assert schedule_facts(_moved(events, "backward", 1, 0, last_forward_of_1 - 1e-3), 2, 4)["out of order"].startswith(
        "stage 1 started the backward of micro-batch 0 before its last forward")
    assert schedule_facts([("forward", 0, 0)], 2, 4) == {"timeline": "not StageEvents: [('forward', 0, 0)]"}


def test_train_step_schedule_runs_the_step_and_clears_its_gradients(devices):
    split = split_model(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)), devices, boundaries=[2])
    facts = train_step_schedule(gpipe_train_step, split, torch.randn(10, 3), torch.randn(10, 2), 3, _mse)
    assert facts == {"events": 16, "missing": [], "unexpected": [], "out of order": "none"}  # 4 micro-batches
    assert all(p.grad is None for p in split.parameters())


# --- the measured work: stages that wait (modelled device time) ------------------------------------

def _fastest(work, seeds=(1, 2, 3)):
    """The measurements of ``work`` as the grader's rule reads them (this process, after a warm-up)."""
    from gpulab.grading.measured import measure_here

    work(0)
    return [measure_here(work, s)[0] for s in seeds]


def _wall_verdict(runs):
    from gpulab.verdict import rules

    return rules.judge("measure.wall", runs, None, floor_s=lab07.sleeping_step_bounds()["gpipe"], at_most_s=0.58)


def test_the_sleeping_work_is_seeded_and_agrees_between_pipeline_and_baseline(devices):
    pipelined = lab07.sleeping_step_work(gpipe_train_step, devices, micro_batches=4, device_s=0.001)
    baseline = lab07.sleeping_step_work(sequential_train_step, devices, micro_batches=4, device_s=0.001)
    a, b, c = pipelined(7), baseline(7), pipelined(8)
    assert isinstance(a["loss"], float) and len(a["gradients"]) == 2 and None not in a["gradients"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["gradients"] == pytest.approx(b["gradients"], rel=1e-5)
    assert a["loss"] != c["loss"] and pipelined(7) == a  # fresh stages each run: the same seed, the same result


def test_the_sleeping_work_fails_fast_on_a_stub_and_marks_missing_gradients(devices):
    def stub(*args):
        raise NotImplementedError()

    t0 = time.perf_counter()
    with pytest.raises(NotImplementedError):
        lab07.sleeping_step_work(stub, devices)(1)
    assert time.perf_counter() - t0 < 5

    def no_backward(stages, devs, x, y, split_size, loss_fn, timeline=None):
        return 1.0

    assert lab07.sleeping_step_work(no_backward, devices)(1)["gradients"] == [None, None]


def test_gpipe_passes_the_measured_check_and_one_after_the_other_fails_it(devices):
    bounds = lab07.sleeping_step_bounds()
    assert bounds == pytest.approx({"gpipe": 0.45, "forward only": 0.625, "one after the other": 0.8})
    assert _wall_verdict(_fastest(lab07.sleeping_step_work(gpipe_train_step, devices))) is None
    why = _wall_verdict(_fastest(lab07.sleeping_step_work(sequential_train_step, devices), seeds=(1, 2)))
    assert why is not None and "more than the 580.0 ms allowed" in why


def test_a_forward_only_pipeline_fails_the_measured_check(devices):
    """A pipelined forward, every backward in the caller's thread (exercise 2 plus loss.backward())."""

    def forward_only(stages, devs, x, y, split_size, loss_fn, timeline=None):
        micro, handoff = x.split(split_size), queue.Queue()
        outs = [None] * len(micro)

        def first():
            with torch.enable_grad():
                for m in micro:
                    handoff.put(stages[0](m))

        def second():
            with torch.enable_grad():
                for j in range(len(micro)):
                    outs[j] = stages[1](handoff.get())

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loss = loss_fn(torch.cat(outs), y)
        loss.backward()  # every stage's backward, in this thread
        return loss.item()

    work = lab07.sleeping_step_work(forward_only, devices)
    assert None not in work(1)["gradients"], "a right step, only slow"
    why = _wall_verdict(_fastest(work, seeds=(1, 2)))
    assert why is not None and "more than" in why


def test_whole_step_leaves_the_model_untouched_and_accumulates_over_steps():
    model = batchnorm_to_groupnorm(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 2)))
    x, y = torch.randn(5, 3, 4, 4), torch.randint(0, 2, (5,))
    one = whole_step(model, x, y, nn.functional.cross_entropy)
    two = whole_step(model, x, y, nn.functional.cross_entropy, steps=2)
    assert all(p.grad is None for p in model.parameters())
    assert set(one["parameters"]) == {n for n, _ in model.named_parameters()} and one["input"].shape == x.shape
    for name, g in one["parameters"].items():
        torch.testing.assert_close(two["parameters"][name], 2 * g)


def test_named_gradients_copies_and_names_by_the_whole_models_order(devices):
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    split = split_model(model, devices)
    split(torch.randn(4, 2)).sum().backward()
    got = lab07.named_gradients(nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1)), split)
    assert list(got) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    before = got["0.weight"].clone()
    split(torch.randn(4, 2)).sum().backward()
    assert torch.equal(got["0.weight"], before)  # a copy: the next backward does not change it
    extra = lab07.named_gradients(nn.Linear(2, 3), split)
    assert list(extra)[2:] == ["extra parameter 2", "extra parameter 3"]


# --- masking --------------------------------------------------------------------------------------

def test_the_references_are_the_exercises_answers_and_can_be_masked(tmp_path):
    assert masked_names(lab07.REFERENCES) == ["gpulab.parallel.pipeline.gpipe.gpipe_train_step",
                                              "gpulab.parallel.pipeline.threads.run_in_stage_threads",
                                              "gpulab.parallel.pipeline.bubble.bubble_fraction",
                                              "gpulab.parallel.pipeline.torch_stages.torch_pipeline_step"]
    binds = write_masks(lab07.REFERENCES, tmp_path)
    masked = {original.name: copy.read_text() for copy, original in binds if copy.suffix == ".py"}
    assert set(masked) == {"gpipe.py", "threads.py", "bubble.py", "torch_stages.py"}
    assert "MaskedReference('gpulab.parallel.pipeline.torch_stages.torch_pipeline_step')" in masked["torch_stages.py"]
    assert "MaskedReference('gpulab.parallel.pipeline.threads.run_in_stage_threads')" in masked["threads.py"]
    assert "class StageThreads" in masked["threads.py"] and "def _one_after_another" in masked["threads.py"]
    # the whole step goes (its threads and queues are its body); the graders' baseline,
    # micro_batch_step(..., overlap=False) in step.py, is not masked at all
    assert "MaskedReference('gpulab.parallel.pipeline.gpipe.gpipe_train_step')" in masked["gpipe.py"]
    assert "queue.SimpleQueue()" not in masked["gpipe.py"] and "def gpipe_train_step(" in masked["gpipe.py"]


def test_pipelined_model_runs_one_micro_batch_after_another_where_its_schedule_is_masked(devices, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    x, y = torch.randn(9, 3), torch.randn(9, 2)
    whole = whole_step(model, x, y, _mse)

    def masked(*args, **kwargs):
        raise gpulab.MaskedReference("gpulab.parallel.pipeline.threads.run_in_stage_threads")

    monkeypatch.setattr(threads_module, "run_in_stage_threads", masked)
    pipe = PipelinedModel(split_model(model, devices, boundaries=[2]), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = _mse(pipe(x), y)
        loss.backward()
        fused = PipelinedModel(pipe.split, 4).forward_backward(x, y, _mse)
    assert any("not available while lab 07 is graded" in str(w.message) for w in caught)
    assert loss.item() == pytest.approx(whole["loss"], rel=1e-5) and fused == pytest.approx(whole["loss"], rel=1e-5)
    for (name, g), p in zip(whole["parameters"].items(), pipe.split.parameters()):
        torch.testing.assert_close(p.grad, 2 * g, msg=name)  # two steps accumulated
    # and the barrier sees it: without the schedule, PipelinedModel does not overlap
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = stages_overlap(reference_forward, devices, torch.arange(4.0).unsqueeze(1), timeout_s=0.5)
    assert got["stages"].startswith("one after the other")


def test_the_masked_schedule_module_still_imports(monkeypatch):
    source = threads_module.__file__
    text = mask_source(open(source).read(), {"run_in_stage_threads": "x.run_in_stage_threads"})
    module = types.ModuleType("gpulab_masked_threads")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    exec(compile(text, source, "exec"), module.__dict__)
    with pytest.raises(gpulab.MaskedReference):
        module.run_in_stage_threads(None, None)
    assert hasattr(module.StageThreads, "_one_after_another")
