"""The doctor's report as text (``python -m gpulab doctor``): versions, devices, problems, notes, labs.

It reads the JSON-able dict that :func:`gpulab.devices.doctor.report` builds, so a report saved with
``--json`` on another machine prints the same way.
"""

from __future__ import annotations

from typing import Any

__all__ = ["format_report"]


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def format_report(rep: dict[str, Any]) -> str:
    """The human-readable report."""
    f = rep["facts"]
    lines = ["gpulab doctor", "=" * 13]
    lines.append(f"mode:        {rep['mode']}")
    lines.append(f"python:      {f['python']} on {f['platform']}")
    lines.append(f"torch:       {f['torch_version']} ({'CUDA ' + f['torch_cuda_build'] + ' build' if f['torch_cuda_build'] else 'CPU build'})")
    lines.append(f"CUDA:        {'available' if f['cuda_available'] else 'not available'}; driver {f['driver_version'] or '-'}"
                 f" (supports CUDA {f['driver_cuda_version'] or '-'}); NVML {f['nvml']}")
    lines.append(f"cuDNN:       {f['cudnn_version'] or '-'}" + (f" (check: {f['cudnn_check']})" if f["cudnn_check"] else ""))
    lines.append(f"backends:    nccl {'yes' if f['nccl_available'] else 'no'}, gloo {'yes' if f['gloo_available'] else 'no'}")
    lines.append(f"CPU:         {f['cpu_count']} logical cores ({f['cpu_count_physical']} physical), RAM {_gib(f['ram_bytes'])}")
    if f.get("cxx_compiler"):
        lines.append(f"C++:         {f['cxx_compiler']} (torch.compile builds its CPU kernels with it)")
    if f["cuda_visible_devices"] is not None:
        lines.append(f"CUDA_VISIBLE_DEVICES={f['cuda_visible_devices']!r}")
    if f["gpus"]:
        for g in f["gpus"]:
            lines.append(f"GPU {g['index']}:       {g['name']}, {_gib(g['memory_total_bytes'])}, compute capability {g['compute_capability']}")
    else:
        lines.append("GPUs:        none. This is a CPU-only machine: every lab runs here, multi-device parts on logical devices.")
    if rep.get("share"):
        from gpulab.devices.share import describe

        lines.extend(describe(rep["share"]))
    lines.append("")
    if rep.get("masked"):
        lines.append(f"Diagnosis:   {rep['masked']}")
    if rep["problems"]:
        lines.append("Problems found:")
        for p in rep["problems"]:
            lines.append(f"  [{p['code']}] {p['message']}")
            lines.append(f"      fix: {p['fix']}")
    else:
        lines.append("No problems found.")
    for n in rep.get("notes", []):
        lines.append(f"  note [{n['code']}] {n['message']}")
        lines.append(f"      {n['fix']}")
    if f["errors"]:
        lines.append("Probes that failed (reported, not fatal): " + "; ".join(f["errors"]))
    lines.append("")
    lines.append("Labs on this machine:")
    for row in rep["labs"]:
        lines.append(f"  {row['lab']:<18} {row['mode']:<8} {row['where']}")
    return "\n".join(lines)
