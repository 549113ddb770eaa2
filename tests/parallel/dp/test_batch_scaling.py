"""gpulab.parallel.dp.batch_scaling: the linear scaling rule with warmup (Goyal et al. 2017), and
time to a target loss, reproducible in steps and samples, one thread, bad input refused."""

from __future__ import annotations

import pytest
import torch

from gpulab.parallel.dp.batch_scaling import ScalingTask, scaled_lr, time_to_target

TASK = ScalingTask(train_size=131_072)


@pytest.mark.parametrize(("args", "want"), [
    ((0, 0.1, 64, 256), 0.4),          # 4x the batch: 4x the rate
    ((0, 0.1, 64, 256, 10), 0.1),      # warmup starts at the base rate
    ((5, 0.1, 64, 256, 10), 0.25),     # half-way up the ramp
    ((10, 0.1, 64, 256, 10), 0.4),     # the ramp ends at the target
    ((99, 0.1, 64, 256, 10), 0.4),
    ((3, 0.1, 256, 64, 10), 0.025),    # a smaller batch: the smaller rate at once, no ramp down
    ((3, 0.1, 64, 64, 10), 0.1),
])
def test_scaled_lr_is_the_linear_rule_with_a_linear_warmup(args, want) -> None:
    assert scaled_lr(*args) == pytest.approx(want)


@pytest.mark.parametrize("bad", [(-1, 0.1, 64, 256), (0, 0.1, 64, 256, -1), (0, 0.0, 64, 256),
                                 (0, 0.1, 0, 256), (0, 0.1, 64, -4)])
def test_scaled_lr_refuses_impossible_settings(bad) -> None:
    with pytest.raises(ValueError, match="count from 0|must be positive"):
        scaled_lr(*bad)


def test_the_task_is_fixed_by_its_seed() -> None:
    x, y, xe, ye = TASK.data()
    assert x.shape == (TASK.train_size, TASK.dim) and xe.shape == (TASK.eval_size, TASK.dim)
    assert y.dtype == torch.int64 and int(y.max()) < TASK.classes
    assert len(y.unique()) >= 5  # a real classification task, not one class
    other = ScalingTask(train_size=TASK.train_size, seed=1)
    assert not torch.equal(other.data()[0], x)
    for p, q in zip(TASK.model().parameters(), TASK.model().parameters()):
        assert torch.equal(p, q)  # every run starts from the same weights


def test_a_scaled_batch_reaches_the_target_and_the_trace_is_reproducible() -> None:
    threads = torch.get_num_threads()
    run = time_to_target(TASK, 256, lambda s: scaled_lr(s, 0.04, 64, 256, 10), 0.6)
    assert torch.get_num_threads() == threads  # one thread while training, restored after
    assert run.reached and run.trace[-1][3] <= 0.6 and all(loss > 0.6 for *_, loss in run.trace[:-1])
    assert run.trace[0][:3] == (0, 0, 0.0) and run.samples == 256 * run.steps
    assert [t[1] for t in run.trace] == sorted(t[1] for t in run.trace)
    assert run.seconds > 0
    again = time_to_target(TASK, 256, lambda s: scaled_lr(s, 0.04, 64, 256, 10), 0.6)
    assert [(s, n, loss) for s, n, _, loss in again.trace] == [(s, n, loss) for s, n, _, loss in run.trace]


def test_the_learning_rate_must_grow_with_the_batch() -> None:
    """Batch 1024 at the small batch's rate is much slower per sample than with the rate scaled."""
    scaled = time_to_target(TASK, 1024, lambda s: scaled_lr(s, 0.04, 64, 1024, 10), 0.6, max_samples=131_072)
    unscaled = time_to_target(TASK, 1024, lambda s: 0.04, 0.6, max_samples=131_072)
    assert scaled.reached and not unscaled.reached
    assert unscaled.samples >= 131_072 - 1024 and unscaled.trace[-1][3] > 0.8


def test_the_lr_schedule_reaches_the_optimizer() -> None:
    seen = []
    time_to_target(TASK, 4096, lambda s: seen.append(s) or 0.01, 0.0, max_samples=4 * 4096)
    assert seen[0] == 0 and seen[1:] == list(range(len(seen) - 1))  # lr_at(0) for the constructor, then each step


def test_threads_are_restored_when_the_schedule_fails() -> None:
    threads = torch.get_num_threads()

    def bad(step):
        if step == 3:
            raise RuntimeError("schedule broke")
        return 0.01
    with pytest.raises(RuntimeError, match="schedule broke"):
        time_to_target(TASK, 64, bad, 0.1)
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize(("kwargs", "match"), [({"batch_size": 0}, "batch_size=0"),
                                               ({"batch_size": 10**6}, "batch_size=1000000"),
                                               ({"max_samples": 10**7}, "max_samples=10000000")])
def test_bad_sizes_are_refused_with_the_range(kwargs, match) -> None:
    args = {"batch_size": 64, **kwargs}
    with pytest.raises(ValueError, match=match):
        time_to_target(TASK, args.pop("batch_size"), lambda s: 0.01, 0.5, **args)
