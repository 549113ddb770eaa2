"""Small workloads for lab 06: a fixed data set, plain SGD steps, a model with an unused branch, and
one with a tied weight.

:func:`torch_ddp_steps` is a rank body for :func:`gpulab.parallel.launch`: it trains
:class:`BranchyNet` under ``torch.nn.parallel.DistributedDataParallel`` so the lab can show what
``find_unused_parameters`` changes. The graders of :mod:`gpulab.grading.lab06` train the same
workloads, so a student's code and the references see the same data.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import nn

from gpulab.parallel.launcher.startup import rank_device

__all__ = ["NUM_SAMPLES", "example_data", "token_data", "sgd_steps", "BranchyNet", "TiedEmbeddingNet",
           "torch_ddp_steps"]

NUM_SAMPLES = 24  # divisible by 1, 2, 3, 4, 6, 8 ranks: equal shards, so mean of means = full mean


def example_data(sizes: Sequence[int], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``NUM_SAMPLES`` inputs of width ``sizes[0]`` and class targets below ``sizes[-1]``, fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(NUM_SAMPLES, sizes[0], generator=g), torch.randint(0, sizes[-1], (NUM_SAMPLES,), generator=g)


def token_data(vocab_size: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """``NUM_SAMPLES`` input tokens and next-token targets below ``vocab_size``, fixed by ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (NUM_SAMPLES,), generator=g), torch.randint(0, vocab_size, (NUM_SAMPLES,), generator=g)


def sgd_steps(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, num_steps: int, lr: float,
              after_backward: Callable[[], object] = lambda: None) -> None:
    """``num_steps`` of SGD with momentum 0.9 on cross-entropy; ``after_backward`` runs between
    backward and the optimizer step (where gradient averaging goes)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for _ in range(num_steps):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(inputs), targets).backward()
        after_backward()
        opt.step()


class BranchyNet(nn.Module):
    """A trunk, a main head, and an auxiliary head that ``forward`` uses only when ``use_aux``.

    Models like this (an auxiliary loss switched off, a frozen-in-practice branch, a mixture of
    experts where some experts get no tokens) are what break torch DDP without
    ``find_unused_parameters=True``.
    """

    def __init__(self, use_aux: bool = False, features: int = 8, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.use_aux = use_aux
        self.trunk = nn.Sequential(nn.Linear(features, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)
        self.aux_head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        out = self.head(h)
        return out + 0.5 * self.aux_head(h) if self.use_aux else out


class TiedEmbeddingNet(nn.Module):
    """A token embedding whose weight is also the output layer's: one parameter shared by two modules
    (GPT-2 ties them this way).

    ``model.parameters()`` lists the shared weight once; walking ``model.modules()`` meets it twice,
    and a hook registered once per module would fire twice. Its two uses add up in one ``.grad``:
    ``register_post_accumulate_grad_hook`` fires once per backward pass, after both.
    """

    def __init__(self, vocab_size: int = 16, dim: int = 12) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab_size, dim)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # (vocab_size, dim): the same Parameter in both modules

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.mix(self.embed(tokens)))  # (B, dim)
        return self.head(h)  # (B, vocab_size)


def torch_ddp_steps(rank: int, world_size: int, find_unused_parameters: bool, use_aux: bool = False,
                    num_steps: int = 3) -> dict[str, torch.Tensor]:
    """Rank body: train :class:`BranchyNet` under torch DDP with the given flag; returns the parameters.

    Each rank trains on its shard of :func:`example_data`; with ``find_unused_parameters=False`` and
    ``use_aux=False`` torch DDP waits for a gradient that never comes and raises on the next step.
    """
    device = rank_device(rank)
    model = BranchyNet(use_aux).to(device)
    inputs, targets = (t.chunk(world_size)[rank].to(device) for t in example_data((8, 4)))
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                              find_unused_parameters=find_unused_parameters)
    sgd_steps(ddp, inputs, targets, num_steps, lr=0.2)
    return {n: p.detach().cpu() for n, p in model.named_parameters()}
