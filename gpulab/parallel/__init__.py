"""Several devices: transfers between logical devices, DataParallel and the balanced criterion
(labs 04-05), DistributedDataParallel (lab 06), model and pipeline parallelism (lab 07).

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works;
each lives in a module about one idea:

- :mod:`gpulab.parallel.comm`: ``to``, ``broadcast``, ``scatter``, ``gather``, ``reduce_add``
  between logical devices, differentiable.
"""

from gpulab.parallel.comm import broadcast, gather, reduce_add, scatter, to

__all__ = ["to", "broadcast", "scatter", "gather", "reduce_add"]

# lab 07: model and pipeline parallelism
from gpulab.parallel.bubble import StageEvent, bubble_fraction, measured_bubble, plot_timeline  # noqa: E402
from gpulab.parallel.model_parallel import SplitModel, split_model  # noqa: E402
from gpulab.parallel.norms import batchnorm_to_groupnorm  # noqa: E402
from gpulab.parallel.pipeline import PipelinedModel  # noqa: E402
from gpulab.parallel.pipeline_timing import intra_op_threads  # noqa: E402

__all__ += ["SplitModel", "split_model", "PipelinedModel", "intra_op_threads", "StageEvent", "bubble_fraction",
            "measured_bubble", "plot_timeline", "batchnorm_to_groupnorm"]
