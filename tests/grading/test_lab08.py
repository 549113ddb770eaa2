"""gpulab.grading.lab08: count_host_reads counts every read of a tensor's value into Python (the
syncs of lab 01), whichever way it is written, and nothing else (gpulab's reference loops read
twice per epoch, a loop with .item() per step twice per step); the seeded cases of the hidden tests
give gpulab's references the right answers and tell wrong submissions from right ones."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpulab.evidence.codec import encode
from gpulab.grading import lab08
from gpulab.grading.lab08 import count_host_reads
from gpulab.memory.fixes.loops import evaluate, train_epoch
from gpulab.memory.fixes.savings import bf16_step, checkpointed_forward, segment_sizes
from gpulab.models import SmallCNN
from gpulab.verdict.check import decode, verdict


def test_each_way_of_reading_a_value_counts_once() -> None:
    t = torch.tensor([1.5, 2.0])
    s = t.sum()
    for read in (
        lambda: s.item(),
        lambda: float(s),
        lambda: int(s),
        lambda: bool(s > 1),
        lambda: f"{s:.2f}",
        lambda: t.tolist(),
        lambda: s.numpy(),
        lambda: round(s.item()),
        lambda: str(s),
        lambda: repr(t),
        lambda: print(t, end=""),
    ):
        assert count_host_reads(read)[1] == 1
    assert count_host_reads(lambda: (t * 2 + 1).sum().detach())[1] == 0  # device work only
    assert count_host_reads(lambda x: x + 1, 41) == (42, 0)


def _epoch_reads(loop, num_steps: int) -> int:
    torch.manual_seed(0)
    model = SmallCNN(channels=(8, 16))
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(num_steps)
    ]
    if loop is evaluate:
        return count_host_reads(evaluate, model, nn.CrossEntropyLoss(), batches)[1]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # SGD reads nothing; Adam on a CPU reads its step
    return count_host_reads(loop, model, opt, nn.CrossEntropyLoss(), batches)[1]


def _item_per_step(model, optimizer, loss_fn, batches):
    total = 0.0
    for x, y in batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()  # a sync every step
    return total


def test_reference_loops_read_once_per_epoch_and_item_per_step_reads_every_step() -> None:
    for loop in (train_epoch, evaluate):
        assert _epoch_reads(loop, 3) == _epoch_reads(loop, 9) == 2, loop.__name__
    assert (_epoch_reads(_item_per_step, 3), _epoch_reads(_item_per_step, 9)) == (3, 9)


# ---- the seeded cases of the hidden tests ------------------------------------------------------


def _verdict(kind: str, actual, expected, **tol) -> str | None:
    return verdict({"kind": kind, "what": "x", **tol}, decode(encode(actual)), decode(encode(expected)))


def test_epoch_case_tells_the_reference_from_a_loop_that_reads_every_step_or_skips_zero_grad() -> None:
    numbers, facts = lab08.epoch_case(train_epoch, 3, 4)
    assert facts == {"types": ["tuple", ["float", "float"]], "loss calls": [(True, True)] * 4}
    same, _ = lab08.epoch_case(train_epoch, 3, 4)
    assert _verdict("close", same, numbers, rtol=1e-4, atol=1e-6) is None

    def item_per_step(model, optimizer, loss_fn, batches):  # right values, a sync per step (another test counts those)
        total = correct = count = 0
        for x, y in batches:
            optimizer.zero_grad()
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            count += len(y)
        return total / count, correct / count

    assert _verdict("close", lab08.epoch_case(item_per_step, 3, 4)[0], numbers, rtol=1e-4, atol=1e-6) is None
    assert lab08.counted_epoch(item_per_step, 3, 4)[1] == 8 and lab08.counted_epoch(train_epoch, 3, 4)[1] == 2

    def no_zero_grad(model, optimizer, loss_fn, batches):
        for x, y in batches:
            loss_fn(model(x), y).backward()
            optimizer.step()
        return item_per_step(model, torch.optim.SGD(model.parameters(), lr=0.0), loss_fn, batches[:1])

    assert _verdict("close", lab08.epoch_case(no_zero_grad, 3, 4)[0], numbers, rtol=1e-4, atol=1e-6) is not None


def test_eval_case_records_no_grad_eval_mode_and_the_restored_flag() -> None:
    numbers, facts = lab08.eval_case(evaluate, 4, 3)
    assert facts == {
        "types": ["tuple", ["float", "float"]],
        "training after evaluate (was training)": True,
        "training after evaluate (was in eval mode)": False,
        "loss calls": [(False, False)] * 4,
    }

    def train_mode_eval(model, loss_fn, batches):  # forgets model.eval(): BatchNorm uses the batch's statistics
        with torch.no_grad():
            total = sum(loss_fn(model(x), y) * len(y) for x, y in batches)
            correct = sum((model(x).argmax(1) == y).sum() for x, y in batches)
        count = sum(len(y) for _, y in batches)
        return total.item() / count, correct.item() / count

    bad_numbers, bad_facts = lab08.eval_case(train_mode_eval, 4, 3)
    assert bad_facts["loss calls"][0] == (False, True)
    assert _verdict("close", bad_numbers, numbers, rtol=1e-5, atol=1e-6) is not None


def _split(
    scale_by_k: bool = False,
    step_each: bool = False,
    grow=lambda k: k + 1,
    keep_loss: bool = False,
    keep_error: list | None = None,
):
    """A student's step_or_split, right by default; each flag puts in one mistake."""

    def gradients(model, loss_fn, x, y, k):
        total = 0.0
        for xs, ys in zip(torch.tensor_split(x, k), torch.tensor_split(y, k)):
            loss = loss_fn(model(xs), ys) * (1 / k if scale_by_k else xs.shape[0] / x.shape[0])
            loss.backward()
            total += loss.item()
        return total

    def step_or_split(model, optimizer, loss_fn, x, y):
        k = 1
        while True:
            optimizer.zero_grad(set_to_none=True)
            try:
                if keep_loss:  # the attempt in this frame: its last loss, with its graph, outlives the error
                    total = 0.0
                    for xs, ys in zip(torch.tensor_split(x, k), torch.tensor_split(y, k)):
                        loss = loss_fn(model(xs), ys) * (xs.shape[0] / x.shape[0])
                        loss.backward()
                        total += loss.item()
                    loss = total
                else:
                    loss = gradients(model, loss_fn, x, y, k)
                break
            except torch.OutOfMemoryError as err:
                if k >= x.shape[0]:
                    raise
                if keep_error is not None:
                    keep_error[:] = [err]  # the last failure: its traceback holds every frame of that attempt
            k = grow(k)
        if step_each:
            for _ in range(k):
                optimizer.step()
        else:
            optimizer.step()
        return loss, k

    return step_or_split


def test_split_budgets_force_the_split_and_the_reference_takes_the_unsplit_step() -> None:
    for seed, batch, fit in ((1, 45, 4), (2, 40, 1)):
        budget = lab08.split_budget(seed, batch, fit)
        numbers, facts, live = lab08.reference_split(seed, batch, budget)
        assert facts == {
            "types": ["tuple", ["float", "int"]],
            "micro-batches": fit,
            "optimizer steps": 1,
            "the last split covers the batch": True,
        }
        unsplit, unsplit_facts, unsplit_live = lab08.reference_split(seed, batch, None)
        assert unsplit_facts["micro-batches"] == 1 and live == unsplit_live  # weights, gradients, momentum
        assert _verdict("close", numbers, unsplit, rtol=1e-12, atol=1e-14) is None  # float64: to rounding
        if fit > 1:  # the budget is far from both edges: a student's few extra tensors do not move the split
            for margin in (0.9, 1.1):
                assert (
                    lab08.split_case(lab08.step_or_split, seed, batch, int(budget * margin))[1]["micro-batches"] == fit
                )


def test_split_case_tells_a_right_step_from_each_mistake() -> None:
    seed, batch, fit = 5, 46, 3  # 16, 15, 15: an uneven split
    budget = lab08.split_budget(seed, batch, fit)
    unsplit = lab08.reference_split(seed, batch, None)[0]
    _, want, ref_live = lab08.reference_split(seed, batch, budget)

    def judged(step):
        numbers, facts, live = lab08.split_case(step, seed, batch, budget)
        return (
            _verdict("close", numbers, unsplit, rtol=1e-5, atol=1e-6),
            _verdict("equal", facts, want),
            _verdict("between", live, None, hi=1.5 * ref_live),
        )  # as the test cell bounds it

    assert judged(_split()) == (None, None, None)
    close, equal, _ = judged(_split(scale_by_k=True))  # 1/3 is the wrong weight for parts of 16 and 15
    assert close is not None and equal is None
    close, equal, _ = judged(_split(step_each=True))
    assert close is not None and "optimizer steps" in equal
    assert "micro-batches" in judged(_split(grow=lambda k: 2 * k))[1]  # a doubling split: 1, 2, then 4, not 3
    assert "micro-batches" in judged(_split(keep_loss=True))[1]  # the failed whole batch's graph is held: more splits
    kept: list = []
    assert judged(_split(keep_error=kept))[1:] != (None, None)  # the failed attempt, held: more splits, more live

    def never_fits(model, optimizer, loss_fn, x, y):  # splits on forever, past one sample a part
        for k in range(1, 10**6):
            loss_fn(model(x[: 0 if k > 3 else None]), y[: 0 if k > 3 else None])

    with pytest.raises(lab08.SplitPastOneSample, match="stop splitting at one sample"):
        lab08.split_case(never_fits, seed, batch, None)


def test_savings_step_bf16_keeps_the_direction_and_float32_gradients() -> None:
    from gpulab.memory.fixes.savings import bf16_step, fp32_step

    for name in ("small_cnn", "transformer"):
        bf16 = lab08.savings_step(bf16_step, name, 1)
        assert bf16["dtypes"] == {"logits": torch.bfloat16, "loss": torch.float32, "gradients": ["torch.float32"]}
        assert _verdict("close", bf16["direction"], lab08.fp32_direction(name, 1), rtol=0, atol=0.02) is None
        fp32 = lab08.savings_step(fp32_step, name, 1)
        assert fp32["dtypes"]["logits"] == torch.float32  # a plain float32 step is told apart by its dtypes
        assert lab08.step_peak(bf16_step, name) < 0.75 * lab08.step_peak(fp32_step, name)


def test_recomputed_blocks_say_the_split() -> None:
    for n in (4, 5, 9):
        got = lab08.recomputed(checkpointed_forward, n, 0)
        for k in range(1, n + 1):
            sizes = segment_sizes(n, k)
            assert got[f"{n} blocks, segments={k}"] == list(range(sum(sizes[:-1])))

    def last_run_checkpointed_too(blocks, x, segments):  # checkpoints every run, the last one included
        from torch.utils.checkpoint import checkpoint

        n = len(blocks)
        sizes = [n // segments + (i < n % segments) for i in range(segments)]
        start = 0
        for size in sizes:
            x = checkpoint(torch.nn.Sequential(*blocks[start : start + size]), x, use_reentrant=False)
            start += size
        return x

    assert lab08.recomputed(last_run_checkpointed_too, 5, 0) != lab08.recomputed(checkpointed_forward, 5, 0)
    assert (
        _verdict(
            "close",
            lab08.checkpoint_case(checkpointed_forward, "transformer", 2, 3),
            lab08.plain_case("transformer", 2),
            rtol=1e-5,
            atol=1e-6,
        )
        is None
    )


def test_flatten_features_is_small_convnets_flatten_width() -> None:
    assert [lab08.flatten_features(s) for s in (4, 7, 32, 64, 129)] == [32 * (s // 4) ** 2 for s in (4, 7, 32, 64, 129)]
    assert F.cross_entropy is lab08.Recorder(torch.nn.Linear(1, 1)).loss_fn


def test_the_bf16_bar_follows_the_reference_run_where_it_keeps_more() -> None:
    """lab08.peak_share: 0.75 of float32 (calibrated on a CPU), or 1.15x the reference run's share on
    a device where autocast's bf16 weight copies keep more, never above 0.95; the grader divides."""
    from gpulab.verdict import rules

    cpu = [lab08.step_peak(bf16_step, n) for n in ("small_cnn", "transformer")]
    fp32 = [lab08.step_peak(lab08.fp32_step, n) for n in ("small_cnn", "transformer")]
    for mine, base in zip(cpu, fp32):  # here: 0.60 and 0.63
        assert rules.judge("lab08.peak_share", [mine, base], None, at_most=0.75) is None
        assert rules.judge("lab08.peak_share", [mine, base], [mine, base], at_most=0.75) is None
    assert "more than the 0.750 allowed" in rules.judge("lab08.peak_share", [80, 100], None, at_most=0.75)
    assert rules.judge("lab08.peak_share", [91, 100], [80, 100], at_most=0.75) is None  # 1.15 x 0.80 = 0.92
    assert "0.920 allowed" in rules.judge("lab08.peak_share", [93, 100], [80, 100], at_most=0.75)
    assert "0.950 allowed" in rules.judge("lab08.peak_share", [99, 100], [99, 100], at_most=0.75)  # no saving at all
    assert "could not be judged" in rules.judge("lab08.peak_share", [1, 0], None, at_most=0.75)


def test_converted_checks_fail_the_classic_mistakes() -> None:
    """tests/cellgrade.py, as make grade judges: a loop that reads every step fails the read count, and an
    evaluate without torch.no_grad fails the peak ratio the grader divides."""
    from cellgrade import grade_cells

    no_grad_missing = """def evaluate(model, loss_fn, batches):
    was_training = model.training
    model.eval()
    total, correct, count = 0, 0, 0
    for inputs, targets in batches:
        outputs = model(inputs)
        total = total + loss_fn(outputs, targets).detach() * targets.shape[0]
        correct = correct + (outputs.argmax(dim=1) == targets).sum()
        count += targets.shape[0]
    model.train(was_training)
    return total.item() / count, correct.item() / count
"""
    reads_each_step = """def train_epoch(model, optimizer, loss_fn, batches):
    model.train()
    total, correct, count = 0.0, 0, 0
    for inputs, targets in batches:
        optimizer.zero_grad(set_to_none=True)
        outputs = model(inputs)
        loss = loss_fn(outputs, targets)
        loss.backward()
        optimizer.step()
        total += loss.item() * targets.shape[0]
        correct += (outputs.argmax(dim=1) == targets).sum().item()
        count += targets.shape[0]
    return total / count, correct / count
"""
    tests = ["train_epoch_reads_once", "evaluate_without_graph"]
    got = grade_cells(
        "08_oom",
        {
            "source": {},
            "no_grad_missing": {"evaluate_impl": no_grad_missing},
            "reads_each_step": {"train_epoch_impl": reads_each_step},
        },
        tests,
        prelude=["c001"],
    )
    assert all(got["source"][t].passed for t in tests), got["source"]
    assert not got["no_grad_missing"]["evaluate_without_graph"].passed
    assert "above the 1.25 allowed" in got["no_grad_missing"]["evaluate_without_graph"].message
    assert got["no_grad_missing"]["train_epoch_reads_once"].passed
    assert not got["reads_each_step"]["train_epoch_reads_once"].passed
    assert "24 is above the maximum 2" in got["reads_each_step"]["train_epoch_reads_once"].message
