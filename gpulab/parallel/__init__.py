"""Several devices: transfers between logical devices, DataParallel and the balanced criterion
(labs 04-05), DistributedDataParallel (lab 06), model and pipeline parallelism (lab 07).

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works;
each lives in a module about one idea:

- :mod:`gpulab.parallel.comm`: ``to``, ``broadcast``, ``scatter``, ``gather``, ``reduce_add``
  between logical devices, differentiable.
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
