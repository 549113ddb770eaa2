"""Several devices: transfers between logical devices, DataParallel and the balanced criterion
(labs 04-05), DistributedDataParallel (lab 06), model and pipeline parallelism (lab 07).

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works;
each lives in a module about one idea.
"""
