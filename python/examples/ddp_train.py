"""Train a small 3-D network with DistributedDataParallel on crops that zarrs_gpu reads straight
into each rank's GPU: every rank reads only the crops its DistributedSampler gives it, the next
batches read while it trains on this one.

    python python/examples/ddp_train.py                          # 2 ranks, small demo arrays
    python python/examples/ddp_train.py --array data.zarr/raw --label data.zarr/label \\
        --crop 32,64,64 --crops 512 --batch-size 4 --steps 100 --nprocs 4
    torchrun --nproc-per-node 8 python/examples/ddp_train.py --array ... --label ...   # or torchrun

Without ``--array`` it writes a demo pair first (an input volume, and as the label its 3x3x3 box
mean, which the network learns to compute). Arrays may have a channel axis before the cropped
ones. The backend is NCCL when there is a GPU per rank, else gloo with the ranks sharing GPUs
(``--backend`` chooses). ``--report DIR`` writes what each rank read and its final parameters'
digest to ``DIR/rank<N>.json`` (the project's test reads them).

Needs torch, zarrs_gpu and, for the demo arrays, zarr-python and numpy.
"""
import argparse
import hashlib
import json
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import zarrs_gpu.torch as zt


def write_demo(directory):
    """A float32 input (zstd, sharded, with a shard never written: read as the fill value) and a
    float16 label, its 3x3x3 box mean. Returns their paths."""
    import numpy as np
    import zarr

    rng = np.random.default_rng(0)
    shape = (48, 128, 128)
    x = rng.standard_normal(shape, dtype=np.float32)
    x[:16, :64, :64] = 0.0  # the shard left unwritten below (fill value 0)
    padded = np.pad(x, 1)
    mean = sum(padded[a:a + shape[0], b:b + shape[1], c:c + shape[2]]
               for a in range(3) for b in range(3) for c in range(3)) / 27
    image = zarr.create_array(store=os.path.join(directory, "image.zarr"), shape=shape, dtype="float32",
                              chunks=(8, 32, 32), shards=(16, 64, 64), compressors=zarr.codecs.ZstdCodec(level=3),
                              fill_value=0.0, overwrite=True)
    for z0 in range(0, shape[0], 16):
        for y0 in range(0, shape[1], 64):
            for x0 in range(0, shape[2], 64):
                if (z0, y0, x0) != (0, 0, 0):
                    box = (slice(z0, z0 + 16), slice(y0, y0 + 64), slice(x0, x0 + 64))
                    image[box] = x[box]
    label = zarr.create_array(store=os.path.join(directory, "label.zarr"), shape=shape, dtype="float16",
                              chunks=(16, 64, 64), compressors=zarr.codecs.ZstdCodec(level=3), overwrite=True)
    label[...] = mean.astype(np.float16)
    return os.path.join(directory, "image.zarr"), os.path.join(directory, "label.zarr")


class Net(nn.Module):
    """A few 3-D convolutions, channels in to channels out, the crop's shape kept."""

    def __init__(self, channels_in, channels_out, width=16):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv3d(channels_in, width, 3, padding=1), nn.ReLU(),
            nn.Conv3d(width, width, 3, padding=1), nn.ReLU(),
            nn.Conv3d(width, channels_out, 1))

    def forward(self, x):
        return self.layers(x)


def with_channels(t, crop_ndim):
    """A batch (batch, [channels,] *crop) as float32 (batch, channels, *crop)."""
    t = t.float()
    return t.unsqueeze(1) if t.dim() == crop_ndim + 1 else t


def train(rank, world_size, args):
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    gpus = torch.cuda.device_count()
    if gpus == 0:
        raise RuntimeError("this example trains on CUDA GPUs and torch sees none")
    # The ranks of this host (torchrun sets LOCAL_WORLD_SIZE; across hosts world_size is larger).
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = args.backend or ("nccl" if gpus >= local_ranks else "gloo")
    # One GPU per rank under NCCL (it refuses two ranks on one GPU); gloo may share them.
    device = local_rank % gpus
    torch.cuda.set_device(device)  # before the dataset's first read: it reads on the current GPU
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    if args.array is None:  # under torchrun without arrays: each host's first rank writes the demo pair
        directory = os.path.join(tempfile.gettempdir(), f"zarrs_gpu_ddp_demo_{os.getuid()}")
        if local_rank == 0:
            write_demo(directory)
        dist.barrier()
        args.array, args.label = os.path.join(directory, "image.zarr"), os.path.join(directory, "label.zarr")

    crop = tuple(int(c) for c in args.crop.split(","))
    # The same crops on every rank (a function of shapes, crop, count and seed): the sampler's
    # indices mean the same crop everywhere, and each rank reads only its own.
    dataset = zt.CropDataset([args.array, args.label], crop, crops=args.crops, seed=args.seed)
    # drop_last: every rank gets as many batches, so that no rank waits on DDP's all-reduce alone.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=True)
    loader = zt.CropLoader(dataset, args.batch_size, sampler=sampler, drop_last=True, prefetch=args.prefetch,
                           return_indices=True)
    if len(loader) == 0:
        raise ValueError(f"{len(dataset)} crops over {world_size} ranks do not make one batch of {args.batch_size}")
    shapes = dataset.shapes
    channels = [s[0] if len(s) == len(crop) + 1 else 1 for s in shapes]
    torch.manual_seed(args.seed)  # DDP broadcasts rank 0's initial parameters anyway
    model = DistributedDataParallel(Net(*channels).cuda(device), device_ids=[device])
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    losses, epochs, sums, step, epoch = [], [], [], 0, 0
    while step < args.steps:
        loader.set_epoch(epoch)  # a new order for this epoch (sampler.set_epoch)
        read = []
        for indices, (x, y) in loader:  # CUDA tensors on this rank's GPU
            x, y = with_channels(x, len(crop)), with_channels(y, len(crop))
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP averages the gradients over the ranks here
            optimizer.step()
            losses.append(loss.detach())
            read.extend(indices)
            if args.report:
                sums.append(x.double().flatten(1).sum(1))
            step += 1
            if rank == 0 and (step % args.log_every == 0 or step == args.steps):
                print(f"step {step:4d}  epoch {epoch}  loss {loss.item():.5f}", flush=True)
            if step == args.steps:
                break  # leaving the pass stops its reads
        epochs.append({"epoch": epoch, "sampler": list(sampler), "read": read})
        epoch += 1

    losses = torch.stack(losses).tolist()
    if args.report:
        parameters = [p.detach().cpu().numpy() for p in model.module.parameters()]
        digest = hashlib.sha256(b"".join(p.tobytes() for p in parameters)).hexdigest()
        read_all = [i for e in epochs for i in e["read"]]
        report = {"rank": rank, "world_size": world_size, "backend": backend, "device": device,
                  "tensor_device": x.device.index, "dataset_len": len(dataset), "epochs": epochs,
                  "crop_sums": [[i, s] for i, s in zip(read_all, torch.cat(sums).tolist())],
                  "losses": losses, "parameters_sha256": digest,
                  "parameters_sum": float(sum(p.astype("float64").sum() for p in parameters))}
        with open(os.path.join(args.report, f"rank{rank}.json"), "w") as f:
            json.dump(report, f)
    if rank == 0:
        print(f"{world_size} ranks ({backend}), {step} steps of {args.batch_size} crops {crop} each: "
              f"loss {losses[0]:.5f} -> {losses[-1]:.5f}")
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description="DDP training on crops read by zarrs_gpu (see the module's text)")
    ap.add_argument("--array", help="the input array's directory (default: write demo arrays)")
    ap.add_argument("--label", help="the label array's directory, the same grid as --array")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    ap.add_argument("--batch-size", type=int, default=2, help="crops per rank and step (default 2)")
    ap.add_argument("--crop", default="16,32,32", help="crop shape over the last axes (default 16,32,32)")
    ap.add_argument("--crops", type=int, default=64, help="random crops in the dataset (default 64)")
    ap.add_argument("--seed", type=int, default=0, help="crops, order and initial weights (default 0)")
    ap.add_argument("--prefetch", type=int, default=2, help="batches read ahead (default 2)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--nprocs", type=int, default=2, help="ranks to start here when not run by torchrun (default 2)")
    ap.add_argument("--backend", choices=("nccl", "gloo"), help="default: nccl with a GPU per rank, else gloo")
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--report", help="a directory for each rank's rank<N>.json")
    args = ap.parse_args()
    if (args.array is None) != (args.label is None):
        ap.error("give both --array and --label, or neither (demo arrays)")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun: this process is one rank
        train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return

    demo = None
    if args.array is None:
        demo = tempfile.TemporaryDirectory(prefix="zarrs_gpu_ddp_demo_")
        args.array, args.label = write_demo(demo.name)
        print(f"demo arrays: {args.array}, {args.label}")
    # One process per rank, meeting at a free port of this host.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    try:
        mp.spawn(train, args=(args.nprocs, args), nprocs=args.nprocs, join=True)
    finally:
        if demo is not None:
            demo.cleanup()


if __name__ == "__main__":
    main()
