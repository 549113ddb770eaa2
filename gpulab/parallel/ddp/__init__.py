"""DistributedDataParallel (lab 06): one process per device, gradients averaged by all-reduce.

Only the algorithm lives here: ``allreduce`` (``NaiveDDP``: every gradient averaged after
backward; ``OverlappedDDP``: each as soon as backward produced it), ``bucketed``
(``BucketedDDP``: in buckets during backward), ``rebuild`` (buckets rebuilt from the order
backward really produced the gradients, as torch's reducer does), ``wrapper`` (what they share:
identical replicas, buffers, ``no_sync``).

Around it, elsewhere in :mod:`gpulab.parallel`: ranks are started by ``launcher``; the data
half of DDP is ``sampler`` (DistributedSampler); mixed precision on the ranks is ``amp``;
``measure`` times and traces the gradient synchronisation and holds the α–β cost of a ring
all-reduce; ``workloads`` has the models, data and spawn-script job lab 06 trains; ZeRO (lab 09)
is ``sharding``.
"""

from gpulab.parallel.ddp.allreduce import (
    BucketedDDP,
    NaiveDDP,
    OverlappedDDP,
    allreduce_gradients,
    bucket_assignment,
    unused_parameters,
)

__all__ = ["NaiveDDP", "OverlappedDDP", "BucketedDDP", "allreduce_gradients", "bucket_assignment", "unused_parameters"]
