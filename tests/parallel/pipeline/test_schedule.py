"""gpulab.parallel.pipeline.schedule and the interleaved cut: the simulated pass against the bubble
formulas (GPipe's and the interleaved one), against the recorded schedule of real threads, and the
cut it chooses against the per-stage rule on a ResNet's measured costs.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from gpulab.devices import logical_devices
from gpulab.models import resnet
from gpulab.parallel import PipelinedModel, bubble_fraction, split_model
from gpulab.parallel.pipeline import balance, replay
from gpulab.parallel.pipeline.balance import interleaved_boundaries, pipeline_boundaries
from gpulab.parallel.pipeline.schedule import pass_span, step_span

from .test_interleaved import _Sleep

# lab 07's ResNet-18 (width 16, 64x64 images), per layer, ms for a micro-batch of 32 on one thread:
# the stem's backward skips its input gradient, the late blocks' backward is 2-3x their forward
RESNET_FORWARD = [7.0, 2.1, 1.6, 1.6, 1.2, 1.1, 1.0, 1.3, 1.0, 0.2]
RESNET_BACKWARD = [4.0, 2.2, 2.6, 2.7, 1.7, 2.0, 1.6, 3.1, 2.9, 0.4]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 4, 7])
def test_equal_stages_take_m_plus_s_minus_1_steps(stages, micro):
    assert pass_span([2.0] * stages, list(range(stages)), micro) == pytest.approx(2.0 * (micro + stages - 1))


@pytest.mark.parametrize("micro", [2, 3, 4, 5, 8])
def test_interleaved_equal_stages_match_their_bubble_formula(micro):
    # four stages of 0.5 on devices 0, 1, 0, 1: each device is busy M, the pass lasts M / (1 - bubble)
    span = pass_span([0.5] * 4, [0, 1, 0, 1], micro)
    assert 1 - micro / span == pytest.approx(bubble_fraction(2, micro, chunks_per_device=2))
    assert span < pass_span([1.0, 1.0], [0, 1], micro)  # the same work as two stages, a smaller bubble


def test_the_simulation_predicts_the_threads_schedule():
    # unequal stages on shared devices: no formula; the threads' timeline, replayed with free
    # hand-offs, must last what the simulation of the same rule says
    devices = logical_devices(2, ["cpu"])
    seconds = [0.03, 0.01, 0.02, 0.015]
    pipe = PipelinedModel(split_model([_Sleep(s) for s in seconds], devices * 2), 1)
    with torch.no_grad():
        pipe(torch.ones(5, 1))
    events = replay(pipe.timeline)
    measured = [e.duration for e in sorted(events, key=lambda e: e.stage)]
    per_stage = [sum(d for e, d in zip(sorted(events, key=lambda e: e.stage), measured) if e.stage == s) / 5
                 for s in range(4)]
    span = max(e.end for e in events) - min(e.start for e in events)
    assert span == pytest.approx(pass_span(per_stage, [0, 1, 0, 1], 5), rel=0.05)


def test_step_span_runs_the_backward_pass_in_reverse():
    # backward: the last stage first. With a slow last stage the backward pass's fill is long.
    assert step_span([1, 1], [1, 3], [0, 1], 2) == pytest.approx(pass_span([1, 1], [0, 1], 2) + 3 + 3 + 1)


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="one lane per stage"):
        pass_span([1, 2], [0], 2)
    with pytest.raises(ValueError, match=">= 0"):
        pass_span([1, -2], [0, 1], 2)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="micro_batches"):
            pass_span([1, 2], [0, 1], bad)
    with pytest.raises(ValueError, match="one forward and one backward"):
        step_span([1, 2], [1], [0, 1], 2)
    with pytest.raises(ValueError, match="cannot cut 3 layers into 4 stages"):
        interleaved_boundaries([1, 2, 3], [1, 2, 3], [0, 1, 0, 1])


def _simulated(cut, lanes, micro):
    edges = list(zip((0, *cut), (*cut, len(RESNET_FORWARD))))
    return step_span([sum(RESNET_FORWARD[a:b]) for a, b in edges], [sum(RESNET_BACKWARD[a:b]) for a, b in edges],
                     lanes, micro)


def test_the_interleaved_cut_beats_the_per_stage_rule_on_a_resnet():
    lanes = [0, 1, 0, 1]
    cut = interleaved_boundaries(RESNET_FORWARD, RESNET_BACKWARD, lanes)
    per_stage = pipeline_boundaries(RESNET_FORWARD, RESNET_BACKWARD, 4)
    assert cut != per_stage
    assert _simulated(cut, lanes, 4) < 0.97 * _simulated(per_stage, lanes, 4)
    # and it is the best of every cut, on the measure it minimises
    score = {c: sum(_simulated(c, lanes, m) / m for m in balance.INTERLEAVED_MICRO_BATCHES)
             for c in itertools.combinations(range(1, 10), 3)}
    assert score[tuple(cut)] == pytest.approx(min(score.values()))


def test_too_many_cuts_falls_back_to_the_per_stage_rule(monkeypatch):
    monkeypatch.setattr(balance, "MAX_SIMULATED_CUTS", 1)
    assert (interleaved_boundaries(RESNET_FORWARD, RESNET_BACKWARD, [0, 1, 0, 1])
            == pipeline_boundaries(RESNET_FORWARD, RESNET_BACKWARD, 4))


def test_split_model_cuts_interleaved_stages_by_simulation(monkeypatch):
    devices = logical_devices(2, ["cpu"])
    monkeypatch.setattr(balance, "phase_times", lambda layers, sample, **kw: (RESNET_FORWARD, RESNET_BACKWARD))
    model = resnet(18, num_classes=10, width=4)
    sample = torch.randn(2, 3, 32, 32)
    interleaved = split_model(model, devices * 2, balance="time", sample=sample)
    assert interleaved.boundaries == interleaved_boundaries(RESNET_FORWARD, RESNET_BACKWARD, [0, 1, 0, 1])
    two = split_model(resnet(18, num_classes=10, width=4), devices, balance="time", sample=sample)
    assert two.boundaries == pipeline_boundaries(RESNET_FORWARD, RESNET_BACKWARD, 2)
    assert isinstance(interleaved.stages[0], nn.Sequential)
