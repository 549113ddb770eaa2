"""When tensor parallelism pays: communication against compute per layer, on paper (lab 11).

    .venv/bin/python -m pytest tests/parallel/tp/test_cost.py

A tensor-parallel MLP layer of hidden size h on N ranks, for ``tokens`` rows, in forward:

- compute: two matmuls of ``2 * tokens * h * 4h / N`` FLOPs each, so ``16 tokens h^2 / N``;
- communication: one ring all-reduce of ``tokens * h`` elements; each rank sends (and receives)
  ``2 (N-1)/N`` of it (reduce-scatter then all-gather: Patarasuk and Yuan, "Bandwidth optimal
  all-reduce algorithms", 2009), plus a latency per hop.

Their ratio, ``comm / compute ~ (N-1) * FLOPS / (4 h * bandwidth)`` for 2-byte (bf16) activations, falls as h grows and rises
with N: TP pays for wide layers on fast links. Within a node NVLink gives each GPU hundreds of GB/s;
across nodes a GPU's share of InfiniBand is about an order of magnitude less, so TP stays inside
a node and data or pipeline parallelism spans nodes. The figures in :data:`LINKS` are nominal
one-direction bandwidths per GPU from vendors' data sheets, for the arithmetic only.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Link", "LINKS", "ring_allreduce_seconds", "mlp_layer_seconds"]


@dataclass(frozen=True)
class Link:
    """A link between two ranks: bytes per second one way, and seconds per message hop."""

    name: str
    bandwidth: float
    latency: float


LINKS = {
    "nvlink": Link("NVLink 4 (H100 SXM, within a node)", 450e9, 5e-6),
    "pcie": Link("PCIe 4.0 x16 (within a node, no NVLink)", 25e9, 10e-6),
    "infiniband": Link("InfiniBand NDR 400 Gb/s per GPU (across nodes)", 50e9, 10e-6),
    "ethernet": Link("100 Gb Ethernet (across nodes)", 12.5e9, 30e-6),
}


def ring_allreduce_seconds(nbytes: float, world_size: int, link: Link) -> float:
    """Time of a ring all-reduce of ``nbytes`` over ``world_size`` ranks on ``link``: ``2 (N-1)``
    steps, each sending ``nbytes / N`` and paying the latency once (0 for one rank)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    steps = 2 * (world_size - 1)
    return steps * (nbytes / world_size / link.bandwidth + link.latency)


def mlp_layer_seconds(hidden: int, tokens: int, world_size: int, link: Link, flops: float,
                      element_size: int = 2) -> dict[str, float]:
    """Forward ``compute`` and ``comm`` seconds of one TP MLP layer (``h -> 4h -> h``).

    Args:
        hidden: h; tokens: batch size x sequence length; world_size: N.
        link: the ranks' link; flops: one device's sustained FLOP/s (e.g. 400e12 bf16 on an H100).
        element_size: bytes per activation element (2: bf16).

    Returns:
        ``{"compute": s, "comm": s, "comm_over_compute": ratio}``.
    """
    compute = 16 * tokens * hidden**2 / world_size / flops
    comm = ring_allreduce_seconds(tokens * hidden * element_size, world_size, link)
    return {"compute": compute, "comm": comm, "comm_over_compute": comm / compute}
