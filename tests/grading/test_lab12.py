"""gpulab.grading.lab12: the seeded cases of lab 12's hidden tests give gpulab's references full
agreement with the checks (the analytic FLOP count with FlopCounterMode, the classifier with
itself, the fused block with the naive one) and tell typical wrong answers from right ones (a
block that keeps its graph breaks: more graphs, and many more kernels once compiled)."""

from __future__ import annotations

import random

import torch

from gpulab.evidence.codec import encode
from gpulab.grading import lab12
from gpulab.launchbound.bound import BOUNDS, floors
from gpulab.launchbound.fusion import clipped_block
from gpulab.verdict.check import decode, verdict


def _verdict(kind: str, actual, expected, **tol) -> str | None:
    return verdict({"kind": kind, "what": "x", **tol}, decode(encode(actual)), decode(encode(expected)))


def test_the_reference_formula_matches_flop_counter_mode_on_drawn_shapes() -> None:
    for seed in range(3):
        cases = lab12.flops_cases(random.Random(seed))
        counted = lab12.counted_flops(cases)
        assert _verdict("close", lab12.analytic_flops(lab12.transformer_block_flops, cases), counted, rtol=0.02) is None
        assert lab12.analytic_flops(lab12.transformer_block_flops, cases) == {k: float(v) for k, v in counted.items()}


def test_a_formula_without_attention_or_with_heads_fails() -> None:
    cases = lab12.flops_cases(random.Random(0))
    counted = lab12.counted_flops(cases)

    def no_attention(b, t, d, h, f):
        return b * t * (8 * d * d + 4 * d * f)

    def per_head(b, t, d, h, f):
        return lab12.transformer_block_flops(b, t, d, h, f) * h

    def raises(*shape):
        raise ZeroDivisionError

    for wrong in (no_attention, per_head, raises):
        assert _verdict("close", lab12.analytic_flops(wrong, cases), counted, rtol=0.02) is not None, wrong.__name__


def test_step_cases_meet_every_bound_and_tie() -> None:
    cases = lab12.step_cases(random.Random(5), n=60)
    answers = lab12.classify_cases(lab12.classify_step, cases)
    assert set(answers.values()) == set(BOUNDS)
    for name, (step, m) in cases.items():
        f = floors(step, m)
        top = [b for b in BOUNDS if f[b] == max(f.values())]
        assert answers[name] == top[0]  # the earlier bound wins a tie
    assert any(
        len([v for v in floors(s, m).values() if v == max(floors(s, m).values())]) > 1
        for s, m in cases.values()
        if s.ops
    )  # exact ties are drawn
    assert lab12.step_cases(random.Random(5), n=60).keys() == cases.keys()  # the same seed, the same cases


def test_a_classifier_that_breaks_ties_the_other_way_or_ignores_memory_fails() -> None:
    cases = lab12.step_cases(random.Random(1))
    expected = lab12.classify_cases(lab12.classify_step, cases)

    def last_wins(step, m):
        f = floors(step, m)
        return max(reversed(BOUNDS), key=lambda b: f[b])

    def no_memory(step, m):
        return "compute" if step.flops / m.flops_per_s > step.ops * m.overhead_s else "overhead"

    for wrong in (last_wins, no_memory):
        assert _verdict("equal", lab12.classify_cases(wrong, cases), expected) is not None, wrong.__name__
    assert _verdict("equal", lab12.classify_cases(lab12.classify_step, cases), expected) is None


def test_block_outputs_agree_between_the_fused_and_naive_blocks_and_explain_tells_them_apart() -> None:
    fused, naive = lab12.block_outputs(lab12.clipped_block_fused, 7), lab12.block_outputs(clipped_block, 7)
    assert [t.shape for t in fused] == [torch.Size(lab12.SMALL), torch.Size((1, 33)), torch.Size((5, 300))]
    assert _verdict("close", fused, naive, rtol=1e-5, atol=1e-5) is None
    assert _verdict("close", lab12.block_outputs(torch.sin, 7), naive, rtol=1e-5, atol=1e-5) is not None
    graphs = lab12.block_graphs(lab12.clipped_block_fused, 7)
    assert graphs == {"16 x 64": [1, 0], "1 x 33": [1, 0], "5 x 300": [1, 0]}
    assert _verdict("equal", lab12.block_graphs(clipped_block, 7), graphs) is not None  # the .item() breaks each stage


def test_the_compiled_kernel_count_passes_the_fused_block_and_fails_the_broken_one() -> None:
    """The hidden test's bar: at most the reference's count + 1 (bounds.at_most_reference, slack=1)."""
    from gpulab.launchbound.fusion import compile_settings, profiled_kernels
    from gpulab.verdict import rules

    compile_settings(threads=1)
    x, counts = lab12.block_input(3), {}
    for name, fn in (("fused", lab12.clipped_block_fused), ("broken", clipped_block)):
        compiled = torch.compile(fn, dynamic=False)
        compiled(x)  # compiled outside the profiled call, as in the test cell
        counts[name] = profiled_kernels(compiled, x)
    ref = counts["fused"]
    assert rules.judge("bounds.at_most_reference", counts["fused"], ref, factor=1.0, slack=1) is None
    assert rules.judge("bounds.at_most_reference", counts["broken"], ref, factor=1.0, slack=1) is not None, counts
