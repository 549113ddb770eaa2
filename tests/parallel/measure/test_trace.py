"""gpulab.parallel.measure.trace: the order of gradients and all-reduce launches in one step, seen from outside."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from gpulab.parallel import BucketedDDP, NaiveDDP, OverlappedDDP, StepTimingConfig, bucket_assignment, launch
from gpulab.parallel.measure.timing import deep_mlp
from gpulab.parallel.measure.trace import SyncEvent, launched_before_last_gradient, plot_sync_timeline, trace_sync

CFG = StepTimingConfig(width=32, depth=4, batch_size=8)  # 5 Linear layers: 10 gradient tensors of up to 4 KiB


def test_naive_starts_nothing_before_backward_ends_and_the_hooks_do():
    wrappers = [("naive", NaiveDDP), ("overlapped", OverlappedDDP), ("bucketed", lambda m: BucketedDDP(m, bucket_size_mb=0.005))]
    traces = launch(trace_sync, 2, args=(wrappers, CFG), echo=False)
    for per_rank in traces:
        naive, overlapped, bucketed = (per_rank[name] for name, _ in wrappers)
        assert [e.kind for e in naive].count("ready") == 10
        assert launched_before_last_gradient(naive) == (0, 0)
        assert sum(e.kind == "all_reduce" for e in naive) == 10, "one call per tensor, after backward"
        calls, elements = launched_before_last_gradient(overlapped)
        assert calls == 9 and elements > 0, "every gradient but the last starts before the last is ready"
        plan = bucket_assignment(list(deep_mlp(CFG.width, CFG.depth).parameters()), 0.005)
        assert sum(e.kind == "all_reduce" for e in bucketed) == len(plan) == 5, "one call per 5 KiB bucket"
        assert launched_before_last_gradient(bucketed)[0] >= 1
        ends = [e.kind for e in bucketed if e.kind.endswith("_end")]
        assert ends == ["backward_end", "finish_end"] and bucketed[-1].kind == "finish_end"
        assert all(a.t <= b.t for a, b in zip(bucketed, bucketed[1:])), "events in the order they happened"
    ax = plot_sync_timeline(traces[0])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["bucketed", "overlapped", "naive"]


def test_launched_before_last_gradient_counts_only_what_precedes_it():
    events = [SyncEvent("ready", 0.0, "a"), SyncEvent("all_reduce", 0.1, numel=5), SyncEvent("ready", 0.2, "b"),
              SyncEvent("all_reduce", 0.3, numel=7), SyncEvent("backward_end", 0.4)]
    assert launched_before_last_gradient(events) == (1, 5)
    assert launched_before_last_gradient([]) == (0, 0)
