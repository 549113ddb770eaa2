"""gpulab.labs: the course's table of labs agrees with the lab folders, and every lab that needs GPUs
says how it runs without them (with a {physical} placeholder the doctor fills in)."""

from __future__ import annotations

from conftest import COURSE

from gpulab.labs import LABS


def test_the_labs_are_the_source_folders_in_course_order() -> None:
    folders = sorted(p.name for p in (COURSE / "source").iterdir() if p.is_dir() and not p.name.startswith("."))
    ids = [lab.id for lab in LABS]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert set(ids) == set(folders)


def test_every_lab_that_needs_gpus_has_a_fallback() -> None:
    for lab in LABS:
        assert isinstance(lab.devices, int) and lab.devices >= 0, lab
        if lab.devices:
            # where it runs instead: the machine's first device, or the CPU whatever the machine has
            assert "{physical}" in lab.fallback or "on the CPU" in lab.fallback, \
                f"{lab.id} needs {lab.devices} GPU(s) but says nothing about running without"
            assert lab.fallback.format(physical="cpu")
