"""Train with DistributedDataParallel under torchrun: the script you take from lab 06 to a cluster.

One machine, 2 processes (CPU with gloo, or 2 GPUs with nccl)::

    torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 3

Several machines (run the same command on every node; node 0's address is the rendezvous)::

    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-id=job42 --rdzv-backend=c10d \\
             --rdzv-endpoint=node0.example.com:29400 train_ddp.py --epochs 90

torchrun starts ``nproc_per_node`` copies of this script and sets ``RANK`` (global),
``LOCAL_RANK`` (which GPU on this node), ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and
``OMP_NUM_THREADS=1`` (ranks share the cores); ``init_process_group`` reads them. No ``mp.spawn``,
no hand-picked free port, and a crashed rank stops the whole job.

What every DDP script needs, and where it is below:

1. one process per GPU, pinned to it (``torch.cuda.set_device(local_rank)``) *before* anything
   touches CUDA, so all ranks do not pile their contexts onto GPU 0;
2. ``DistributedSampler`` (its own shuffling, so the DataLoader gets ``shuffle=False``) and
   ``sampler.set_epoch(epoch)`` at the start of every epoch;
3. the global batch size and the loader workers divided by the number of ranks;
4. ``DistributedDataParallel`` (``find_unused_parameters=True`` only if some parameters can go
   unused), and torch.amp for mixed precision (what Apex used to be for);
5. metrics summed over the ranks with ``all_reduce``, and printing/saving on rank 0 only.

Pure torch on purpose (no gpulab import): copy it and change the model and the data.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(num_samples: int, num_features: int = 32, num_classes: int = 10, seed: int = 0) -> TensorDataset:
    """Gaussian blobs, one per class: the same on every rank because the seed is the same."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, num_features, generator=g) * 0.4  # overlapping: not trivially separable
    targets = torch.randint(0, num_classes, (num_samples,), generator=g)
    inputs = centers[targets] + torch.randn(num_samples, num_features, generator=g)
    return TensorDataset(inputs, targets)


def choose_device(local_rank: int, local_world_size: int, gpus: int) -> tuple[str, torch.device]:
    """This rank's backend and device, by a rule every rank computes alike from what its node has.

    NCCL needs one GPU per process (it refuses two ranks on one GPU) and gloo runs anywhere, so NCCL
    with ``cuda:<local rank>`` only when this node has a GPU for each of its ranks; gloo on the CPU
    otherwise. Deciding per rank ("is there a GPU for *me*?") would give 2 ranks on 1 GPU one nccl
    rank and one gloo rank, and a job whose ranks disagree hangs at its first collective.
    """
    if gpus >= local_world_size:
        return "nccl", torch.device("cuda", local_rank)
    return "gloo", torch.device("cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch, split over the ranks")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers in total, split over the ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--out", default="", help="rank 0 writes a JSON summary here")
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend, device = choose_device(local_rank, int(os.environ["LOCAL_WORLD_SIZE"]), gpus)
    use_cuda = device.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(device)  # before init: NCCL binds this process to this GPU
    dist.init_process_group(backend, device_id=device if use_cuda else None)

    dataset = make_dataset(args.samples)
    train_set = torch.utils.data.Subset(dataset, range(args.samples * 7 // 8))
    val_set = torch.utils.data.Subset(dataset, range(args.samples * 7 // 8, args.samples))
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size // world_size, sampler=sampler,
                        num_workers=args.workers // world_size, pin_memory=use_cuda,
                        persistent_workers=args.workers // world_size > 0)
    # Evaluation: every sample exactly once (a padded DistributedSampler would count some twice).
    val_idx = list(range(rank, len(val_set), world_size))
    val_loader = DataLoader(torch.utils.data.Subset(val_set, val_idx), batch_size=256)

    torch.manual_seed(0)  # same initial weights everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # bf16 has float32's range: no loss scaling. GPUs before Ampere (compute capability < 8) have no
    # native bf16: float16 there, with a GradScaler so that small gradients do not flush to zero.
    fp16 = use_cuda and torch.cuda.get_device_properties(device).major < 8
    amp_dtype = torch.float16 if fp16 else torch.bfloat16
    scaler = torch.amp.GradScaler(device.type, enabled=fp16)
    loss_fn = nn.CrossEntropyLoss()

    history = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same one on every rank
        model.train()
        t0 = time.perf_counter()
        total_loss = torch.zeros(2, device=device)  # (sum of losses, batches)
        for inputs, targets in loader:
            inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=amp_dtype):
                loss = loss_fn(model(inputs), targets)
            scaler.scale(loss).backward()  # DDP all-reduces the gradients during this call
            scaler.step(optimizer)
            scaler.update()
            total_loss += torch.stack([loss.detach().float(), torch.ones((), device=device)])
        model.eval()
        counts = torch.zeros(2, device=device)  # (correct, seen)
        with torch.no_grad():
            for inputs, targets in val_loader:
                inputs, targets = inputs.to(device), targets.to(device)
                counts += torch.stack([(model(inputs).argmax(1) == targets).sum().float(),
                                       torch.tensor(float(len(targets)), device=device)])
        dist.all_reduce(total_loss)
        dist.all_reduce(counts)
        row = {"epoch": epoch, "loss": (total_loss[0] / total_loss[1]).item(),
               "val_accuracy": (counts[0] / counts[1]).item(), "val_samples": int(counts[1].item()),
               "seconds": round(time.perf_counter() - t0, 3)}
        history.append(row)
        if rank == 0:
            print(json.dumps(row), flush=True)

    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            json.dump({"world_size": world_size, "backend": dist.get_backend(), "history": history}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
