"""The doctor's line about a course server's share (GPULAB_SHARE, set by make hub's spawner)."""

from __future__ import annotations

import json

from gpulab.devices import share
from gpulab.devices.doctor import report
from gpulab.devices.doctor_text import format_report


def test_no_share_off_a_hub(monkeypatch) -> None:
    monkeypatch.delenv("GPULAB_SHARE", raising=False)
    assert share.current() is None
    assert "share" not in report()


def test_the_doctor_reports_what_the_hub_gave(monkeypatch) -> None:
    given = {"user": "alice", "gpus": [1], "students_per_gpu": 2, "cpus": 1.5, "memory_mb": 4096}
    monkeypatch.setenv("GPULAB_SHARE", json.dumps(given))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setattr(share, "enforced", lambda: {"memory_bytes": 4096 * 2**20, "cpus": 1.5})
    text = format_report(report())
    assert "this course server gave alice: GPU 1 (CUDA_VISIBLE_DEVICES='1'; 2 student(s) on it), 1.5 core(s), 4096 MiB" in text
    assert "enforced by the OS: memory cap 4096 MiB, CPU quota 1.5 core(s)" in text


def test_a_broken_share_is_said_not_raised(monkeypatch) -> None:
    monkeypatch.setenv("GPULAB_SHARE", "{oops")
    assert "not JSON" in share.describe(share.current())[0]
