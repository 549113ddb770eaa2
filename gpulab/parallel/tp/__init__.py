"""Tensor parallelism (lab 11): one layer's matrix multiply split over ranks, as Megatron-LM does.

- :mod:`~gpulab.parallel.tp.conjugate`: ``f`` and ``g``, the identity/all-reduce pair of autograd Functions;
- :mod:`~gpulab.parallel.tp.gather`: all-gather and reduce-scatter pairs (naive gathering, sequence parallelism);
- :mod:`~gpulab.parallel.tp.layers`: ``ColumnParallelLinear``, ``RowParallelLinear``;
- :mod:`~gpulab.parallel.tp.mlp`, :mod:`~gpulab.parallel.tp.attention`: the MLP block and attention split by heads;
- :mod:`~gpulab.parallel.tp.sequence`: LayerNorm + MLP with the sequence split over ranks;
- :mod:`~gpulab.parallel.tp.dtensor`: the same blocks through PyTorch's ``parallelize_module``;
- :mod:`~gpulab.parallel.tp.mesh2d`: TP x DP on a 2-D device mesh;
- :mod:`~gpulab.parallel.tp.counting`, :mod:`~gpulab.parallel.tp.memory`, :mod:`~gpulab.parallel.tp.cost`:
  collectives and bytes counted against the analytic figures, and the bandwidth arithmetic;
- :mod:`~gpulab.parallel.tp.runs`, :mod:`~gpulab.parallel.tp.timing`: rank bodies the tests, the
  benchmark and the lab run.

    .venv/bin/python -m pytest tests/parallel/tp          # every check, on 2 and 4 gloo ranks
    .venv/bin/python benchmarks/tensor_parallel.py        # one JSON line
"""

from gpulab.parallel.tp.attention import SelfAttention, TensorParallelAttention, fuse_qkv
from gpulab.parallel.tp.conjugate import CopyToParallel, ReduceFromParallel, copy_to_parallel, reduce_from_parallel
from gpulab.parallel.tp.counting import CollectiveCounter, analytic_allreduces
from gpulab.parallel.tp.layers import ColumnParallelLinear, RowParallelLinear
from gpulab.parallel.tp.mlp import TensorParallelMLP, feed_forward

__all__ = ["CopyToParallel", "ReduceFromParallel", "copy_to_parallel", "reduce_from_parallel",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP", "feed_forward",
           "SelfAttention", "TensorParallelAttention", "fuse_qkv", "CollectiveCounter", "analytic_allreduces"]
