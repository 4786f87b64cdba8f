#!/usr/bin/env python3
"""Benchmark whole-array writes by zarr-python, tensorstore and zarrs_gpu on the same data (issue 29).

    python3 benches/write_peers.py --dir DIR [--gib 1] [--repeat 3] [--cases zstd,raw]
                                   [--writers zarr-numpy,zarr-gpu-cupy,...] [--json OUT.jsonl]

The data: a float32 array of about --gib GiB in 1 MiB chunks (64 x 64 x 64), a smooth field
rounded to integers plus 4 bits of noise (src/sample.rs's recipe, noise from a generator seeded
with 29), made once; every writer writes the same values. Cases: "zstd" (zstd level 3), "gzip"
(level 5), "blosc" (lz4 level 5, byte shuffle: zarr-python 2's default) and "raw" (no
compressor), fill value 0.

Each run writes into a fresh array in a new directory under --dir: the array created untimed
(metadata only), `sync`, then the write and a final os.sync() timed. One untimed warm-up, then
--repeat timed runs (median). Each run's directory is removed after it; the last one first read
back by zarr-python and compared with the source (a mismatch: an error row, exit status 1).

Writers (rows; --writers takes the names on the left):
  zarr-numpy        zarr-python, arr[...] = numpy array.
  zarr-gpu-cupy     zarr-python under zarr.config.enable_gpu(), arr[...] = cupy array (zarr-python
                    encodes on the host there).
  tensorstore-numpy tensorstore's zarr3 driver (ts.open(create=True)), write(numpy).result();
                    its file kvstore flushes each file as it goes (its default).
  zarrs-gpu-cupy    zarrs_gpu.open(path, mode="r+").write(slice(None), cupy array): encoded on
                    the device where the codecs allow.
  zarrs-gpu-numpy   the same from a numpy array (written by zarrs on the host).

Output: one JSON object per writer and case on stdout (and appended to --json), e.g.
  {"peer": "zarr-python, numpy source", "case": "write 1.00 GiB float32, zstd level 3, chunks
   64x64x64", "shape": [...], "bytes": N, "seconds": median_s, "gib_s": g, "runs": [...],
   "ratio": raw_bytes / stored_bytes, "io": "ratio (files) 3.612; ...", "verified": true}
A writer whose module is missing prints {"peer": ..., "skipped": "missing: ..."}; a failing one
{"peer": ..., "error": "..."}, and the rest go on.
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import numpy as np

from common import emit
from peers import configure_zarr

CHUNKS = (64, 64, 64)  # float32: 1 MiB
CASES = {"zstd": "zstd level 3", "gzip": "gzip level 5", "blosc": "blosc lz4 level 5 shuffle", "raw": "no compressor"}
# Each case's v3 bytes-to-bytes codec (zarr-python builds it from this too).
CODECS = {
    "zstd": {"name": "zstd", "configuration": {"level": 3, "checksum": False}},
    "gzip": {"name": "gzip", "configuration": {"level": 5}},
    "blosc": {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4,
                                                 "blocksize": 0}},
}
WRITERS = {  # name: (row's peer, source)
    "zarr-numpy": ("zarr-python, numpy source", "numpy"),
    "zarr-gpu-cupy": ("zarr-python enable_gpu(), CuPy source", "cupy"),
    "tensorstore-numpy": ("tensorstore, numpy source", "numpy"),
    "zarrs-gpu-cupy": ("zarrs_gpu, CuPy source", "cupy"),
    "zarrs-gpu-numpy": ("zarrs_gpu, numpy source", "numpy"),
}


class Missing(Exception):
    """An optional module is not installed: the writer's row says so."""


def need(module):
    try:
        return __import__(module)
    except ImportError as e:
        raise Missing(f"{module} ({e})") from None


# ---------------------------------------------------------------- data
def shape_for(gib):
    """A shape of whole 1 MiB chunks, about `gib` GiB: (64 gz, 64 s, 64 s), s up to 16."""
    n = max(1, round(gib * 1024))
    side = 16
    while side > 1 and side * side > n:
        side //= 2
    return (64 * max(1, round(n / side**2)), 64 * side, 64 * side)


def make_data(shape, seed=29):
    """sin(0.011 x) cos(0.007 y) 1000 + z / 2, rounded, plus an integer 0..15 of noise."""
    z, y, x = (np.arange(n, dtype=np.float32) for n in shape)
    plane = np.sin(x * 0.011)[None, :] * np.cos(y * 0.007)[:, None] * np.float32(1000)
    data = np.empty(shape, dtype=np.float32)
    for i in range(shape[0]):
        np.round(plane + z[i] * np.float32(0.5), out=data[i])
    data += np.random.default_rng(seed).integers(0, 16, size=shape, dtype=np.uint8)
    return data


def stored_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


# ---------------------------------------------------------------- writers
def zarr_create(path, shape, case):
    import zarr
    compressors = {
        "zstd": lambda: zarr.codecs.ZstdCodec(level=3),
        "gzip": lambda: zarr.codecs.GzipCodec(level=5),
        "blosc": lambda: zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),
    }.get(case, lambda: None)()
    return zarr.create_array(store=path, shape=shape, chunks=CHUNKS, dtype="float32",
                             compressors=compressors, filters=None, fill_value=0)


def tensorstore_create(path, shape, case):
    ts = need("tensorstore")
    codecs = [{"name": "bytes", "configuration": {"endian": "little"}}]
    if case in CODECS:
        codecs.append(CODECS[case])
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.abspath(path)},
            "metadata": {"shape": list(shape), "data_type": "float32", "fill_value": 0, "codecs": codecs,
                         "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(CHUNKS)}},
                         "chunk_key_encoding": {"name": "default"}}}
    context = ts.Context({"data_copy_concurrency": {"limit": os.cpu_count()},
                          "file_io_concurrency": {"limit": 64}})
    return ts.open(spec, create=True, context=context).result()


def make_writer(name):
    """prepare(path, shape, case) -> handle (untimed); write(handle, src) -> report or None."""
    if name == "zarr-numpy":
        def write(arr, src):
            arr[...] = src
        return zarr_create, write
    if name == "zarr-gpu-cupy":
        import zarr

        def prepare(path, shape, case):
            with zarr.config.enable_gpu():
                return zarr_create(path, shape, case)

        def write(arr, src):
            with zarr.config.enable_gpu():
                arr[...] = src
        return prepare, write
    if name == "tensorstore-numpy":
        def write(store, src):
            store.write(src).result()
        return tensorstore_create, write
    if name.startswith("zarrs-gpu-"):
        zarrs_gpu = need("zarrs_gpu")

        def prepare(path, shape, case):
            zarr_create(path, shape, case)  # zarr.json only
            return zarrs_gpu.open(path, mode="r+")

        return prepare, lambda arr, src: arr.write(slice(None), src)
    raise ValueError(f"unknown writer {name!r} (known: {', '.join(WRITERS)})")


# ---------------------------------------------------------------- benchmark
def bench(name, case, shape, src, data, args):
    import zarr
    prepare, write = make_writer(name)
    runs, report, ratio = [], None, None
    for i in range(args.repeat + 1):  # run 0: the untimed warm-up
        path = os.path.join(args.dir, f"write-{name}-{case}-{i}.zarr")
        shutil.rmtree(path, ignore_errors=True)
        try:
            handle = prepare(path, shape, case)
            os.sync()
            t0 = time.perf_counter()
            report = write(handle, src)
            os.sync()
            elapsed = time.perf_counter() - t0
            del handle
            if i > 0:
                runs.append(elapsed)
            ratio = data.nbytes / max(1, stored_bytes(path))
            if i == args.repeat:  # the last: read back by zarr-python (on the host)
                back = zarr.open_array(path, mode="r")[...]
                if not np.array_equal(back, data):
                    bad = int(np.count_nonzero(back != data))
                    raise AssertionError(f"read back by zarr-python: {bad} of {data.size} values differ")
        finally:
            shutil.rmtree(path, ignore_errors=True)
    secs = statistics.median(runs)
    io = f"ratio (files) {ratio:.3f}"
    row = {"ratio": ratio}
    if report:
        io += f"; zarrs_gpu report {json.dumps(report)}"
        row["report"] = dict(report)
    return {"bytes": int(data.nbytes), "seconds": secs, "gib_s": data.nbytes / 2**30 / secs,
            "runs": runs, **row, "io": io, "verified": True}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="where the written arrays go (each removed after its run)")
    ap.add_argument("--gib", type=float, default=1.0, help="array size in GiB (rounded to whole 1 MiB chunks)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs after one untimed warm-up")
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    ap.add_argument("--writers", default=",".join(WRITERS), help=f"comma list of {', '.join(WRITERS)}")
    ap.add_argument("--json", help="append result lines to this JSONL file")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    writers = [w.strip() for w in args.writers.split(",") if w.strip()]
    if unknown := [c for c in cases if c not in CASES] + [w for w in writers if w not in WRITERS]:
        ap.error(f"unknown case or writer: {', '.join(unknown)}")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    os.makedirs(args.dir, exist_ok=True)
    configure_zarr()
    shape = shape_for(args.gib)
    data = make_data(shape)
    sources = {"numpy": data}
    failed = False
    for case in cases:
        label = (f"write {data.nbytes / 2**30:.2f} GiB float32, {CASES[case]}, "
                 f"chunks {'x'.join(map(str, CHUNKS))}")
        for name in writers:
            peer, kind = WRITERS[name]
            row = {"peer": peer, "case": label, "writer": name, "shape": list(shape), "chunks": list(CHUNKS)}
            try:
                if kind not in sources:  # the device copy, made once for every CuPy writer
                    sources[kind] = need("cupy").asarray(data)
                row.update(bench(name, case, shape, sources[kind], data, args))
            except Missing as e:
                row["skipped"] = f"missing: {e}"
            except Exception as e:  # noqa: BLE001 - report and go on with the next writer
                text = f"{type(e).__name__}: {e}"
                row["error"] = text if len(text) <= 600 else text[:300] + " ... " + text[-300:]
                failed = True
            emit(row, args.json)
            if "cupy" in sys.modules:
                sys.modules["cupy"].get_default_memory_pool().free_all_blocks()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
