"""What lab 06 trains, fixed by seeds so that ranks, graders and references see the same thing.

- ``ddp_examples``: a fixed data set, plain SGD steps, :class:`BranchyNet` (an unused branch, for
  ``find_unused_parameters``) and ``TiedEmbeddingNet`` (one weight in two modules), and a
  torch DDP rank body;
- ``spawn_job``: the model, data and hyper-parameters of the ``mp.spawn`` script, and the
  single-process run it must reproduce.
"""

from gpulab.parallel.workloads.ddp_examples import BranchyNet

__all__ = ["BranchyNet"]
