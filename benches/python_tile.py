#!/usr/bin/env python3
"""Where a random 64 x 256 x 256 tile read through the Python API spends its time (issue 46,
item 14: 14.2 ms through `zarrs_gpu.open(path)[key]` against 9.6 ms through benches/bench.rs on
the same array and machine).

The same tiles as `bench --tiles N` and benches/tiles.py (splitmix64 seeded with 17, random
starts), each row timed over them after WARMUP untimed reads, medians in milliseconds:

  rust_loop       Array._time_reads: bench.rs's loop (read, ended synchronized, dropped) run in
                  Rust inside this process: the Rust bench's figure here, without Python
  getitem         a[key], the DeviceArray dropped before the next read (as bench.rs drops it)
  getitem_kept    a[key], the previous tile alive during the read (a loop `x = a[key]`)
  tiles_py        tiles.py's row: cupy.asarray(a[key]) then cupy.cuda.Device().synchronize(),
                  the previous tile alive during the read (its release inside the next read's time)
  phases          one pass split: parse (the key to a box: _selection), read (a[key]), export
                  (cupy.asarray: the CUDA array interface), sync (Device().synchronize()),
                  release_cai (del of the CuPy array: the release waits for the device),
                  and for DLPack exports (torch.from_dlpack, when torch is installed)
                  export_dlpack and release_dlpack (ordered after torch's stream, no host wait)
  open            zarrs_gpu.open(path) (metadata read, once per array)

Usage (on the GPU host, after `bench --dir /tmp/bench` wrote the arrays):
  target/interop-venv/bin/python benches/python_tile.py --array /tmp/bench/z2.zarr [--tiles 48]
Output: one JSON object on stdout (and appended to --json): {"array", "tiles", "ms": {row:
median}, "p90_ms": {row: p90}}.
"""
import argparse
import gc
import json
import statistics
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tiles import TILE, WARMUP, make_key, read_meta, tile_starts  # noqa: E402


def p90(values):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--array", required=True, help="a benchmark array (bench.rs writes them), e.g. /tmp/bench/z2.zarr")
    parser.add_argument("--tiles", type=int, default=48)
    parser.add_argument("--json", help="append the result to this file")
    args = parser.parse_args()

    import cupy
    import zarrs_gpu

    meta = read_meta(args.array)
    extent = tuple(min(t, n) for t, n in zip(TILE, meta["shape"]))
    keys = [make_key(s, extent) for s in tile_starts(meta["shape"], extent, args.tiles + WARMUP, False)]
    warm, timed = keys[:WARMUP], keys[WARMUP:]
    rows = {}

    start = time.perf_counter()
    a = zarrs_gpu.open(args.array)
    rows["open"] = [time.perf_counter() - start]
    sync = cupy.cuda.Device().synchronize

    def loop(name, step):
        for key in warm:
            step(key)
        runs = []
        for key in timed:
            t0 = time.perf_counter()
            step(key)
            runs.append(time.perf_counter() - t0)
        rows[name] = runs

    a._time_reads(warm)
    rows["rust_loop"] = a._time_reads(timed)

    loop("getitem", lambda key: a[key])
    held = [None]

    def kept(key):
        held[0] = a[key]

    loop("getitem_kept", kept)
    held[0] = None

    def tiles_py(key):
        held[0] = cupy.asarray(a[key])
        sync()

    loop("tiles_py", tiles_py)
    held[0] = None
    gc.collect()

    try:
        import torch
    except ImportError:
        torch = None
    phases = {k: [] for k in ("parse", "read", "export", "sync", "release_cai", "export_dlpack", "release_dlpack")}
    for n, key in enumerate(warm + timed):
        t = [time.perf_counter()]
        zarrs_gpu._zarrs_gpu._selection(key, list(meta["shape"]))
        t.append(time.perf_counter())
        x = a[key]
        t.append(time.perf_counter())
        c = cupy.asarray(x)
        t.append(time.perf_counter())
        sync()
        t.append(time.perf_counter())
        del c, x
        t.append(time.perf_counter())
        if n >= WARMUP:
            for name, i in (("parse", 0), ("read", 1), ("export", 2), ("sync", 3), ("release_cai", 4)):
                phases[name].append(t[i + 1] - t[i])
        if torch is not None:
            x = a[key]
            t0 = time.perf_counter()
            tt = torch.from_dlpack(x)
            t1 = time.perf_counter()
            del tt, x
            t2 = time.perf_counter()
            if n >= WARMUP:
                phases["export_dlpack"].append(t1 - t0)
                phases["release_dlpack"].append(t2 - t1)
    rows.update({f"phase_{k}": v for k, v in phases.items() if v})

    out = {
        "array": args.array,
        "tiles": len(timed),
        "tile": list(extent),
        "ms": {k: round(statistics.median(v) * 1e3, 3) for k, v in rows.items()},
        "p90_ms": {k: round(p90(v) * 1e3, 3) for k, v in rows.items()},
    }
    line = json.dumps(out)
    print(line)
    if args.json:
        with open(args.json, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
