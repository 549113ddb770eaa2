"""The course's labs in one table: the doctor, the README and the course tools read it here.

``devices`` is how many GPUs a lab needs to run on real hardware; with fewer, its multi-device
parts run on logical devices (see ``gpulab.devices.logical_devices``) and say so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Lab:
    """One lab: its folder under ``notebooks/source``, a title, and what it needs."""

    id: str
    title: str
    teaches: str
    devices: int
    fallback: str = ""  # how it runs with fewer GPUs; {physical} is "cpu" or "cuda:0"
    # its graded checks time parallel work against serial work on the whole machine, so `make grade`
    # grades its submissions one at a time, after the others, with nothing beside them
    timed_alone: bool = False


LABS: tuple[Lab, ...] = (
    Lab("00_setup", "setup", "the doctor report, devices, placement, choosing nccl or gloo", 0),
    Lab("01_bottleneck", "find the bottleneck", "utilisation monitor, loop profiler, data- vs compute- vs sync-bound", 1,
        "{physical} with a simulated accelerator clock"),
    Lab("02_pipeline", "the input pipeline", "num_workers, pin_memory, uint8 transfer, caching, batch echoing", 1,
        "{physical} with a simulated accelerator clock"),
    Lab("03_hdf5", "HDF5 chunked storage", "chunk layout, chunk cache, per-worker open, chunk-aware shuffling", 0),
    Lab("04_dataparallel", "DataParallel from scratch", "replicate/scatter/parallel_apply/gather, the output device's load", 4,
        "4 logical devices sharing {physical} (simulated)"),
    Lab("05_balanced", "the balanced criterion", "loss on every device, bigger batches in the same memory", 4,
        "4 logical devices sharing {physical} (simulated)"),
    Lab("06_ddp", "DistributedDataParallel", "launching ranks, DistributedSampler, all-reduce, torch DDP + AMP, torchrun", 2,
        "2 gloo processes on the CPU (gloo ranks keep CPU tensors, even beside a GPU)"),
    Lab("07_model_parallel", "model parallel and pipelining", "a split ResNet, micro-batches, the bubble", 2,
        "2 logical devices on the CPU, one thread each (simulated)"),
    Lab("08_oom", "out of memory", "leaks, no_grad, splitting a batch through OOM, AMP, checkpointing, shape summary", 1,
        "{physical}, memory metered by MemoryMeter under a budget"),
    Lab("09_sharding", "sharded data parallelism", "bytes per rank, ZeRO-1 and ZeRO-2 written from scratch, their traffic, no_sync accumulation, FSDP2", 2,
        "2 and 4 gloo processes on the CPU (gloo ranks keep CPU tensors, even beside a GPU)"),
    Lab("10_search", "hyperparameter search", "grid, random, TPE and ASHA on Ray Tune; packing trials with fractional resources", 1,
        "Ray trials on the cores of {physical}, packed per core instead of per GPU", timed_alone=True),
    Lab("11_tensor_parallel", "tensor parallelism", "f and g, column/row-parallel linears, a TP MLP and attention, DTensor beside", 2,
        "2 and 4 gloo processes on the CPU (gloo ranks keep CPU tensors, even beside a GPU)"),
    Lab("12_launch_bound", "the launch-bound step", "MFU, the fixed cost per op, overhead/memory/compute bounds, "
        "torch.compile and its graph breaks, CUDA graphs, the roofline", 1,
        "{physical}: the dispatcher's cost per op plays the launch cost; CUDA-graph timelines simulated"),
)
