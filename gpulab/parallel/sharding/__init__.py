"""Sharding the training state over data-parallel ranks (lab 09).

- ``zero1``: :class:`ShardedOptimizer`, ZeRO stage 1 (each rank keeps the optimizer state of its
  share of the parameters); ``checkpoint``: its full ``state_dict``, gathered and scattered;
- ``zero2``: :class:`ZeRO2Optimizer`, ZeRO stage 2 over one flat buffer (reduce-scatter of the
  gradients, the shard's update, all-gather of the parameters); ``traffic``: the bytes a rank sends
  per step under DDP, ZeRO-1 and ZeRO-2;
- ``state_bytes``: the bytes of training state a rank holds, counted from its tensors;
- ``accumulation``: gradient accumulation with ``no_sync``, and a counter of collectives;
- ``fsdp``: FSDP2's ``fully_shard`` per block, then the root, and a probe of when weights are whole;
- ``runs``: DDP, ZeRO-1 and FSDP2 measured side by side in one launch.
"""

from gpulab.parallel.sharding.zero1 import ShardedOptimizer, balanced_owners
from gpulab.parallel.sharding.zero2 import ZeRO2Optimizer

__all__ = ["ShardedOptimizer", "balanced_owners", "ZeRO2Optimizer"]
