"""Lab 11's graders return, for right answers written the way the lab asks, what the expected-value
functions compute, and for wrong ones something that differs from it."""

from __future__ import annotations

import random

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from gpulab.evidence.codec import encode
from gpulab.grading import lab11
from gpulab.parallel.tp import fuse_qkv
from gpulab.verdict.check import decode, verdict


class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ReduceInPlace(Reduce):
    """All-reduces into its input: the output is right, the caller's tensor is not."""

    @staticmethod
    def forward(ctx, x):
        dist.all_reduce(x)
        return x.clone()


class Column(nn.Module):
    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 0)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, 0)[rank].clone())

    def forward(self, x):
        return F.linear(Copy.apply(x), self.weight, self.bias)


class Row(nn.Module):
    def __init__(self, linear, rank, world_size):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return Reduce.apply(F.linear(x, self.weight)) + self.bias


class RowBiasEverywhere(Row):
    """Adds the bias before the all-reduce: N copies of it in the sum."""

    def forward(self, x):
        return Reduce.apply(F.linear(x, self.weight, self.bias))


class MLP(nn.Module):
    def __init__(self, mlp, rank, world_size):
        super().__init__()
        self.fc1, self.fc2 = Column(mlp[0], rank, world_size), Row(mlp[2], rank, world_size)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    def __init__(self, attn, rank, world_size):
        super().__init__()
        self.head_dim, self.causal = attn.head_dim, attn.causal
        self.qkv, self.out = Column(fuse_qkv(attn, world_size), rank, world_size), Row(attn.out, rank, world_size)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (t.reshape(B, T, -1, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


class Replicated(nn.Module):
    """Right outputs from the full block on every rank: no parallelism, full memory, no collectives."""

    def __init__(self, mlp, rank, world_size):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(x)


def _judge(kind, actual, expected, **params):
    """The grader's verdict, on values sent as the kernels send them (None: passes)."""
    return verdict({"kind": kind, "what": "test", "hint": "", **params}, decode(encode(actual)), decode(encode(expected)))


def test_conjugates_right_and_in_place():
    shape, seed = lab11.conjugate_case(random.Random(1))
    want = lab11.expected_conjugates(4, shape, seed)
    assert _judge("close", lab11.run_conjugates(Copy, Reduce, 4, shape, seed), want, atol=lab11.TOLERANCE, rtol=0) is None
    wrong = lab11.run_conjugates(Copy, ReduceInPlace, 2)
    assert "input_after" in _judge("close", wrong, lab11.expected_conjugates(2), atol=lab11.TOLERANCE, rtol=0)
    swapped = lab11.run_conjugates(Reduce, Copy, 2)  # f and g exchanged
    assert _judge("close", swapped, lab11.expected_conjugates(2), atol=lab11.TOLERANCE, rtol=0) is not None


def test_linear_layers_right_and_bias_added_n_times():
    case = lab11.linear_case(random.Random(2))
    for n in (2, 4):
        got = lab11.run_linear(Column, Row, n, **case)
        assert _judge("close", got, lab11.expected_linear(n, **case), atol=lab11.TOLERANCE, rtol=0) is None
    wrong = lab11.run_linear(Column, RowBiasEverywhere, 2)
    assert "row" in _judge("close", wrong, lab11.expected_linear(2), atol=lab11.TOLERANCE, rtol=0)


def test_blocks_right_and_replicated():
    cases, seed = lab11.block_cases(random.Random(3))
    for block, cls, n in (("mlp", MLP, 4), ("attention", Attention, 2)):
        got = lab11.run_block(cls, block, n, cases, seed)
        assert _judge("close", got["values"], lab11.expected_block(block, n, cases, seed), atol=lab11.TOLERANCE, rtol=0) is None
        assert got["comm"] == lab11.analytic_comm(block, n, cases)
        assert got["weight_bytes"] == lab11.weight_bytes_per_rank(block, n)
        assert got["dtensor_params"] is False
    assert _judge("close", got["values"], lab11.dtensor_block("attention", 2, cases, seed), atol=lab11.TOLERANCE, rtol=0) is None
    lazy = lab11.run_block(Replicated, "mlp", 2)
    assert lazy["weight_bytes"] != lab11.weight_bytes_per_rank("mlp", 2)
    assert lazy["comm"] != lab11.analytic_comm("mlp", 2)
    assert _judge("close", lazy["values"], lab11.expected_block("mlp", 2), atol=lab11.TOLERANCE, rtol=0) is not None  # grads named mlp.*
