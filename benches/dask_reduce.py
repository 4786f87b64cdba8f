#!/usr/bin/env python3
"""Benchmark a Dask reduction over a Zarr array: the mean, the max and a histogram, computed in
one pass (every block read once), through

  zarrs-threads     zarrs_gpu.dask.from_zarr, dask's threaded scheduler, one GPU (CuPy blocks)
  host              dask.array.from_zarr, the threaded scheduler, numpy blocks on the host
  host-cupy         dask.array.from_zarr(...).map_blocks(cupy.asarray): decoded on the host, then
                    copied to the GPU, reduced there
  zarrs-distributed zarrs_gpu.dask.from_zarr on a local distributed cluster of N worker processes,
                    one per GPU (zarrs_gpu.dask.local_cluster), for each N of --workers; with more
                    workers than GPUs they share them round robin (the row says so)

All methods use the same blocks (zarrs_gpu.dask's plan: whole chunks, up to --block-mib each), so
the figures differ by where and how the blocks are read and decoded. The histogram's range is
found by an untimed pass (min and max) unless --range is given; its bin width is made a whole
number so that the bin edges are exact and every method's counts can be compared exactly.
Results are cross-checked between methods: max and histogram counts equal, means (float64
accumulation) within --rtol. Each method runs once untimed (warm page cache, workers started)
and then --repeat times.

Usage (on a GPU host; the array from `bench --dir /tmp/zb --gib 16 --cases z2`):
  python3 benches/dask_reduce.py --array /tmp/zb/z2.zarr [--methods zarrs-threads,host,host-cupy,zarrs-distributed]
          [--workers 1,2] [--repeat 3] [--threads N] [--worker-threads 4] [--reader-threads N]
          [--bins 64] [--range LO,HI]
          [--block-mib 512] [--json OUT.jsonl]
  python3 benches/dask_reduce.py --array PATH --dry-host   # numpy instead of CuPy, host reads, no GPU
  python3 benches/dask_reduce.py --self-test               # the dry-host run on a small array it writes

Output: one JSON object per method on stdout (and appended to --json), e.g.
  {"method": "zarrs-threads", "case": "z2.zarr", "bytes": N, "seconds": median_s, "gib_s": g,
   "runs": [s, ...], "blocks": 32, "block_shape": [...], "speedup_vs_host": r, "mean": m, "max": x,
   "histogram_sum": n, ...}
then {"check": ...} with the cross-check (exit status 1 when the methods disagree). A method that
fails prints {"method": ..., "error": "..."} and the rest go on.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np

from common import emit, parse_args

METHODS = ("zarrs-threads", "host", "host-cupy", "zarrs-distributed")


# ---------------------------------------------------------------- dry-host stand-ins
def host_reader(path, array, device, box):
    """zarrs_gpu.dask's reader replaced by zarr-python on the host (--dry-host)."""
    import zarr

    z = zarr.open_array(os.path.join(path, array.strip("/")), mode="r")
    return z[tuple(slice(start, stop) for start, stop in box)]


def host_meta(dtype, ndim):
    return np.empty((0,) * ndim, dtype=dtype)


def use_host_reads():
    """--dry-host in this process: zarrs_gpu.dask reads with zarr-python into numpy."""
    import zarrs_gpu.dask as zd

    zd.reader = host_reader
    zd.make_meta = host_meta


def host_reads_plugin():
    """A worker plugin doing use_host_reads() in every worker (--dry-host with distributed)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class HostReads(WorkerPlugin):
        name = "dask-reduce-host-reads"

        def setup(self, worker):
            use_host_reads()

    return HostReads()


# ---------------------------------------------------------------- the reduction
def nice_range(lo, hi, bins):
    """A histogram range from ``lo`` covering ``hi`` whose bin width is a whole number (at least
    1), so that the edges are exact in float64 wherever they are computed."""
    lo = math.floor(lo)
    width = max(1, math.ceil((math.floor(hi) + 1 - lo) / bins))
    return float(lo), float(lo + width * bins)


def reductions(x, bins, hist_range):
    import dask.array as da

    counts, _ = da.histogram(x, bins=bins, range=hist_range)
    return [x.mean(dtype=np.float64), x.max(), counts]


def to_host(value):
    """A result (numpy or CuPy) as numpy."""
    get = getattr(value, "get", None)
    return np.asarray(get() if callable(get) and not isinstance(value, np.ndarray) else value)


def summary(results):
    mean, top, counts = (to_host(r) for r in results)
    return {"mean": float(mean), "max": top.item(), "counts": counts.astype(np.int64)}


def timed(compute, repeat):
    """One untimed run, then ``repeat`` timed ones: (median seconds, runs, the last results)."""
    results = compute()
    runs = []
    for _ in range(repeat):
        results = None
        start = time.perf_counter()
        results = compute()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs), runs, results


def free_device(xp):
    if xp is not np:
        import zarrs_gpu

        xp.get_default_memory_pool().free_all_blocks()
        zarrs_gpu.empty_cache()


# ---------------------------------------------------------------- methods
def run_threaded(method, args, xp, blocks, hist_range):
    import dask
    import dask.array as da
    import zarr

    import zarrs_gpu.dask as zd

    if method == "zarrs-threads":
        x = zd.from_zarr(args.array, block_bytes=args.block_bytes)
    else:
        x = da.from_zarr(zarr.open_array(args.array, mode="r"), chunks=blocks)
        if method == "host-cupy":
            x = x.map_blocks(xp.asarray, meta=xp.empty((0,) * x.ndim, dtype=x.dtype))
    if x.chunks != blocks:
        raise RuntimeError(f"{method}: blocks {x.chunks} differ from the plan {blocks}")
    todo = reductions(x, args.bins, hist_range)

    def compute():
        with dask.config.set(scheduler="threads", num_workers=args.threads):
            return dask.compute(*todo)

    secs, runs, results = timed(compute, args.repeat)
    return secs, runs, results, {"threads": args.threads or os.cpu_count()}


def run_distributed(n_workers, args, xp, blocks, hist_range):
    from distributed import Client

    import zarrs_gpu.dask as zd

    if args.dry_host:
        devices = list(range(n_workers))  # no GPU: the values only name each worker's GPU
    else:
        gpus = xp.cuda.runtime.getDeviceCount()
        devices = [i % gpus for i in range(n_workers)]
    extra = {}
    with zd.local_cluster(devices=devices, dask_cuda=False, threads_per_worker=args.worker_threads,
                          reader_threads=args.reader_threads, dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(n_workers, timeout=120)
        if args.dry_host:
            client.register_plugin(host_reads_plugin())
        else:
            extra["worker_gpus"] = sorted(client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES")).values())
            extra["serialization"] = sorted(set(client.run(zd.register_cupy_serialization).values()))
        x = zd.from_zarr(args.array, block_bytes=args.block_bytes)
        if x.chunks != blocks:
            raise RuntimeError(f"zarrs-distributed: blocks {x.chunks} differ from the plan {blocks}")
        todo = reductions(x, args.bins, hist_range)
        secs, runs, results = timed(lambda: client.compute(todo, sync=True), args.repeat)
    extra.update(workers=n_workers, worker_threads=args.worker_threads, reader_threads=args.reader_threads,
                 devices=[str(d) for d in devices],
                 shared_gpus=len(set(devices)) < len(devices))
    return secs, runs, results, extra


# ---------------------------------------------------------------- driver
def run(args):
    if args.dry_host:
        xp = np
        use_host_reads()
    else:
        import cupy as xp
    import zarr

    import zarrs_gpu.dask as zd

    args.block_bytes = int(args.block_mib * 2**20)
    x = zd.from_zarr(args.array, block_bytes=args.block_bytes)
    blocks = x.chunks
    nbytes = int(np.prod(x.shape)) * x.dtype.itemsize
    case = os.path.basename(os.path.normpath(args.array))
    z = zarr.open_array(args.array, mode="r")
    common = {"case": case, "shape": list(x.shape), "dtype": str(x.dtype), "chunks": list(z.chunks),
              "shards": list(z.shards) if z.shards else None, "bytes": nbytes, "blocks": x.npartitions,
              "block_shape": [max(c) for c in blocks], "bins": args.bins, "dry_host": args.dry_host}
    if args.range:
        hist_range = tuple(float(v) for v in args.range.split(","))
    else:
        import dask

        with dask.config.set(scheduler="threads", num_workers=args.threads):
            lo, hi = dask.compute(x.min(), x.max())
        hist_range = nice_range(float(to_host(lo)), float(to_host(hi)), args.bins)
        free_device(xp)
    common["range"] = list(hist_range)
    del x
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise SystemExit(f"dask_reduce: unknown method {m!r} (known: {', '.join(METHODS)})")
    runs_to_do = []
    for m in methods:
        if m == "zarrs-distributed":
            runs_to_do += [(m, int(n)) for n in args.workers.split(",") if n.strip()]
        else:
            runs_to_do.append((m, None))
    rows, sums = [], {}
    for method, n in runs_to_do:
        label = method if n is None else f"{method} {n}w"
        row = {"method": method, **common}
        try:
            if n is None:
                secs, runs, results, extra = run_threaded(method, args, xp, blocks, hist_range)
            else:
                secs, runs, results, extra = run_distributed(n, args, xp, blocks, hist_range)
            got = summary(results)
            del results
            sums[label] = got
            row.update(extra)
            row.update(seconds=secs, gib_s=nbytes / 2**30 / secs if secs > 0 else None, runs=runs,
                       mean=got["mean"], max=got["max"], histogram_sum=int(got["counts"].sum()))
            rows.append((label, row))
        except Exception as e:  # noqa: BLE001 - report and go on with the next method
            text = f"{type(e).__name__}: {e}"
            row["error"] = text if len(text) <= 600 else text[:300] + " ... " + text[-300:]
            if n is not None:
                row["workers"] = n
            emit(row, args.json)
        free_device(xp)
    # Ratios: against the host, and the distributed rows against one worker.
    seconds = {label: row["seconds"] for label, row in rows}
    for label, row in rows:
        if "host" in seconds:
            row["speedup_vs_host"] = seconds["host"] / row["seconds"]
        if "host-cupy" in seconds:
            row["speedup_vs_host_cupy"] = seconds["host-cupy"] / row["seconds"]
        if row["method"] == "zarrs-distributed" and "zarrs-distributed 1w" in seconds:
            row["scaling_vs_1_worker"] = seconds["zarrs-distributed 1w"] / row["seconds"]
        emit(row, args.json)
    # The cross-check: every method against the first that ran.
    problems = []
    labels = list(sums)
    for label in labels[1:]:
        ref, got = sums[labels[0]], sums[label]
        if got["max"] != ref["max"]:
            problems.append(f"{label}: max {got['max']} != {ref['max']} ({labels[0]})")
        if not math.isclose(got["mean"], ref["mean"], rel_tol=args.rtol, abs_tol=0.0):
            problems.append(f"{label}: mean {got['mean']!r} != {ref['mean']!r} ({labels[0]}) within {args.rtol}")
        if not np.array_equal(got["counts"], ref["counts"]):
            differ = int(np.count_nonzero(got["counts"] != ref["counts"]))
            problems.append(f"{label}: histogram differs from {labels[0]}'s in {differ} of {args.bins} bins")
    failed = len(runs_to_do) - len(rows)
    check = {"check": "results agree" if not problems else "results differ", "ok": not problems,
             "compared": labels, "problems": problems, "failed_methods": failed}
    emit(check, args.json)
    return 0 if not problems and not failed else 1


def self_test():
    """The dry-host run on a small zstd array of whole-number floats (like `bench`'s), each
    method and two worker processes; the results checked against numpy here too."""
    import shutil
    import subprocess
    import tempfile
    import warnings

    import zarr
    import zarr.codecs as zc

    assert nice_range(-3.5, 10.0, 4) == (-4.0, 8.0 + 4.0)  # width 4: 15 values over 4 bins
    assert nice_range(0, 0, 64) == (0.0, 64.0)
    tmp = tempfile.mkdtemp(prefix="dask-reduce-selftest-")
    try:
        rng = np.random.default_rng(4)
        data = (rng.integers(-500, 500, (48, 80, 72)) + np.arange(72) * 0.5).round().astype("float32")
        path = os.path.join(tmp, "z.zarr")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z = zarr.create_array(store=path, shape=data.shape, dtype="float32", chunks=(16, 16, 24),
                                  compressors=zc.ZstdCodec(level=3))
        z[...] = data
        out = os.path.join(tmp, "out.jsonl")
        cmd = [sys.executable, os.path.abspath(__file__), "--array", path, "--dry-host", "--repeat", "1",
               "--workers", "1,2", "--block-mib", "0.1", "--bins", "16", "--json", out]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = [json.loads(line) for line in open(out)]
        assert [r.get("method") for r in rows[:-1]] == list(METHODS[:3]) + ["zarrs-distributed"] * 2, rows
        check = rows[-1]
        assert check["ok"] and check["failed_methods"] == 0 and len(check["compared"]) == 5, check
        lo, hi = rows[0]["range"]
        want_counts = np.histogram(data, bins=16, range=(lo, hi))[0]
        for r in rows[:-1]:
            assert r["blocks"] > 8 and r["bytes"] == data.nbytes, r
            assert r["max"] == float(data.max()) and r["histogram_sum"] == int(want_counts.sum()) == data.size, r
            assert math.isclose(r["mean"], float(data.astype("f8").mean()), rel_tol=1e-12), r
        assert rows[3]["workers"] == 1 and rows[4]["workers"] == 2 and "scaling_vs_1_worker" in rows[4], rows[4]
        assert all("speedup_vs_host" in r for r in rows[:-1])
    finally:
        shutil.rmtree(tmp)
    print("self-test: passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--array", help="a Zarr array directory (e.g. /tmp/zb/z2.zarr)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--workers", default="1", help="worker counts for zarrs-distributed, e.g. 1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of the threaded scheduler (default: dask's, the CPU count)")
    ap.add_argument("--worker-threads", type=int, default=4,
                    help="threads per distributed worker (local_cluster's default, 4)")
    ap.add_argument("--reader-threads", type=int, default=None,
                    help="zarrs_gpu reader threads per distributed worker (default: local_cluster's, the "
                         "cores split between the workers; 0: every core)")
    ap.add_argument("--bins", type=int, default=64)
    ap.add_argument("--range", default=None, help="the histogram's LO,HI (default: from an untimed pass)")
    ap.add_argument("--block-mib", type=float, default=512, help="zarrs_gpu.dask's block budget, MiB")
    ap.add_argument("--rtol", type=float, default=1e-9, help="how close the means must be")
    ap.add_argument("--dry-host", action="store_true", help="numpy instead of CuPy, host reads (no GPU)")
    args = parse_args(ap, self_test)
    if args is None:
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
