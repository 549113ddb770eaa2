"""Lab 01's sync exercise, graded as ``make grade`` grades it (tests/cellgrade.py): the grader times
loop C with the student's step (modelled device time, which a busy CPU does not stretch), so the
solution passes and a step that still reads the loss back every step fails ``measure.wall``, with
the same running total."""

from __future__ import annotations

from cellgrade import grade_cells

LAB = "01_bottleneck"
STILL_SYNCS = """running_loss = 0.0


def step_no_sync(batch):
    global running_loss
    inputs, targets = batch
    loss = accel.compute(0.020, inputs)
    running_loss = running_loss + loss.item()  # reads the loss back: the host waits for the device
"""


def test_the_grader_times_loop_c_and_fails_a_step_that_still_syncs() -> None:
    got = grade_cells(
        LAB, {"source": {}, "still_syncs": {"step_no_sync_impl": STILL_SYNCS}}, tests=["sync_removed"], prelude=["c001"]
    )
    assert got["source"]["sync_removed"].passed, got["source"]["sync_removed"]
    syncs = got["still_syncs"]["sync_removed"]
    assert not syncs.passed and "more than the 360.0 ms allowed" in syncs.message, syncs
