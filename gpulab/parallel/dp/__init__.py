"""DataParallel from its pieces (labs 04-05), as ``torch.nn.parallel`` builds it.

``scatter_gather`` (split a batch, collect the outputs), ``replicate`` (a differentiable copy of
the module per device), ``parallel_apply`` (one thread per replica), ``data_parallel`` (the four
wired together), ``balanced`` (the loss computed on every device: DataParallelModel and
DataParallelCriterion), ``step_memory`` (the per-device memory of one training step) and
``batch_scaling`` (what a bigger batch buys: time to a target loss, the learning rate scaled).
"""

from gpulab.parallel.dp.balanced import DataParallelCriterion, DataParallelModel
from gpulab.parallel.dp.data_parallel import DataParallel
from gpulab.parallel.dp.parallel_apply import ReplicaError, parallel_apply
from gpulab.parallel.dp.replicate import replicate
from gpulab.parallel.dp.scatter_gather import gather, scatter, scatter_kwargs

__all__ = ["DataParallel", "DataParallelModel", "DataParallelCriterion", "replicate", "parallel_apply", "ReplicaError",
           "scatter", "scatter_kwargs", "gather"]
