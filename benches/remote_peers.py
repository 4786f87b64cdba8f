"""Readers of one array in an S3 bucket, into GPU memory, in one run (issue 30): zarrs_gpu by URL,
and zarr-python through obstore (its own S3 path) into CuPy (``zarr.config.enable_gpu()``) and
into numpy; each read checked against the first reader's (a checksum). Whole array and a random
unaligned tile. One JSON row per reader and case (medians of REPEAT after one untimed read).

    AWS_ENDPOINT=http://127.0.0.1:9000 AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... \\
        python3 benches/remote_peers.py s3://bucket/z2.zarr --repeat 3 --json out.jsonl
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def options_from_env():
    """The S3 settings benches/remote.sh exports, for zarrs_gpu (object_store's names) and obstore."""
    endpoint = os.environ["AWS_ENDPOINT"]
    ours = {"aws_endpoint": endpoint, "allow_http": "true", "aws_region": os.environ.get("AWS_REGION", "us-east-1"),
            "aws_access_key_id": os.environ["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
    return endpoint, ours


def zarr_python_store(url, endpoint):
    import obstore.store
    import zarr.storage

    bucket, _, prefix = url[len("s3://"):].partition("/")
    s3 = obstore.store.S3Store(bucket, prefix=prefix, endpoint=endpoint, access_key_id=os.environ["AWS_ACCESS_KEY_ID"],
                               secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                               region=os.environ.get("AWS_REGION", "us-east-1"), virtual_hosted_style_request=False,
                               client_options={"allow_http": True})
    return zarr.storage.ObjectStore(s3, read_only=True)


def timed(read, repeat):
    """(median seconds, p90 seconds, checksum of the last result) of `read()` after one untimed call."""
    import cupy as cp

    read()
    times = []
    for _ in range(repeat):
        cp.cuda.Device().synchronize()
        start = time.perf_counter()
        out = read()
        cp.cuda.Device().synchronize()
        times.append(time.perf_counter() - start)
    total = float(cp.asarray(out, dtype=cp.float64).sum()) if not isinstance(out, np.ndarray) else float(
        out.astype(np.float64).sum())
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.9 * len(times)))], total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--readers", default="zarrs_gpu,zarr-python-gpu,zarr-python-numpy")
    parser.add_argument("--tile", default="64,256,256")
    parser.add_argument("--concurrency", type=int, default=None, help="zarrs_gpu's GETs in flight (default its own)")
    parser.add_argument("--zarr-concurrency", type=int, default=None,
                        help="zarr-python's async.concurrency (default its own, 10)")
    parser.add_argument("--json")
    args = parser.parse_args()

    import cupy as cp
    import zarr

    import zarrs_gpu

    if args.zarr_concurrency:
        zarr.config.set({"async.concurrency": args.zarr_concurrency})
    endpoint, ours = options_from_env()
    if args.concurrency:
        ours["concurrency"] = str(args.concurrency)
    z = zarr.open_array(zarr_python_store(args.url, endpoint), mode="r")
    shape, itemsize = z.shape, z.dtype.itemsize
    tile = tuple(min(int(t), n) for t, n in zip(args.tile.split(","), shape))
    rng = np.random.default_rng(11)
    start = tuple(int(rng.integers(0, n - t + 1)) for n, t in zip(shape, tile))
    boxes = {"whole": tuple(slice(None) for _ in shape),
             "tile": tuple(slice(s, s + t) for s, t in zip(start, tile))}
    a = zarrs_gpu.open(args.url, storage_options=ours)

    def zarr_gpu(key):
        with zarr.config.enable_gpu():
            g = zarr.open_array(zarr_python_store(args.url, endpoint), mode="r")
            return g[key]

    readers = {
        "zarrs_gpu": lambda key: cp.asarray(a[key]),
        "zarr-python-gpu": zarr_gpu,
        "zarr-python-numpy": lambda key: z[key],
    }
    sums = {}
    for case, key in boxes.items():
        nbytes = int(np.prod([len(range(*k.indices(n))) for k, n in zip(key, shape)])) * itemsize
        for name in args.readers.split(","):
            median, p90, total = timed(lambda: readers[name](key), args.repeat)
            agrees = sums.setdefault(case, total) == total
            row = {"case": f"{case} from S3", "reader": name, "url": args.url, "bytes": nbytes,
                   "concurrency": ours.get("concurrency") if name == "zarrs_gpu" else zarr.config.get("async.concurrency"),
                   "median_s": median, "p90_s": p90, "gib_s": nbytes / 2**30 / median, "same_values": agrees,
                   "box": [[k.start, k.stop] for k in key] if case == "tile" else None}
            print(json.dumps(row), flush=True)
            if args.json:  # row by row: a run cut short keeps what it measured
                with open(args.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
            if not agrees:
                print(f"{name} {case}: checksum {total} differs from {sums[case]}", file=sys.stderr)


if __name__ == "__main__":
    main()
