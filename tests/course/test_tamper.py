"""The fingerprint probe in a real kernel: what it covers beyond gpulab.grading (issue 15, point 4)."""

from __future__ import annotations

import pytest
from jupyter_client.manager import start_new_kernel

from gpulab.course import tamper


def _run(kc, code: str) -> str:
    """Run ``code`` in the kernel; its stdout (an error fails the test with the kernel's message)."""
    out: list[str] = []
    reply = kc.execute_interactive(code, timeout=120, store_history=False,
                                   output_hook=lambda m: out.append(m["content"].get("text", ""))
                                   if m["msg_type"] == "stream" else None)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_grader_modules_of_a_lab_id() -> None:
    assert tamper.grader_modules("06_ddp") == ("gpulab.grading.lab06",)
    assert tamper.grader_modules("notes") == () and tamper.grader_modules(None) == ()


def test_the_labs_graders_and_their_instruments_are_fingerprinted(kernel) -> None:
    """Rebinding the lab's REFERENCES, or a function of an instrument the graders run, is named; an honest
    run changes nothing, and a gpulab module imported later (not in the snapshot) is no false alarm."""
    before = tamper.parse_fingerprint(_run(kernel, tamper.fingerprint_code(tamper.grader_modules("00_setup"))))
    assert before is not None and "gpulab.grading.lab00.REFERENCES" in before
    assert "gpulab.devices.doctor.diagnose" in before, "the instruments lab 00's graders import are covered"
    _run(kernel, "from gpulab.grading import lab00\nimport gpulab.devices.doctor\nimport gpulab.parallel.comm\n"
                 "lab00.diagnose(lab00.probe())")
    assert tamper.compare(before, tamper.parse_fingerprint(_run(kernel, tamper.fingerprint_code()))) == []
    _run(kernel, "lab00.REFERENCES = ()\ngpulab.devices.doctor.diagnose = lambda facts: []\n"
                 "gpulab.parallel.comm.scatter = None")
    changed = tamper.compare(before, tamper.parse_fingerprint(_run(kernel, tamper.fingerprint_code())))
    assert "gpulab.grading.lab00.REFERENCES" in changed, changed
    assert "gpulab.devices.doctor.diagnose (replaced or removed)" in changed, changed
