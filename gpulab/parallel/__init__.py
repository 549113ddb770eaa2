"""Several devices: DataParallel and the balanced criterion (labs 04-05), DistributedDataParallel
(lab 06), model and pipeline parallelism (lab 07), sharding (lab 09).

- :mod:`gpulab.parallel.comm`: ``to``, ``broadcast``, ``scatter``, ``gather``, ``reduce_add``
  between logical devices, differentiable.
- :mod:`gpulab.parallel.dp`: DataParallel from its pieces, and the balanced criterion.
- :mod:`gpulab.parallel.launcher`: starting ranks (``launch``), from a notebook too.
- :mod:`gpulab.parallel.ddp`: gradient all-reduce (naive, per parameter, bucketed), DistributedSampler, AMP.
- :mod:`gpulab.parallel.sharding`: ZeRO-1 and the bytes a rank holds (lab 09).
- :mod:`gpulab.parallel.pipeline`: split models and GPipe pipelining.

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works.
As in torch.nn.parallel, the functions ``replicate`` and ``parallel_apply`` hide their modules'
names here: import the modules from :mod:`gpulab.parallel.dp`.
"""

from gpulab.parallel import comm
from gpulab.parallel.comm import broadcast, gather, reduce_add, scatter, to
from gpulab.parallel.ddp import (
    BucketedDDP,
    DistributedSampler,
    NaiveDDP,
    OverlappedDDP,
    StepTimingConfig,
    UnpaddedDistributedSampler,
    allreduce_gradients,
    amp_settings,
    amp_step,
    bucket_assignment,
    distributed_accuracy,
    epoch_orders,
    make_grad_scaler,
    summarize_step_times,
    time_sync_strategies,
    unused_parameters,
)
from gpulab.parallel.ddp.examples import BranchyNet
from gpulab.parallel.dp import DataParallel, DataParallelCriterion, DataParallelModel, parallel_apply, replicate
from gpulab.parallel.launcher import (
    LaunchTimeoutError,
    RankFailedError,
    launch,
    rank_device,
    resolve_backend,
    threads_per_rank,
)
from gpulab.parallel.pipeline import (
    PipelinedModel,
    SplitModel,
    StageEvent,
    batchnorm_to_groupnorm,
    bubble_fraction,
    intra_op_threads,
    measured_bubble,
    plot_timeline,
    split_model,
)
from gpulab.parallel.sharding import ShardedOptimizer

__all__ = [
    "comm", "to", "broadcast", "scatter", "gather", "reduce_add",
    "DataParallel", "DataParallelModel", "DataParallelCriterion", "replicate", "parallel_apply",
    "BranchyNet", "launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank",
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "OverlappedDDP", "BucketedDDP", "ShardedOptimizer", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times", "time_sync_strategies",
    "SplitModel", "split_model", "PipelinedModel", "intra_op_threads", "StageEvent", "bubble_fraction",
    "measured_bubble", "plot_timeline", "batchnorm_to_groupnorm",
]

