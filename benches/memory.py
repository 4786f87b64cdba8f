"""Device memory held after a large read, and whole-array speed under the idle bound (issue 16).

    python3 benches/memory.py --array /tmp/zarrs-gpu-bench/z2.zarr [--repeat 5] [--json OUT]

In one process: CuPy's pool emptied, the device's free memory noted; the whole array read with
zarrs_gpu, taken by CuPy, freed (`del`, `gc.collect()`); then what the library holds
(`zarrs_gpu.memory_in_use()`), how much less is free than before, and whether CuPy can allocate 90%
of what was free before. Then `--repeat` whole reads, each freed before the next, timed (median).
Run it with and without ZARRS_GPU_POOL_KEEP_BYTES to compare bounds in the same run.
"""
import argparse
import gc
import os
import statistics
import time

import cupy as cp

import zarrs_gpu

from common import emit


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--array", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json")
    args = p.parse_args()
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    free_before = cp.cuda.runtime.memGetInfo()[0]
    x = zarrs_gpu.read(args.array)
    nbytes = x.nbytes
    c = cp.asarray(x)
    c.sum()  # used, as a program would
    cp.cuda.runtime.deviceSynchronize()
    del c, x
    gc.collect()
    free_after = cp.cuda.runtime.memGetInfo()[0]
    held = zarrs_gpu.memory_in_use()
    try:
        big = cp.empty(int(free_before * 0.9), dtype=cp.uint8)
        cupy_90 = True
        del big
    except cp.cuda.memory.OutOfMemoryError:
        cupy_90 = False
    pool.free_all_blocks()
    times = []
    for _ in range(args.repeat):
        cp.cuda.runtime.deviceSynchronize()
        t = time.perf_counter()
        y = zarrs_gpu.read(args.array)
        times.append(time.perf_counter() - t)
        del y
        gc.collect()
    row = {
        "peer": "zarrs-gpu-python memory",
        "case": os.path.basename(args.array.rstrip("/")),
        "pool_keep_env": os.environ.get("ZARRS_GPU_POOL_KEEP_BYTES"),
        "bytes": nbytes,
        "free_before": free_before,
        "free_after_free": free_after,
        "less_free_after": free_before - free_after,
        "library_idle": held["output_pool_idle"] + held["staging_pooled"],
        "pinned_pooled": held["pinned_pooled"],
        "pool_keep": held["pool_keep"],
        "cupy_allocates_90pct_of_free_before": cupy_90,
        "seconds": statistics.median(times),
        "gib_s": nbytes / 2**30 / statistics.median(times),
    }
    emit(row, args.json)


if __name__ == "__main__":
    main()
