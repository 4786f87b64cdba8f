#!/usr/bin/env python3
"""Samples per second of PyTorch datasets of random crops (issue 19): zarrs_gpu.torch's dataset and
loader against a zarr-python dataset, the way people write one, on the same crops of one array.

Crops: --batches x --batch-size random crops of --crop (default 64 x 256 x 256, 16 MiB of
float32), `zarrs_gpu.torch.CropPlan(shape, crop, N, seed=17)`: the random tiles of
benches/tiles.py and `bench --tiles` (splitmix64 seed 17), read in that order by every peer.

Peers (--peers, all by default):
  zarrs-gpu-loader     zarrs_gpu.torch.CropLoader(CropDataset, batch_size, prefetch=--prefetch): the
                       next batches' reads in flight while the step runs
  zarrs-gpu-loader-p0  the same with prefetch=0: each batch read when asked for
  zarrs-gpu-dataloader torch.utils.data.DataLoader(CropDataset, num_workers=0) (a batch read as one
                       request through __getitems__, no read-ahead; torch's default collate copies it)
  zarrs-gpu-collate    the same with collate_fn=zarrs_gpu.torch.collate (the batch as read, no copy)
  zarr-w0              DataLoader(num_workers=0) over a dataset whose __getitem__ is
                       zarr.open_array (once) + a numpy crop + torch.from_numpy(...).cuda()
  zarr-workers         the same dataset returning host tensors, DataLoader(num_workers=--workers,
                       pin_memory=True), each batch then .cuda(non_blocking=True)

Each peer is timed with each --compute-ms value (default 0 and 40): a step on every batch of
about that many ms (in-place sin over the batch, calibrated), then torch.cuda.synchronize(), as
a training step ends with a sync (loss.item()). The first --warmup batches (default 2) of every
pass are not timed (worker start-up, first opens); samples/s = timed samples / time from the end
of the warm-up to the end of the last step. Every row's checksum (the float64 sum of all batches)
must agree: the same crops.

Usage:
  python3 benches/torch_dataset.py --array /tmp/zb/z2.zarr [--batches 32] [--batch-size 4]
      [--crop 64,256,256] [--compute-ms 0,40] [--prefetch 2] [--workers 8] [--repeat 1]
      [--peers zarrs-gpu-loader,...] [--json OUT.jsonl]
  python3 benches/torch_dataset.py --self-test      # host only: crops, loop, rows (numpy, zarr)

Output: one JSON object per row on stdout (and appended to --json), with the keys of
benches/peers.py and benches/tiles.py (peer, case, subset, bytes, seconds, gib_s, runs,
median_ms, p90_ms) and samples_per_s, batches, batch_size, prefetch, workers, compute_ms,
checksum; a failing peer prints {"peer": ..., "case": ..., "error": ...} and the rest go on. A
table closes the output.
"""
import argparse
import math
import os
import sys
import time

from common import emit, median_p90, parse_args

CROP = (64, 256, 256)
SEED = 17

PEERS = {
    "zarrs-gpu-loader": "zarrs_gpu CropLoader",
    "zarrs-gpu-loader-p0": "zarrs_gpu CropLoader prefetch=0",
    "zarrs-gpu-dataloader": "zarrs_gpu CropDataset + DataLoader(num_workers=0)",
    "zarrs-gpu-collate": "zarrs_gpu CropDataset + DataLoader(num_workers=0, collate_fn=zarrs_gpu.torch.collate)",
    "zarr-w0": "zarr-python dataset + DataLoader(num_workers=0)",
    "zarr-workers": "zarr-python dataset + DataLoader(workers, pin_memory)",
}


def crop_boxes(shape, crop, count, seed=SEED):
    """The boxes ((start, stop) per axis) of count random crops, as zarrs_gpu.torch plans them."""
    from zarrs_gpu.torch import CropPlan

    return list(CropPlan(shape, crop, count, seed=seed))


def dims(extent):
    return "x".join(map(str, extent))


class ZarrCrops:
    """The zarr-python dataset people write: the array opened once per process, each item a numpy
    crop made a tensor by `convert` (torch.from_numpy, then .cuda() when on_device)."""

    def __init__(self, path, boxes, on_device, convert=None):
        self.path, self.boxes, self.on_device, self.convert = path, boxes, on_device, convert
        self._z = None

    def __len__(self):
        return len(self.boxes)

    def __getitem__(self, i):
        if self._z is None:
            import zarr

            self._z = zarr.open_array(self.path, mode="r")
        crop = self._z[tuple(slice(a, b) for a, b in self.boxes[i])]
        if self.convert is not None:
            return self.convert(crop)
        import torch

        t = torch.from_numpy(crop)
        return t.cuda() if self.on_device else t

    def __getstate__(self):
        return {**self.__dict__, "_z": None}


def timed_pass(batches, step, sync, warmup):
    """Run step on each batch of an iterable, sync after each: (seconds from the end of the warm-up
    to the end, per-step seconds of the timed steps, timed batches, timed samples)."""
    steps, count, samples, start = [], 0, 0, None
    last = time.perf_counter()
    for batch in batches:
        step(batch)
        sync()
        now = time.perf_counter()
        count += 1
        if count == warmup:
            start = now
        elif count > warmup:
            steps.append(now - last)
            samples += len(batch)
        last = now
    if start is None or not steps:
        raise ValueError(f"{count} batches: none timed after {warmup} of warm-up")
    return last - start, steps, len(steps), samples


def calibrate(torch, target_ms, sample):
    """k such that k in-place sin passes over a batch like sample take about target_ms (0: none)."""
    if target_ms <= 0:
        return 0
    work = sample.float().clone()

    def timed(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            work.sin_()
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    target = target_ms / 1e3
    k, t = 4, timed(4)
    for _ in range(8):
        if abs(t - target) <= 0.05 * target:
            break
        k = max(1, round(k * target / max(t, 1e-7)))
        t = timed(k)
    return k


def make_step(torch, k):
    """The step on each batch: its float64 sum added to a running checksum, then k in-place sin
    passes over it (the compute). Returns (step, checksum())."""
    total = torch.zeros((), dtype=torch.float64, device="cuda")

    def step(batch):
        total.add_(batch.double().sum())
        work = batch.float()  # the batch itself when float32: each pass rewrites it
        for _ in range(k):
            work.sin_()
    return step, lambda: total.item()


def loaders(peer, args, boxes, torch):
    """(iterable of CUDA batches for one pass, prefetch, workers) of a peer."""
    indices = list(range(len(boxes)))
    if peer.startswith("zarrs-gpu"):
        import zarrs_gpu.torch as zt

        ds = zt.CropDataset(args.array, args.crop, crops=[tuple(a for a, _ in b) for b in boxes])
        if peer == "zarrs-gpu-loader":
            return zt.CropLoader(ds, args.batch_size, sampler=indices, prefetch=args.prefetch), args.prefetch, 0
        if peer == "zarrs-gpu-loader-p0":
            return zt.CropLoader(ds, args.batch_size, sampler=indices, prefetch=0), 0, 0
        collate = {"collate_fn": zt.collate} if peer == "zarrs-gpu-collate" else {}
        return torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=indices, num_workers=0,
                                           **collate), 0, 0
    if peer == "zarr-w0":
        ds = ZarrCrops(args.array, boxes, on_device=True)
        return torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=indices, num_workers=0), 0, 0
    if peer == "zarr-workers":
        ds = ZarrCrops(args.array, boxes, on_device=False)
        loader = torch.utils.data.DataLoader(ds, batch_size=args.batch_size, sampler=indices,
                                             num_workers=args.workers, pin_memory=True)

        class ToDevice:
            def __iter__(self):
                return (b.cuda(non_blocking=True) for b in loader)
        return ToDevice(), 2 * args.workers, args.workers  # DataLoader's prefetch_factor 2 per worker
    raise ValueError(f"unknown peer {peer!r} (one of {', '.join(PEERS)})")


def error_row(peer, case, err):
    text = f"{type(err).__name__}: {err}"
    return {"peer": peer, "case": case, "error": text if len(text) <= 600 else text[:300] + " ... " + text[-300:]}


def row(peer, case, subset, nbytes, seconds, steps, batches, samples, **extra):
    med, p90 = median_p90(steps)
    per_batch = seconds / batches
    return {"peer": peer, "case": case, "subset": subset, "bytes": nbytes, "seconds": per_batch,
            "gib_s": nbytes / 2**30 / per_batch, "runs": steps, "median_ms": med * 1e3, "p90_ms": p90 * 1e3,
            "samples_per_s": samples / seconds, "batches": batches, **extra}


def bench(args):
    import torch
    import zarr

    zarr.config.set({"async.concurrency": 64})  # as benches/peers.py and tiles.py
    z = zarr.open_array(args.array, mode="r")
    count = args.batches * args.batch_size
    boxes = crop_boxes(z.shape, args.crop, count)
    itemsize = z.dtype.itemsize
    nbytes = args.batch_size * math.prod(args.crop) * itemsize  # a batch
    name = os.path.basename(os.path.normpath(args.array)).removesuffix(".zarr").upper()
    subset = f"{count} random crops of {dims(args.crop)}, CropPlan seed {SEED} (the tiles of benches/tiles.py)"
    sample = torch.zeros((args.batch_size, *args.crop), dtype=torch.float32, device="cuda")
    rows = []
    for compute_ms in args.compute_ms:
        k = calibrate(torch, compute_ms, sample)
        for peer in args.peers:
            case = f"{name} crops {dims(args.crop)}, batch {args.batch_size}, compute {compute_ms:g} ms"
            who = PEERS.get(peer, peer)
            try:
                runs = []
                for _ in range(args.repeat):
                    loader, prefetch, workers = loaders(peer, args, boxes, torch)
                    step, checksum = make_step(torch, k)
                    runs.append((timed_pass(loader, step, torch.cuda.synchronize, args.warmup), checksum()))
                    del loader
                (seconds, steps, batches, samples), total = sorted(runs, key=lambda r: r[0][0])[len(runs) // 2]
                r = row(who, case, subset, nbytes, seconds, steps, batches, samples, batch_size=args.batch_size,
                        prefetch=prefetch, workers=workers, compute_ms=compute_ms, compute_k=k,
                        checksum=total, pass_seconds=[r[0][0] for r in runs])
            except Exception as e:  # noqa: BLE001 - report and go on with the next peer
                r = error_row(who, case, e)
            emit(r, args.json)
            rows.append(r)
            torch.cuda.empty_cache()
    sums = {r["checksum"] for r in rows if "checksum" in r}
    if len(sums) > 1:
        print(f"warning: the peers' checksums differ: {sorted(sums)}", file=sys.stderr)
    print(table(rows))
    return rows


def table(rows):
    lines = [f"{'who':<52} {'compute':>8} {'samples/s':>10} {'ms/batch':>9} {'p90 ms':>8} {'GiB/s':>7}"]
    for r in rows:
        if "samples_per_s" not in r:
            lines.append(f"{r['peer']:<52} {r['case']}: {r.get('error')}")
            continue
        lines.append(f"{r['peer'][:52]:<52} {r['compute_ms']:6g}ms {r['samples_per_s']:10.1f} "
                     f"{r['seconds'] * 1e3:9.2f} {r['p90_ms']:8.2f} {r['gib_s']:7.2f}")
    return "\n".join(lines)


def self_test():
    """Host only: the crops (the tiles of benches/tiles.py), the timed loop, the zarr-python
    dataset's items and the rows."""
    import tempfile

    import numpy as np

    ok = 0

    def check(cond, what):
        nonlocal ok
        if not cond:
            raise AssertionError(what)
        ok += 1

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import tiles

    shape = (512, 2048, 2048)
    boxes = crop_boxes(shape, CROP, 48)
    check([tuple(a for a, _ in b) for b in boxes] == tiles.tile_starts(shape, CROP, 48, False), "tiles.py's tiles")
    check(all(b - a == c for box in boxes for (a, b), c in zip(box, CROP)), "crop shape")
    seen = []
    seconds, steps, batches, samples = timed_pass(([k] * 3 for k in range(6)), seen.append, lambda: None, 2)
    check(seen == [[k] * 3 for k in range(6)] and batches == 4 and samples == 12 and len(steps) == 4, "timed pass")
    check(seconds >= sum(steps) * 0.99, "timed from the end of the warm-up")
    try:
        timed_pass(iter([[1]]), seen.append, lambda: None, 2)
        check(False, "a pass without timed batches is an error")
    except ValueError:
        ok += 1
    r = row("p", "c", "s", 1024, 2.0, [0.5, 0.5, 0.5, 0.5], 4, 16, compute_ms=0.0)
    check(r["samples_per_s"] == 8.0 and r["seconds"] == 0.5 and r["median_ms"] == 500.0, "row")
    check("p" in table([r, error_row("q", "c", ValueError("x"))]), "table")
    try:
        import zarr
    except ImportError:
        print("self-test: zarr not installed: the dataset check is skipped", file=sys.stderr)
        print(f"self-test: {ok} passed, 0 failed")
        return
    with tempfile.TemporaryDirectory(prefix="torch-bench-selftest-") as tmp:
        path = os.path.join(tmp, "z2.zarr")
        data = np.arange(16 * 40 * 36, dtype=np.float32).reshape(16, 40, 36)
        zarr.create_array(path, shape=data.shape, chunks=(4, 8, 8), dtype="float32")[...] = data
        small = crop_boxes(data.shape, (4, 16, 16), 10)
        ds = ZarrCrops(path, small, on_device=False, convert=np.asarray)
        for i, box in enumerate(small):
            check(np.array_equal(ds[i], data[tuple(slice(a, b) for a, b in box)]), f"zarr crop {i}")
        import pickle
        check(pickle.loads(pickle.dumps(ds))._z is None, "the dataset pickles without its array")
    print(f"self-test: {ok} passed, 0 failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--array", help="a benchmark array's directory, e.g. /tmp/zb/z2.zarr")
    ap.add_argument("--crop", default=",".join(map(str, CROP)), help="crop shape (default 64,256,256)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--batches", type=int, default=32, help="batches per pass, warm-up included (default 32)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed batches at the start of a pass (default 2)")
    ap.add_argument("--compute-ms", default="0,40", help="compute step per batch, ms, a list (default 0,40)")
    ap.add_argument("--prefetch", type=int, default=2, help="CropLoader's batches read ahead (default 2)")
    ap.add_argument("--workers", type=int, default=8, help="the zarr-python peer's DataLoader workers (default 8)")
    ap.add_argument("--repeat", type=int, default=1, help="passes per row, the median pass kept (default 1)")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"default {','.join(PEERS)}")
    args = parse_args(ap, self_test)
    if args is None:
        return 0
    args.crop = tuple(int(c) for c in args.crop.split(","))
    args.compute_ms = [float(c) for c in args.compute_ms.split(",") if c.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        ap.error(f"unknown peers {unknown}: one of {', '.join(PEERS)}")
    if args.batches <= args.warmup:
        ap.error("--batches must be more than --warmup")
    bench(args)


if __name__ == "__main__":
    main()
