"""Several devices: DataParallel and the balanced criterion (labs 04-05), DistributedDataParallel
(lab 06), model and pipeline parallelism (lab 07), sharding (lab 09).

- :mod:`gpulab.parallel.comm`: ``to``, ``broadcast``, ``scatter``, ``gather``, ``reduce_add``
  between logical devices, differentiable.
- :mod:`gpulab.parallel.dp`: DataParallel from its pieces, and the balanced criterion.
- :mod:`gpulab.parallel.launcher`: starting ranks (``launch``), from a notebook too.
- :mod:`gpulab.parallel.ddp`: gradient all-reduce (naive, per parameter, bucketed), the DDP algorithm.
- :mod:`gpulab.parallel.sampler`: DistributedSampler, the data half of DDP; :mod:`gpulab.parallel.amp`:
  mixed precision on the ranks.
- :mod:`gpulab.parallel.measure`: step time, all-reduce traces and the ring's α–β cost (lab 06);
  :mod:`gpulab.parallel.workloads`: the models and jobs lab 06 trains.
- :mod:`gpulab.parallel.sharding`: ZeRO-1, ZeRO-2 and the bytes a rank holds and sends (lab 09).
- :mod:`gpulab.parallel.pipeline`: split models and GPipe pipelining.

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works.
As in torch.nn.parallel, the functions ``replicate`` and ``parallel_apply`` hide their modules'
names here: import the modules from :mod:`gpulab.parallel.dp`.
"""

from gpulab.parallel import comm
from gpulab.parallel.amp import amp_settings, amp_step, make_grad_scaler
from gpulab.parallel.comm import broadcast, gather, reduce_add, scatter, to
from gpulab.parallel.ddp import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    allreduce_gradients,
    bucket_assignment,
    unused_parameters,
)
from gpulab.parallel.dp import DataParallel, DataParallelCriterion, DataParallelModel, parallel_apply, replicate
from gpulab.parallel.launcher import (
    LaunchTimeoutError,
    RankFailedError,
    launch,
    rank_device,
    resolve_backend,
    threads_per_rank,
)
from gpulab.parallel.measure import StepTimingConfig, summarize_step_times, time_sync_strategies
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
from gpulab.parallel.sampler import DistributedSampler, UnpaddedDistributedSampler, distributed_accuracy, epoch_orders
from gpulab.parallel.sharding import ShardedOptimizer, ZeRO2Optimizer
from gpulab.parallel.workloads import BranchyNet

__all__ = [
    "comm", "to", "broadcast", "scatter", "gather", "reduce_add",
    "DataParallel", "DataParallelModel", "DataParallelCriterion", "replicate", "parallel_apply",
    "BranchyNet", "launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank",
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "OverlappedDDP", "BucketedDDP", "ShardedOptimizer", "ZeRO2Optimizer", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times", "time_sync_strategies",
    "SplitModel", "split_model", "PipelinedModel", "intra_op_threads", "StageEvent", "bubble_fraction",
    "measured_bubble", "plot_timeline", "batchnorm_to_groupnorm",
]

