"""DistributedDataParallel (lab 06): one process per device, gradients averaged by all-reduce.

- ``launch`` starts ranks, even from a notebook (``startup`` holds its backend, device, thread and
  port choices; ``_worker`` is the rank's side);
- ``sampler``: DistributedSampler, padded and unpadded;
- ``allreduce``: gradient averaging, per parameter (``NaiveDDP``) and bucketed (``BucketedDDP``);
- ``amp``: mixed precision with torch.amp; ``timing``: step times per strategy;
- ``examples``: the small workloads the lab trains.
"""

from gpulab.parallel.ddp.allreduce import (
    BucketedDDP,
    NaiveDDP,
    allreduce_gradients,
    bucket_assignment,
    unused_parameters,
)
from gpulab.parallel.ddp.amp import amp_settings, amp_step, make_grad_scaler
from gpulab.parallel.ddp.launch import LaunchTimeoutError, RankFailedError, launch
from gpulab.parallel.ddp.sampler import (
    DistributedSampler,
    UnpaddedDistributedSampler,
    distributed_accuracy,
    epoch_orders,
)
from gpulab.parallel.ddp.startup import rank_device, resolve_backend, threads_per_rank
from gpulab.parallel.ddp.timing import StepTimingConfig, summarize_step_times, time_sync_strategies

__all__ = [
    "launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank",
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "BucketedDDP", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times", "time_sync_strategies",
]
