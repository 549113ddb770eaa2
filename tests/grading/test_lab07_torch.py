"""gpulab.grading.lab07_torch and gpulab.parallel.pipeline.torch_stages: torch.distributed.pipelining
on 2 gloo ranks gives one process's loss and gradients over the same micro-batches (ScheduleGPipe and
Schedule1F1B), and the lab's checks, decided by the judge as in a graded run, tell that from a wrong
split, a missing micro-batch scaling, a summed loss, one micro-batch, and a thread GPipe that disagrees.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

from gpulab import grading
from gpulab.grading import lab07, lab07_torch
from gpulab.grading.checks import GradingError
from gpulab.models import resnet
from gpulab.parallel import RankFailedError, batchnorm_to_groupnorm
from gpulab.parallel.pipeline import gpipe_train_step
from gpulab.parallel.pipeline.torch_stages import torch_pipeline_step

CE = nn.functional.cross_entropy
TOL = {"rtol": 1e-3, "atol": 1e-4}  # the notebook's tolerances


@pytest.fixture(scope="module")
def case():
    torch.manual_seed(0)
    model = batchnorm_to_groupnorm(resnet(18, num_classes=10, width=4))
    return model, torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))


def _check(result, model, x, y, split_size):
    """The test cell's checks: against one process on the same micro-batches."""
    expected = lab07_torch.one_process_step(model, x, y, split_size, CE)
    grading.check_close(lab07_torch.loss_and_gradients(result), lab07_torch.loss_and_gradients(expected),
                        what="loss, gradients", **TOL)
    grading.check_equal(result["micro-batch rows"], expected["micro-batch rows"], what="rows per micro-batch")


def _torch_step(rank, world_size, layers, boundary, x, y, split_size, loss_fn, *, scale_grads=True, first=None,
                second=None, micro=None, reduce=torch.mean):
    """A hand-written torch pipeline step with one knob per mistake."""
    first = layers[:boundary] if first is None else first
    second = layers[boundary:] if second is None else second
    module = nn.Sequential(*(first if rank == 0 else second))
    stage = PipelineStage(module, rank, world_size, torch.device("cpu"))
    runner = ScheduleGPipe(stage, micro or x.size(0) // split_size, loss_fn=loss_fn, scale_grads=scale_grads)
    losses = []
    runner.step(x) if rank == 0 else runner.step(target=y, losses=losses)
    loss = reduce(torch.stack(losses)).item() if rank else None
    return {"loss": loss, "gradients": [p.grad for p in module.parameters()]}


def no_scaling(r, w, layers, b, x, y, s, f, schedule):
    return _torch_step(r, w, layers, b, x, y, s, f, scale_grads=False)


def summed_loss(r, w, layers, b, x, y, s, f, schedule):
    return _torch_step(r, w, layers, b, x, y, s, f, reduce=torch.sum)


def skips_a_block(r, w, layers, b, x, y, s, f, schedule):  # rank 1 starts one block late (shapes still fit)
    return _torch_step(r, w, layers, b, x, y, s, f, second=layers[b + 1:])


def block_twice(r, w, layers, b, x, y, s, f, schedule):  # the block at the cut on both ranks
    return _torch_step(r, w, layers, b, x, y, s, f, first=layers[:b + 1])


def one_micro_batch(r, w, layers, b, x, y, s, f, schedule):  # right gradients, but no pipeline
    return _torch_step(r, w, layers, b, x, y, s, f, micro=1)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_reference_equals_one_process_and_the_thread_gpipe(case, schedule) -> None:
    model, x, y = case
    result = lab07_torch.run_torch_pipeline(torch_pipeline_step, model, 5, x, y, 2, CE, schedule)
    assert result["loss on rank 0"] is None and result["micro-batch rows"] == [2]
    assert result["last stage's order"] == {"gpipe": "FFFFBBBB", "1f1b": "FBFBFBFB"}[schedule]
    assert result["last stage's order"] == lab07_torch.schedule_order(schedule, 4)
    _check(result, model, x, y, 2)
    # strictly: the one-process whole-batch step (equal micro-batches: the same mean)
    whole = lab07.whole_step(model, x, y, CE)
    torch.testing.assert_close(result["parameters"], whole["parameters"], rtol=1e-4, atol=1e-6)
    own = lab07_torch.own_gpipe_step(gpipe_train_step, model, 5, lab07.lab_devices(2), x, y, 2, CE)
    diff = lab07_torch.difference(result, own)
    grading.check_close(diff, lab07_torch.zeros_like(result), rtol=0, atol=1e-4, what="torch pipeline - own GPipe")
    assert 0 < max(d.abs().max().item() for d in diff["parameters"].values()) < 1e-5  # real values, compared


@pytest.mark.parametrize(("wrong", "message"), [
    (no_scaling, r"at \['parameters'\]"), (summed_loss, r"at \['loss'\]"), (skips_a_block, r"at \['loss'\]"),
    (block_twice, r"at \['loss'\]"),
])
def test_wrong_answers_fail_against_one_process(case, wrong, message) -> None:
    model, x, y = case
    result = lab07_torch.run_torch_pipeline(wrong, model, 1, x, y, 2, CE)
    with pytest.raises(GradingError, match=f"loss, gradients: values differ.*{message}"):
        _check(result, model, x, y, 2)
    with pytest.raises(GradingError, match="own GPipe: values differ"):  # and against the thread GPipe of the same lab
        own = lab07_torch.own_gpipe_step(gpipe_train_step, model, 1, lab07.lab_devices(2), x, y, 2, CE)
        grading.check_close(lab07_torch.difference(result, own), lab07_torch.zeros_like(own), rtol=0, atol=1e-4,
                            what="torch pipeline - own GPipe")


def test_one_micro_batch_has_the_gradients_but_fails_the_rows(case) -> None:
    model, x, y = case
    result = lab07_torch.run_torch_pipeline(one_micro_batch, model, 5, x, y, 2, CE)
    with pytest.raises(GradingError, match="rows per micro-batch"):
        _check(result, model, x, y, 2)


def always_gpipe(r, w, layers, b, x, y, s, f, schedule):  # right values, but the schedule asked for is ignored
    return _torch_step(r, w, layers, b, x, y, s, f)


def test_the_schedule_asked_for_is_the_one_that_ran(case) -> None:
    """1F1B and GPipe give the same loss and gradients: only the order of the last stage's passes
    tells them apart, and a step that always runs GPipe fails when 1F1B is asked for."""
    model, x, y = case
    result = lab07_torch.run_torch_pipeline(always_gpipe, model, 5, x, y, 2, CE, "1f1b")
    _check(result, model, x, y, 2)  # the values alone cannot see it
    with pytest.raises(GradingError, match="expected 'FBFBFBFB', got 'FFFFBBBB'"):
        grading.check_equal(result["last stage's order"], lab07_torch.schedule_order("1f1b", 4), what="1f1b: order")


def test_a_wrong_thread_gpipe_disagrees_with_the_right_torch_pipeline(case) -> None:
    model, x, y = case

    def doubled(stages, devices, *args):  # a thread GPipe whose gradients are twice the batch's
        loss = gpipe_train_step(stages, devices, *args)
        for p in (p for s in stages for p in s.parameters()):
            p.grad.mul_(2)
        return loss

    result = lab07_torch.run_torch_pipeline(torch_pipeline_step, model, 5, x, y, 4, CE)
    own = lab07_torch.own_gpipe_step(doubled, model, 5, lab07.lab_devices(2), x, y, 4, CE)
    with pytest.raises(GradingError, match="own GPipe"):
        grading.check_close(lab07_torch.difference(result, own), lab07_torch.zeros_like(result), rtol=0, atol=1e-4,
                            what="torch pipeline - own GPipe")


def test_difference_keeps_missing_and_misshapen_gradients() -> None:
    a = {"loss": 1.0, "parameters": {"w": torch.ones(2), "b": torch.ones(3)}}
    b = {"loss": 0.5, "parameters": {"w": torch.ones(2), "b": torch.ones(2), "c": torch.ones(1)}}
    diff = lab07_torch.difference(a, b)
    assert diff["loss"] == 0.5 and torch.equal(diff["parameters"]["w"], torch.zeros(2))
    assert diff["parameters"]["b"] == "a tensor of shape (3,) against a tensor of shape (2,)"
    assert diff["parameters"]["c"] == "None against a tensor of shape (1,)"


def test_bad_arguments_and_returns_are_named(case) -> None:
    model, x, y = case
    with pytest.raises(RankFailedError, match="split_size must be a positive int dividing"):
        lab07_torch.run_torch_pipeline(torch_pipeline_step, model, 5, x, y, 3, CE)
    with pytest.raises(RankFailedError, match="boundary must be between 1 and 9"):
        lab07_torch.run_torch_pipeline(torch_pipeline_step, model, 10, x, y, 2, CE)
    with pytest.raises(TypeError, match="must return a dict"):
        lab07_torch.run_torch_pipeline(lambda *a: [1.0], model, 5, x, y, 2, CE)
