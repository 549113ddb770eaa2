"""Several devices: transfers between logical devices, DataParallel and the balanced criterion
(labs 04-05), DistributedDataParallel (lab 06), model and pipeline parallelism (lab 07).

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works;
each lives in a module about one idea:

- :mod:`gpulab.parallel.comm`: ``to``, ``broadcast``, ``scatter``, ``gather``, ``reduce_add``
  between logical devices, differentiable.
- lab 06: :mod:`~gpulab.parallel.launch` (start ranks, even from a notebook), ``startup``
  (backend, device, threads, port), ``sampler`` (DistributedSampler), ``ddp`` (NaiveDDP,
  BucketedDDP), ``amp`` (torch.amp), ``ddp_timing`` (step times) and ``ddp_check`` (graders).
- lab 07: :mod:`~gpulab.parallel.model_parallel` (split_model), ``pipeline`` (PipelinedModel),
  ``bubble`` (bubble fraction, Gantt chart), ``pipeline_timing``, ``norms``, ``pipeline_grading``.
"""

from gpulab.parallel.comm import broadcast, gather, reduce_add, scatter, to

__all__ = ["to", "broadcast", "scatter", "gather", "reduce_add"]

# Labs 04-05: DataParallel from its pieces (scatter_gather, replicate, parallel_apply, data_parallel),
# the balanced criterion (balanced) and the memory measurements (step_memory). As in torch.nn.parallel,
# the re-exported functions `replicate` and `parallel_apply` hide their modules as attributes of this
# package: import from the modules with `from gpulab.parallel.parallel_apply import ...`.
from gpulab.parallel.balanced import DataParallelCriterion, DataParallelModel  # noqa: E402
from gpulab.parallel.data_parallel import DataParallel  # noqa: E402
from gpulab.parallel.parallel_apply import parallel_apply  # noqa: E402
from gpulab.parallel.replicate import replicate  # noqa: E402

__all__ += ["DataParallel", "DataParallelModel", "DataParallelCriterion", "replicate", "parallel_apply"]

# lab 06: DistributedDataParallel
from gpulab.parallel.launch import LaunchTimeoutError, RankFailedError, launch  # noqa: E402
from gpulab.parallel.startup import rank_device, resolve_backend, threads_per_rank  # noqa: E402
from gpulab.parallel.sampler import (DistributedSampler, UnpaddedDistributedSampler,  # noqa: E402
                                     distributed_accuracy, epoch_orders)
from gpulab.parallel.ddp import (BucketedDDP, NaiveDDP, allreduce_gradients, bucket_assignment,  # noqa: E402
                                 unused_parameters)
from gpulab.parallel.amp import amp_settings, amp_step, make_grad_scaler  # noqa: E402
from gpulab.parallel.ddp_timing import StepTimingConfig, summarize_step_times, time_sync_strategies  # noqa: E402
from gpulab.parallel.ddp_check import (BranchyNet, check_ddp_wrapping, compare_amp_steps,  # noqa: E402
                                       compare_with_single_process)

__all__ += [
    "launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank",
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "BucketedDDP", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times",
    "time_sync_strategies", "BranchyNet", "check_ddp_wrapping", "compare_amp_steps", "compare_with_single_process",
]

# lab 07: model and pipeline parallelism
from gpulab.parallel.bubble import StageEvent, bubble_fraction, measured_bubble, plot_timeline  # noqa: E402
from gpulab.parallel.model_parallel import SplitModel, split_model  # noqa: E402
from gpulab.parallel.norms import batchnorm_to_groupnorm  # noqa: E402
from gpulab.parallel.pipeline import PipelinedModel  # noqa: E402
from gpulab.parallel.pipeline_timing import intra_op_threads  # noqa: E402

__all__ += ["SplitModel", "split_model", "PipelinedModel", "intra_op_threads", "StageEvent", "bubble_fraction",
            "measured_bubble", "plot_timeline", "batchnorm_to_groupnorm"]

# lab 09: sharded data parallelism (ZeRO-1); state_bytes, accumulation and sharding_runs are imported from their modules
from gpulab.parallel.sharded import ShardedOptimizer  # noqa: E402

__all__ += ["ShardedOptimizer"]
