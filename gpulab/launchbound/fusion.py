"""Fusion with torch.compile: an elementwise-heavy block, its graph break, and what inductor makes of it (lab 12).

    python -c "import torch; from gpulab.launchbound.fusion import *; print(explain_block(clipped_block, torch.randn(16, 64)))"

:func:`clipped_block` is a chain of small elementwise ops and row means, each stage clipped to
90 % of its largest magnitude. Eager, every op is dispatched on its own (about 40 per call). The
clip reads its limit with ``.item()``: a host sync, and a **graph break** for TorchDynamo, which
cannot put a Python float read from a tensor into a graph (``capture_scalar_outputs=False``).
Compiled, the block falls apart into pieces with a trip through Python between them, and can be
slower than eager. :func:`clipped_block_fused` keeps the limit a tensor: one graph, which inductor
turns into one C++ loop nest on a CPU (Triton kernels on a GPU).

Compiling costs seconds (about 1-3 s for this block on 2 cores, more the first time a process
compiles anything), and the compiled code is only faster where overhead dominated: for large
tensors the eager ops are already doing arithmetic, and there is little to win.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["STAGES", "clipped_stage", "clipped_block", "clipped_block_fused", "count_ops", "profiled_kernels", "BlockExplained",
           "explain_block", "generated_code", "kernels_in", "compile_settings"]

STAGES = 6


def clipped_stage(x: torch.Tensor) -> torch.Tensor:
    """One stage: a scaled sine, the row mean removed, clipped to 90 % of its largest magnitude."""
    x = torch.sin(x) * 1.01 + 0.1
    x = x - x.mean(dim=-1, keepdim=True)  # (rows, cols) - (rows, 1)
    limit = x.abs().amax().item() * 0.9  # a host sync, and a graph break under torch.compile
    return x.clamp(-limit, limit)


def clipped_block(x: torch.Tensor, stages: int = STAGES) -> torch.Tensor:
    """``stages`` clipped stages in a row: the naive block, with a graph break in every stage."""
    for _ in range(stages):
        x = clipped_stage(x)
    return x


def clipped_block_fused(x: torch.Tensor, stages: int = STAGES) -> torch.Tensor:
    """The same block with the limit kept a tensor: no sync, no graph break, one graph.

    ``torch.clamp`` takes tensor bounds, so the limit never has to leave the device.
    """
    for _ in range(stages):
        x = torch.sin(x) * 1.01 + 0.1
        x = x - x.mean(dim=-1, keepdim=True)
        limit = x.abs().amax() * 0.9  # a 0-d tensor: stays in the graph
        x = torch.clamp(x, -limit, limit)
    return x


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] = self.ops.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[..., Any], *args: Any) -> dict[str, int]:
    """The aten ops that ``fn(*args)`` dispatches, by name: each one an eager kernel (a launch on a GPU).

    Run a compiled function through :func:`kernels_in` instead: its fused kernels are not aten ops.
    """
    with _OpCounter() as counter:
        fn(*args)
    return counter.ops


def profiled_kernels(fn: Callable[..., Any], *args: Any) -> int:
    """How many kernels torch.profiler sees ``fn(*args)`` run: the CUDA kernels on a GPU; on a CPU,
    the aten ops at the top of the stack (each an eager kernel) plus inductor's compiled-graph
    calls. PyTorch's own count, beside :func:`count_ops`."""
    from torch.profiler import ProfilerActivity, profile

    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn(*args)
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    if cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return sum(1 for e in top if e.name.startswith("aten::") or e.name.startswith("## Call CompiledFxGraph"))


@dataclass
class BlockExplained:
    """What ``torch._dynamo.explain`` says about a function: graphs, breaks and their reasons."""

    graphs: int
    breaks: int
    ops: int
    reasons: list[str]

    def __str__(self) -> str:
        why = "".join(f"\n  - {r}" for r in dict.fromkeys(self.reasons))
        return f"{self.graphs} graph(s), {self.breaks} graph break(s), {self.ops} ops in graphs{why}"


def explain_block(fn: Callable[..., Any], *args: Any) -> BlockExplained:
    """``torch._dynamo.explain(fn)(*args)``, reduced to its counts and the first line of each reason.

    Warning:
        A graph break **inside a loop** in the function being compiled makes TorchDynamo give up
        on the whole frame in recent torch releases: explain then reports 0 graphs and no reason.
        Put the loop's body in a function (as :func:`clipped_block` does) to see the break.
    """
    torch._dynamo.reset()
    ex = torch._dynamo.explain(fn)(*args)
    torch._dynamo.reset()
    reasons = [str(getattr(r, "reason", r)).strip().splitlines()[0] for r in ex.break_reasons]
    return BlockExplained(ex.graph_count, ex.graph_break_count, ex.op_count, reasons)


def compile_settings(threads: int | None = 1) -> None:
    """Inductor settings for a small shared machine: compile in this process (no pool of compile
    workers to start, so a sandbox's process limit is never hit), and generate C++ for ``threads``
    threads (None: as many as torch uses).

    Warning:
        On a shared 2-core machine under load (other programs on both cores), the compiled
        16 x 64 block with torch's default of two threads ran 4-5x *slower* than eager here, and
        4x faster with one thread, timed side by side. Large kernels split across threads wait for
        the busy core at every barrier (``#pragma omp parallel`` in the generated code); this one
        has no such pragma, and why it slowed down was not pinned down. Measure with one thread.
    """
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    inductor_config.cpp.threads = -1 if threads is None else threads


def generated_code(fn: Callable[..., Any], *args: Any) -> str:
    """The Python wrapper and kernels inductor writes for ``torch.compile(fn)(*args)`` (what
    ``TORCH_LOGS=output_code`` prints), as one string."""
    from torch._inductor.utils import run_and_get_code

    compile_settings()
    torch._dynamo.reset()
    _, codes = run_and_get_code(torch.compile(fn, dynamic=False), *args)
    torch._dynamo.reset()
    return "\n".join(codes)


def kernels_in(code: str) -> list[str]:
    """Names of the kernels a generated wrapper calls: inductor's fused C++ (``cpp_fused_*``) or
    Triton (``triton_*``) kernels, and the library calls it kept (``extern_kernels.*``)."""
    call = code[code.find("def call("):] if "def call(" in code else code
    names = re.findall(r"\b(cpp_fused_\w+|triton_\w+|extern_kernels\.\w+)(?:\.run)?\(", call)
    return names
