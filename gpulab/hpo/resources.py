"""What each search of lab 10 asks Ray for, and which GPUs a trial really sees.

Ray starts a trial where its *resource request* fits, and then hides from it the GPUs it was not
given by setting ``CUDA_VISIBLE_DEVICES`` in the trial's process. Two things go wrong on a GPU
machine when a search keeps Tune's default request (one CPU, no GPU):

- **Recent Ray (2.60 here) leaves a zero-GPU trial's GPUs visible.** It only writes
  ``CUDA_VISIBLE_DEVICES`` for a trial that was given GPUs, unless
  ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` is set (``ray/_private/utils.py``,
  ``set_visible_accelerator_ids``; Ray issue 54868). So every such
  trial finds ``cuda:0`` and trains there: a 16-core machine runs 16 trials on one GPU at once,
  while the packed search (``{"gpu": 0.25}``) runs 4, and packing seems to *lower* concurrency.
- **Older Ray hid every GPU from it** (``CUDA_VISIBLE_DEVICES=""``): the trial trained on the CPU,
  while the packed search used the GPU, and the two searches compared different machines.

So the baseline searches ask for **one whole GPU per trial** on a GPU machine
(:func:`one_per_device`), the packed search asks for a share (:func:`~gpulab.hpo.packed_resources`),
and :func:`search_resources` gives every search of the lab its request::

    from ray import tune
    trainable = tune.with_resources(train_classifier, search_resources("random", num_cpus=16, num_gpus=1))
    # {"gpu": 1.0, "cpu": 1.0}: one trial per GPU; search_resources("packed", 16, 1): {"gpu": 0.25, "cpu": 1.0}

:class:`~gpulab.hpo.RaySession` sets the override, so a trial that asks for no GPU sees none
whatever Ray's version, and :func:`train_classifier` reports what its trial could see
(:func:`visible_devices`), which :func:`check_trial_devices` compares with the request after a
search. On a CPU-only machine every request is CPU cores, and nothing here changes a search.

Source: Ray's "Accelerator support" guide (``CUDA_VISIBLE_DEVICES`` per task and actor) and Ray
Tune's "A Guide To Parallelism and Resources" (``tune.with_resources``).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Iterable

from gpulab.devices import cuda_device_count
from gpulab.hpo.packing import packed_resources

__all__ = ["SEARCHES", "OVERRIDE_ON_ZERO", "packing_factor", "one_per_device", "search_resources",
           "visible_devices", "check_trial_devices", "UNSET"]

# the searches of lab 10, in the order the lab runs them
SEARCHES = ("grid", "random", "asha", "tpe", "packed")
# Ray's switch that makes a trial given no GPU see none (CUDA_VISIBLE_DEVICES=""), read by every
# Ray worker when it starts a task or actor (ray._private.accelerators)
OVERRIDE_ON_ZERO = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"
# what visible_devices() reports when CUDA_VISIBLE_DEVICES is not set: every GPU is visible
UNSET = "(unset)"


def _check_machine(num_cpus: int, num_gpus: int) -> None:
    for name, value, least in (("num_cpus", num_cpus, 1), ("num_gpus", num_gpus, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}: pass the machine's counts, e.g. "
                             "os.cpu_count() and gpulab.devices.cuda_device_count()")


def packing_factor(num_gpus: int) -> int:
    """Trials the packed search puts on one device: 4 per GPU, or 2 per CPU core without GPUs."""
    return 4 if num_gpus else 2


def one_per_device(num_cpus: int, num_gpus: int = 0) -> dict[str, float]:
    """The unpacked request: one CPU core per trial, or on a GPU machine one whole GPU per trial
    (and one CPU, or the machine's CPUs shared out when there are fewer CPUs than GPUs).

    Raises:
        ValueError: for ``num_cpus`` < 1 or ``num_gpus`` < 0 (or non-integers).
    """
    _check_machine(num_cpus, num_gpus)
    if not num_gpus:
        return {"cpu": 1.0}
    return {"gpu": 1.0, "cpu": min(1.0, num_cpus / num_gpus)}


def search_resources(search: str, num_cpus: int, num_gpus: int = 0, *,
                     pack: Callable[[int, int, int], dict[str, float]] = packed_resources,
                     trials_per_device: int | None = None) -> dict[str, float]:
    """The resource request of one of lab 10's searches, for ``tune.with_resources``.

    Args:
        search: one of :data:`SEARCHES`. ``"grid"``, ``"random"``, ``"asha"`` and ``"tpe"`` run one
            trial per device (:func:`one_per_device`); ``"packed"`` shares each device out.
        num_cpus: CPUs Ray may use.
        num_gpus: GPUs Ray may use (0 on a CPU-only machine).
        pack: the function that computes the packed request, called as
            ``pack(trials_per_device, num_cpus, num_gpus)``: gpulab's reference by default, the
            student's ``packed_resources`` in the lab.
        trials_per_device: for ``"packed"``, trials per device (default :func:`packing_factor`).

    Returns:
        ``{"cpu": ..., "gpu": ...}`` (``"gpu"`` only on a GPU machine), as ``pack`` returns it for
        the packed search.

    Raises:
        ValueError: for an unknown search or impossible machine counts.
    """
    if search not in SEARCHES:
        raise ValueError(f"unknown search {search!r}: lab 10's searches are {', '.join(SEARCHES)}")
    _check_machine(num_cpus, num_gpus)
    if search == "packed":
        return pack(trials_per_device or packing_factor(num_gpus), num_cpus, num_gpus)
    return one_per_device(num_cpus, num_gpus)


def visible_devices() -> dict[str, Any]:
    """What the calling process can see of the GPUs, as a trial reports it with its metrics.

    Returns:
        ``{"cuda_visible_devices": the variable's value, or UNSET, "cuda_devices": GPUs torch can use}``.
    """
    return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", UNSET),
            "cuda_devices": cuda_device_count()}


def _visible_count(value: str, num_gpus: int) -> int:
    """GPUs a CUDA_VISIBLE_DEVICES value leaves visible on a machine of ``num_gpus``."""
    if value == UNSET:
        return num_gpus
    return len([i for i in str(value).split(",") if i.strip()])


def check_trial_devices(results: Iterable[Any], resources: dict[str, float], num_gpus: int) -> dict[str, str]:
    """Check that every trial of a search saw the GPUs its request gave it, and no other.

    A trial given a share of a GPU (``{"gpu": 0.25}``) or a whole one must see exactly one; a
    trial given none must see none. Each trial's last result must carry what
    :func:`visible_devices` reports (:func:`~gpulab.hpo.train_classifier` adds it).

    Args:
        results: a ``ResultGrid`` (or ``Result`` objects with ``metrics``).
        resources: the request the search gave ``tune.with_resources``.
        num_gpus: GPUs of the machine (or of Ray, ``ray.cluster_resources()["GPU"]``): what an
            unset ``CUDA_VISIBLE_DEVICES`` leaves visible.

    Returns:
        Trial id -> ``"cuda:0, sees 1 GPU(s)"``: where it trained and how many GPUs it saw.

    Raises:
        KeyError: if a trial did not report its devices.
        RuntimeError: naming the first trial that saw more or fewer GPUs than it was given.
    """
    given = math.ceil(float(resources.get("gpu", 0)))
    seen = {}
    for i, result in enumerate(results):
        metrics = getattr(result, "metrics", None) or {}
        tid = str(metrics.get("trial_id", f"trial_{i:05d}"))
        if "cuda_visible_devices" not in metrics:
            raise KeyError(f"trial {tid} did not report the devices it saw (its metrics: {sorted(metrics)[:10]}); "
                           "run gpulab.hpo.train_classifier, or add gpulab.hpo.visible_devices() to what it reports")
        value, torch_count = metrics["cuda_visible_devices"], int(metrics.get("cuda_devices", 0))
        visible = _visible_count(value, num_gpus)
        if visible != given or torch_count > given:
            fix = (f"recent Ray leaves the GPUs of a trial that asks for none visible: start Ray with "
                   f"gpulab.hpo.ray_session, which sets {OVERRIDE_ON_ZERO}=1, and give the search its request "
                   f"with tune.with_resources(train_classifier, search_resources(...))" if visible > given
                   else "Ray gave it fewer GPUs than it asked for: check ray.cluster_resources() and "
                        "CUDA_VISIBLE_DEVICES in the shell that started Ray")
            raise RuntimeError(f"trial {tid} asked Ray for {resources} and so for {given} GPU(s), but it saw "
                               f"{max(visible, torch_count)} (CUDA_VISIBLE_DEVICES={value!r}, torch saw "
                               f"{torch_count}): {fix}")
        seen[tid] = f"{metrics.get('device', '?')}, sees {visible} GPU(s)"
    return seen
