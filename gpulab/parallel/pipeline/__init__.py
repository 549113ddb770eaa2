"""Model and pipeline parallelism (lab 07): a model split over devices, then micro-batches.

- ``split``: :func:`split_model` cuts a model into stages on logical devices (``SplitModel``);
- ``balance``: what each layer costs, and where to cut (per pass, for GPipe; by simulation, for
  interleaved stages and the fused step); ``schedule``: the CPU schedule's length simulated from
  stage costs;
- ``gpipe``: :func:`gpipe_train_step`, GPipe's training step in one file (lab 07's exercise);
- ``pipelined``: :class:`PipelinedModel`, GPipe's fill and drain over micro-batches (and
  ``forward_backward``: a training step in one sweep); ``threads`` is its CPU schedule engine (a
  thread per device; a device may hold interleaved stages), ``streams`` its CUDA-stream schedule;
- ``step``: :func:`micro_batch_step` (the step on that engine, or its micro-batches one after
  the other: lab 07's baseline);
- ``bubble``: the bubble fraction, measured, predicted and replayed with free hand-offs, and the
  Gantt chart;
- ``torch_stages``: the same two-stage step on ``torch.distributed.pipelining`` (a rank per stage);
- ``timing``: step timing, and one intra-op thread per stage; ``norms``: BatchNorm to GroupNorm.
"""

from gpulab.parallel.pipeline.bubble import (
    StageEvent,
    bubble_fraction,
    handoff_delays,
    measured_bubble,
    plot_timeline,
    replay,
)
from gpulab.parallel.pipeline.gpipe import gpipe_train_step
from gpulab.parallel.pipeline.norms import batchnorm_to_groupnorm
from gpulab.parallel.pipeline.pipelined import PipelinedModel
from gpulab.parallel.pipeline.split import SplitModel, split_model
from gpulab.parallel.pipeline.step import micro_batch_step
from gpulab.parallel.pipeline.timing import intra_op_threads

__all__ = ["SplitModel", "split_model", "PipelinedModel", "gpipe_train_step", "micro_batch_step", "intra_op_threads",
           "StageEvent", "bubble_fraction", "measured_bubble", "replay", "handoff_delays", "plot_timeline",
           "batchnorm_to_groupnorm"]
