"""DistributedDataParallel (lab 06): one process per device, gradients averaged by all-reduce.

The algorithm: ``allreduce`` (``NaiveDDP``: every gradient averaged after backward;
``OverlappedDDP``: each as soon as backward produced it), ``bucketed`` (``BucketedDDP``: in
buckets during backward), ``wrapper`` (what they share: identical replicas, buffers, ``no_sync``).

Lab 06's other references and instruments around it: ``sampler`` (DistributedSampler, the data
half of DDP), ``amp`` (mixed precision on the ranks), ``timing`` (step time per strategy),
``trace`` (when each all-reduce starts against backward), ``examples`` (the workloads it trains),
``ring_cost`` (the α–β cost of a ring all-reduce, and the bucket size it predicts), ``rebuild``
(buckets rebuilt from the ready order, as torch's reducer does), ``spawn_job`` (the job of the
``mp.spawn`` script).
Ranks are started by :mod:`gpulab.parallel.launcher`; ZeRO-1 (lab 09) is in
:mod:`gpulab.parallel.sharding`.
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
from gpulab.parallel.ddp.sampler import (
    DistributedSampler,
    UnpaddedDistributedSampler,
    distributed_accuracy,
    epoch_orders,
)
from gpulab.parallel.ddp.timing import StepTimingConfig, summarize_step_times, time_sync_strategies

__all__ = [
    "DistributedSampler", "UnpaddedDistributedSampler", "distributed_accuracy", "epoch_orders",
    "NaiveDDP", "OverlappedDDP", "BucketedDDP", "allreduce_gradients", "bucket_assignment", "unused_parameters",
    "amp_settings", "amp_step", "make_grad_scaler", "StepTimingConfig", "summarize_step_times", "time_sync_strategies",
]
