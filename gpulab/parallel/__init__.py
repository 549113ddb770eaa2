"""Several devices: transfers between logical devices, DataParallel and the balanced criterion
(labs 04-05), DistributedDataParallel (lab 06), model and pipeline parallelism (lab 07).

The public names are re-exported here, so ``from gpulab.parallel import DataParallel`` works;
each lives in a module about one idea.
"""

# lab 06: DistributedDataParallel
from gpulab.parallel.launch import LaunchTimeoutError, RankFailedError, launch  # noqa: E402,F401
from gpulab.parallel.startup import rank_device, resolve_backend, threads_per_rank  # noqa: E402,F401
from gpulab.parallel.sampler import DistributedSampler, UnpaddedDistributedSampler  # noqa: E402,F401
from gpulab.parallel.ddp import BucketedDDP, NaiveDDP, allreduce_gradients, bucket_assignment, unused_parameters  # noqa: E402,F401
from gpulab.parallel.amp import amp_settings, amp_step, make_grad_scaler  # noqa: E402,F401
from gpulab.parallel.ddp_timing import StepTimingConfig, summarize_step_times, time_sync_strategies  # noqa: E402,F401
from gpulab.parallel.sampler import distributed_accuracy, epoch_orders  # noqa: E402,F401
from gpulab.parallel.ddp_check import BranchyNet, check_ddp_wrapping, compare_amp_steps, compare_with_single_process  # noqa: E402,F401
