"""DistributedDataParallel (lab 06): one process per device, gradients averaged by all-reduce.

- ``launch`` starts ranks, even from a notebook (``startup`` holds its backend, device, thread and
  port choices; ``_worker`` is the rank's side);
- ``sampler``: DistributedSampler, padded and unpadded;
- ``allreduce``: gradient averaging after backward (``NaiveDDP``) and per parameter during backward
  (``OverlappedDDP``); ``bucketed``: in buckets during backward (``BucketedDDP``); ``wrapper``: what they share;
- ``amp``: mixed precision with torch.amp (bf16, or fp16 + GradScaler); ``timing``: step times per strategy;
  ``trace``: when each all-reduce starts, against the gradients backward produces;
- ``examples``: the small workloads the lab trains;
- ``failures``: what a failed launch reports and whom it blames; ``_watchdog``: no rank outlives its caller.

Lab 09 (sharding): ``sharded`` (ShardedOptimizer, ZeRO stage 1), ``state_bytes`` (bytes per rank,
counted from the tensors each rank holds), ``accumulation`` (no_sync and counting collectives),
``sharding_runs`` (DDP, ZeRO-1 and FSDP2 measured side by side).
"""

from gpulab.parallel.ddp.allreduce import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
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
from gpulab.parallel.ddp.sharded import ShardedOptimizer
from gpulab.parallel.ddp.startup import rank_device, resolve_backend, threads_per_rank
from gpulab.parallel.ddp.timing import StepTimingConfig, summarize_step_times, time_sync_strategies

__all__ = [
    "launch", "RankFailedError", "LaunchTimeoutError", "rank_device", "resolve_backend", "threads_per_rank",
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "OverlappedDDP", "BucketedDDP", "ShardedOptimizer", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times", "time_sync_strategies",
]
