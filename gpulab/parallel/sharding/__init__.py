"""Sharding the training state over data-parallel ranks (lab 09).

- ``zero1``: :class:`ShardedOptimizer`, ZeRO stage 1 (each rank keeps the optimizer state of its
  share of the parameters); ``checkpoint``: its full ``state_dict``, gathered and scattered;
- ``state_bytes``: the bytes of training state a rank holds, counted from its tensors;
- ``accumulation``: gradient accumulation with ``no_sync``, and a counter of collectives;
- ``runs``: DDP, ZeRO-1 and FSDP2 measured side by side in one launch.
"""

from gpulab.parallel.sharding.zero1 import ShardedOptimizer, balanced_owners

__all__ = ["ShardedOptimizer", "balanced_owners"]
