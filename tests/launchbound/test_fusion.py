"""gpulab.launchbound.fusion: the fused block computes what the naive one does, with one graph instead of breaks,
and inductor's generated code is one kernel (compiling costs a few seconds)."""

from __future__ import annotations

import torch

from gpulab.launchbound.fusion import (
    clipped_block,
    clipped_block_fused,
    compile_settings,
    count_ops,
    explain_block,
    generated_code,
    kernels_in,
    profiled_kernels,
)


def test_fused_block_equals_the_naive_one() -> None:
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(clipped_block_fused(x), clipped_block(x), rtol=1e-5, atol=1e-6)
    ops = count_ops(clipped_block, x)
    assert ops["sin"] == 6 and ops["clamp"] == 6 and ops["_local_scalar_dense"] == 6  # .item() in every stage


def test_explain_sees_the_break_and_its_absence() -> None:
    x = torch.randn(8, 32)
    naive, fused = explain_block(clipped_block, x), explain_block(clipped_block_fused, x)
    assert naive.breaks >= 1 and any("item()" in r for r in naive.reasons)
    assert (fused.graphs, fused.breaks) == (1, 0)


def test_generated_code_is_one_fused_kernel() -> None:
    code = generated_code(clipped_block_fused, torch.randn(8, 32))
    assert kernels_in(code) == [k for k in kernels_in(code) if k.startswith("cpp_fused_")] and len(kernels_in(code)) == 1
    assert kernels_in("def call(args):\n    triton_poi_0.run(a)\n    extern_kernels.mm(a, b)\n") == \
        ["triton_poi_0", "extern_kernels.mm"]


def test_the_profiler_counts_what_the_dispatcher_counts_and_one_compiled_call() -> None:
    x = torch.randn(8, 32)
    assert profiled_kernels(clipped_block_fused, x) == sum(count_ops(clipped_block_fused, x).values())
    compile_settings()
    compiled = torch.compile(clipped_block_fused, dynamic=False)
    compiled(x)
    assert profiled_kernels(compiled, x) == 1
