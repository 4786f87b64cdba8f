#!/usr/bin/env python3
"""CF decoding on the device through xarray (issue 19): a packed int16 variable (scale_factor,
add_offset, _FillValue, as xarray's to_zarr packs it) read and decoded into a float64 CuPy
array, by each of

  zarrs-gpu-xarray      xr.open_dataset(engine="zarrs_gpu")["packed"].data: read by zarrs_gpu,
                        decoded on the GPU (zarrs_gpu.xarray.CFMaskScaleArray)
  zarrs-gpu-xarray-raw  the same with mask_and_scale=False: the read alone (int16 on the GPU)
  zarr-xarray-host      xr.open_dataset(engine="zarr")["packed"].values (zarr-python reads and
                        xarray decodes on the host), then cupy.asarray
  zarrs-gpu-dask-mean   zarrs_gpu.xarray.open_dataset(chunks={}): the mean under dask's threaded scheduler
                        (blocks read and decoded on the GPU)

Each row: the median of --repeat runs (after one untimed run), every run a fresh open_dataset
ending with a device synchronisation; bytes are the decoded float64 bytes.

The array (v3, zstd level 1, chunks of 1 x 2048 x 2048, about a tenth of the values the fill
value) is written to DIR/cf_packed_<N>x128mib.zarr (N time steps of 128 MiB) by zarr-python unless it is there already.

Usage:
  python3 benches/xarray_cf.py --dir /tmp/zb --gib 2 [--repeat 3] [--json OUT.jsonl]
Output: one JSON object per row on stdout (and appended to --json), then a table.
"""
import argparse
import os
import statistics
import sys
import time
import warnings

from common import emit

PLANE = (8192, 8192)  # one time step: 128 MiB of int16
CHUNKS = (1, 2048, 2048)
ATTRS = {"scale_factor": 0.002, "add_offset": -7.5, "_FillValue": -32768, "units": "m"}


def write(path, steps):
    import numpy as np
    import zarr
    import zarr.codecs as zc

    g = zarr.open_group(path, mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = g.create_array("packed", shape=(steps, *PLANE), chunks=CHUNKS, dtype="int16", fill_value=0,
                           dimension_names=["time", "y", "x"], compressors=zc.ZstdCodec(level=1))
    a.attrs.update(ATTRS)
    rng = np.random.default_rng(19)
    for t in range(steps):
        slab = rng.integers(-32767, 32768, PLANE, dtype=np.int16)
        slab[rng.random(PLANE, dtype=np.float32) < 0.1] = -32768
        a[t] = slab
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr.consolidate_metadata(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--gib", type=float, default=1.0, help="int16 GiB of the packed variable")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()

    import cupy
    import dask
    import xarray as xr

    import zarrs_gpu.xarray

    steps = max(1, round(args.gib * 2**30 / (2 * PLANE[0] * PLANE[1])))
    path = os.path.join(args.dir, f"cf_packed_{steps}x128mib.zarr")
    if not os.path.exists(os.path.join(path, "zarr.json")):
        os.makedirs(args.dir, exist_ok=True)
        print(f"writing {path} ({steps} x 128 MiB of int16)", file=sys.stderr)
        write(path, steps)
    decoded_bytes = steps * PLANE[0] * PLANE[1] * 8

    def open_(engine, **options):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return xr.open_dataset(path, engine=engine, **options)

    def gpu_xarray():
        x = open_("zarrs_gpu")["packed"].data
        assert isinstance(x, cupy.ndarray) and x.dtype == "float64"
        return x

    def gpu_raw():
        x = open_("zarrs_gpu", mask_and_scale=False)["packed"].data
        assert isinstance(x, cupy.ndarray) and x.dtype == "int16"
        return x

    def host_xarray():
        return cupy.asarray(open_("zarr")["packed"].values)

    def gpu_dask_mean():
        with dask.config.set(scheduler="threads"):
            # DeviceDaskManager: CuPy blocks (xarray's own chunk manager would make them numpy).
            return open_("zarrs_gpu", chunks={}, chunked_array_type=zarrs_gpu.xarray.DeviceDaskManager())[
                "packed"].mean().compute().data

    rows = []
    for peer, run in (("zarrs-gpu-xarray", gpu_xarray), ("zarrs-gpu-xarray-raw", gpu_raw),
                      ("zarr-xarray-host", host_xarray), ("zarrs-gpu-dask-mean", gpu_dask_mean)):
        try:
            times = []
            for i in range(args.repeat + 1):
                start = time.perf_counter()
                out = run()
                cupy.cuda.Device().synchronize()
                if i:
                    times.append(time.perf_counter() - start)
                del out
                cupy.get_default_memory_pool().free_all_blocks()
            seconds = statistics.median(times)
            row = {"peer": peer, "case": "cf_packed_int16", "bytes": decoded_bytes, "seconds": seconds,
                   "gib_s": decoded_bytes / 2**30 / seconds, "runs": len(times)}
        except Exception as err:  # a failing peer is a row; the others go on
            row = {"peer": peer, "case": "cf_packed_int16", "error": f"{type(err).__name__}: {err}"}
        rows.append(row)
        emit(row, args.json)
    print(f"\n{'peer':24} {'seconds':>9} {'GiB/s (float64 out)':>20}")
    for row in rows:
        if "error" in row:
            print(f"{row['peer']:24} {row['error']}")
        else:
            print(f"{row['peer']:24} {row['seconds']:9.3f} {row['gib_s']:20.2f}")


if __name__ == "__main__":
    main()
