#!/usr/bin/env python3
"""Benchmark the Python "peer" readers that the Rust GPU benchmark is compared against.

Each peer loads a Zarr v3 array (or a subset of it) from a local directory store
into GPU memory as a cupy array; run it with a warm page cache (one untimed
warm-up run precedes the timed ones).

Peers:
  kvikio     serial Python loop over the chunks that intersect the subset:
             kvikio.CuFile(chunk).pread(cupy_buf).get(), then
             out[dst] = chunk.view(dtype).reshape(chunk_shape)[src].
             Only for arrays whose codecs are just "bytes" (little endian).
  zarr-gpu   zarr-python 3 under `with zarr.config.enable_gpu():` (cupy result).
  zarr-host  zarr-python 3 host read (numpy), then one cupy.asarray copy.
  zarr-gpu-nvcomp  zarr-python 3 on the GPU with an nvCOMP zstd codec registered for "zstd"
             (zarr-python PR #2863's approach; --batch-size sets codec_pipeline.batch_size).
  tensorstore  tensorstore's read to host memory, then one cupy.asarray copy.
  nvcomp-ceiling  nvCOMP's Python API decoding every chunk, already on the device, in one call.

Usage:
  python3 benches/peers.py --array PATH [--subset "0:64,:,:"] [--repeat 3]
                           [--peers kvikio,zarr-gpu,zarr-host] [--json OUT.jsonl]
  python3 benches/peers.py --array PATH --dry-host   # numpy instead of cupy, no GPU
  python3 benches/peers.py --self-test               # host-only correctness check

Output: one JSON object per peer on stdout (and appended to --json), e.g.
  {"peer": "kvikio", "subset": "0:64,0:512,0:512", "shape": [...], "bytes": N,
   "seconds": median_s, "gib_s": g, "checksum": c, "runs": [s, ...]}
A failing peer prints {"peer": ..., "error": "..."} (or "skipped") and the rest go on.
"""
import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time

import numpy as np

from common import emit, parse_args

PEERS = ("kvikio", "zarr-gpu", "zarr-host")  # also: zarr-gpu-nvcomp, tensorstore, zarrs-gpu-python, zarr-gpu-zarrs, nvcomp-ceiling


# ---------------------------------------------------------------- helpers
def parse_subset(text, shape):
    """'0:64,:,:' -> list of (start, stop) per dimension (missing trailing dims = ':')."""
    parts = [p.strip() for p in text.split(",")] if text and text.strip() else []
    if len(parts) > len(shape):
        raise ValueError(f"subset {text!r} has more dimensions than shape {shape}")
    parts += [":"] * (len(shape) - len(parts))
    out = []
    for p, n in zip(parts, shape):
        fields = p.split(":")
        if len(fields) != 2:
            raise ValueError(f"bad slice {p!r} (expected 'a:b' or ':')")
        a, b = (int(f) if f.strip() else None for f in fields)
        start, stop, _ = slice(a, b).indices(n)
        out.append((start, max(start, stop)))
    return out


def format_subset(ranges):
    return ",".join(f"{a}:{b}" for a, b in ranges)


def parse_fill_value(fv, dtype):
    """Zarr v3 fill_value JSON -> numpy scalar of dtype."""
    if isinstance(fv, str):
        if fv.startswith("0x"):  # raw bit pattern of a float
            raw = int(fv, 16).to_bytes(dtype.itemsize, "little")
            return np.frombuffer(raw, dtype=dtype)[0]
        fv = {"NaN": "nan", "Infinity": "inf", "-Infinity": "-inf"}[fv]
        return dtype.type(float(fv))
    if isinstance(fv, list):  # complex: [re, im]
        return dtype.type(complex(*[float(parse_fill_value(x, np.dtype("f8"))) for x in fv]))
    return dtype.type(fv)


def read_meta(path):
    with open(os.path.join(path, "zarr.json")) as f:
        meta = json.load(f)
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        raise ValueError(f"{path} is not a Zarr v3 array")
    if meta["chunk_grid"]["name"] != "regular":
        raise ValueError("only the regular chunk grid is supported")
    if not isinstance(meta["data_type"], str):
        raise ValueError(f"unsupported data_type {meta['data_type']!r}")
    dtype = np.dtype(meta["data_type"]).newbyteorder("<")
    enc = meta.get("chunk_key_encoding", {"name": "default"})
    kind = enc.get("name", "default")
    sep = enc.get("configuration", {}).get("separator", "/" if kind == "default" else ".")
    return {
        "shape": tuple(meta["shape"]),
        "chunk_shape": tuple(meta["chunk_grid"]["configuration"]["chunk_shape"]),
        "dtype": dtype,
        "fill": parse_fill_value(meta["fill_value"], dtype),
        "codecs": meta["codecs"],
        "key": (kind, sep),
    }


def chunk_key(key_enc, idx):
    kind, sep = key_enc
    if kind == "default":
        return sep.join(["c", *map(str, idx)])
    return sep.join(map(str, idx)) if idx else "0"  # "v2" encoding


def bytes_only(codecs):
    """None if the codecs are just a little-endian "bytes" codec, else the reason."""
    if len(codecs) != 1 or codecs[0].get("name") != "bytes":
        return f"codecs {[c.get('name') for c in codecs]} are not just ['bytes']"
    if codecs[0].get("configuration", {}).get("endian", "little") != "little":
        return "big-endian bytes codec"
    return None


# ---------------------------------------------------------------- peers
def load_chunks(path, ranges, xp, read_chunk):
    """kvikio-style load: serial loop over intersecting chunks, read whole chunk file
    into a device buffer with read_chunk(file, buf) -> nbytes, scatter the needed part."""
    m = read_meta(path)
    if (why := bytes_only(m["codecs"])) is not None:
        raise NotImplementedError(why)
    cs, dtype = m["chunk_shape"], m["dtype"]
    out = xp.empty(tuple(b - a for a, b in ranges), dtype=dtype)
    if out.size == 0:
        return out
    nbytes = math.prod(cs) * dtype.itemsize
    grid = [range(a // c, (b - 1) // c + 1) for (a, b), c in zip(ranges, cs)]
    pending = None  # event of the last scatter (GDS reads are not stream ordered)
    for idx in itertools.product(*grid):
        lo = [i * c for i, c in zip(idx, cs)]
        inter = [(max(a, l), min(b, l + c)) for (a, b), l, c in zip(ranges, lo, cs)]
        dst = tuple(slice(s - a, e - a) for (s, e), (a, _) in zip(inter, ranges))
        src = tuple(slice(s - l, e - l) for (s, e), l in zip(inter, lo))
        fname = os.path.join(path, *chunk_key(m["key"], idx).split("/"))
        if not os.path.exists(fname):
            out[dst] = m["fill"]
            continue
        if pending is not None:
            pending.synchronize()
        buf = xp.empty(nbytes, dtype=np.uint8)
        got = read_chunk(fname, buf)
        if got != nbytes:
            raise IOError(f"{fname}: read {got} bytes, expected {nbytes}")
        out[dst] = buf.view(dtype).reshape(cs)[src]
        if xp is not np:
            pending = xp.cuda.Event()
            pending.record()
    return out


def host_read(fname, buf):
    with open(fname, "rb", buffering=0) as f:
        return f.readinto(memoryview(buf))


def zarr_load(path, ranges, xp, gpu):
    import zarr
    sel = tuple(slice(a, b) for a, b in ranges)
    if gpu:
        with zarr.config.enable_gpu():
            out = zarr.open_array(path, mode="r")[sel]
        assert isinstance(out, xp.ndarray), f"zarr-gpu returned {type(out)}"
        return out
    return xp.asarray(zarr.open_array(path, mode="r")[sel])


_NVCOMP_ZSTD = None


def nvcomp_zstd_codec():
    """A zarr-python zstd codec that decodes on the GPU with nvCOMP's Python API, one nvCOMP call
    per batch the codec pipeline hands it (the approach of zarr-python PR #2863, which zarr
    3.4.2 does not ship). Registered as "zstd" and selected through zarr's config."""
    global _NVCOMP_ZSTD
    if _NVCOMP_ZSTD is not None:
        return _NVCOMP_ZSTD
    import asyncio
    import cupy as cp
    import zarr
    from nvidia import nvcomp
    from zarr.registry import register_codec

    class NvcompZstd(zarr.codecs.ZstdCodec):
        def _nvcomp(self):
            codec = getattr(self, "_nv", None)
            if codec is None:
                codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                     device_id=cp.cuda.Device().id, cuda_stream=cp.cuda.get_current_stream().ptr)
                object.__setattr__(self, "_nv", codec)
            return codec

        async def decode(self, chunks_and_specs):
            pairs = list(chunks_and_specs)
            present = [i for i, (b, _) in enumerate(pairs) if b is not None]
            frames = nvcomp.as_arrays([cp.asarray(pairs[i][0].as_array_like()) for i in present])
            decoded = self._nvcomp().decode(frames) if present else []
            event = cp.cuda.Event()
            event.record()
            await asyncio.to_thread(event.synchronize)
            out = [None] * len(pairs)
            for i, d in zip(present, decoded):
                out[i] = pairs[i][1].prototype.buffer.from_array_like(cp.asarray(d).view(cp.uint8))
            return out

    register_codec("zstd", NvcompZstd)
    _NVCOMP_ZSTD = f"{NvcompZstd.__module__}.{NvcompZstd.__qualname__}"
    return _NVCOMP_ZSTD


def tensorstore_load(path, ranges, xp):
    """tensorstore's read to host memory, then one copy to the device."""
    import tensorstore as ts
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": os.path.abspath(path)}},
                    read=True, context=ts.Context({"data_copy_concurrency": {"limit": os.cpu_count()},
                                                   "file_io_concurrency": {"limit": 64}})).result()
    host = store[tuple(slice(a, b) for a, b in ranges)].read().result()
    return xp.asarray(host)


def make_loader(peer, xp):
    if peer == "kvikio":
        if xp is np:  # --dry-host: plain file reads into numpy buffers
            return lambda p, r: load_chunks(p, r, xp, host_read)
        import kvikio

        def kvikio_read(fname, buf):
            with kvikio.CuFile(fname, "r") as f:
                return f.pread(buf).get()
        return lambda p, r: load_chunks(p, r, xp, kvikio_read)
    if peer == "zarr-gpu":
        if xp is np:
            raise RuntimeError("zarr-gpu needs cupy (not available with --dry-host)")
        return lambda p, r: zarr_load(p, r, xp, gpu=True)
    if peer == "zarr-gpu-nvcomp":
        if xp is np:
            raise RuntimeError("zarr-gpu-nvcomp needs cupy (not available with --dry-host)")
        import zarr
        zarr.config.set({"codecs.zstd": nvcomp_zstd_codec()})
        return lambda p, r: zarr_load(p, r, xp, gpu=True)
    if peer == "zarr-host":
        return lambda p, r: zarr_load(p, r, xp, gpu=False)
    if peer == "tensorstore":
        return lambda p, r: tensorstore_load(p, r, xp)
    if peer == "zarr-gpu-zarrs":
        # zarr-python's own code under enable_gpu(), with this project's codec pipeline
        # (zarrs_gpu.gpu_zarr_context): the drop-in route for existing zarr-python programs.
        if xp is np:
            raise RuntimeError("zarr-gpu-zarrs reads to the GPU (not available with --dry-host)")
        import zarrs_gpu

        def zarr_gpu_zarrs_load(p, r):
            # Scoped, so that the peers measured after this one in the process are unchanged.
            with zarrs_gpu.gpu_zarr_context():
                return zarr_load(p, r, xp, gpu=True)
        return zarr_gpu_zarrs_load
    if peer == "zarrs-gpu-python":
        # This project's Python package: the array opened once (its shard indexes kept, as the
        # Rust benchmark keeps them), each read a numpy-style index, taken by cupy without a copy.
        if xp is np:
            raise RuntimeError("zarrs-gpu-python reads to the GPU (not available with --dry-host)")
        import zarrs_gpu
        opened = {}

        def zarrs_gpu_load(p, r):
            array = opened.setdefault(p, zarrs_gpu.open(p))
            return xp.asarray(array[tuple(slice(a, b) for a, b in r)])
        return zarrs_gpu_load
    raise ValueError(f"unknown peer {peer!r}")


def configure_zarr(batch_size=None):
    import zarr
    # zarr 3.1.x defaults to async.concurrency = 10; raise it for a fair comparison
    # with the Rust reader, which reads many chunks concurrently.
    if zarr.config.get("async.concurrency", None) is None:
        print("warning: zarr config has no 'async.concurrency' key", file=sys.stderr)
    zarr.config.set({"async.concurrency": 64})
    if batch_size:
        # How many chunks zarr's codec pipeline hands a codec at once (1 as shipped: one nvCOMP
        # call per chunk on the GPU path).
        zarr.config.set({"codec_pipeline.batch_size": batch_size})


def zarr_gpu_codecs():
    """The zstd codec and batch size zarr-python uses under enable_gpu(), for the record."""
    import zarr
    with zarr.config.enable_gpu():
        return {"zstd_codec": str(zarr.config.get("codecs.zstd", None)),
                "batch_size": zarr.config.get("codec_pipeline.batch_size", None)}


# ---------------------------------------------------------------- benchmark
def sync(xp):
    if xp is not np:
        xp.cuda.Device().synchronize()


def nvcomp_ceiling(path, ranges, repeat, xp):
    """nvCOMP's Python API decoding the chunks meeting the subset, already on the device: the
    decode ceiling (no I/O, no placement). Bytes are the decoded bytes."""
    from nvidia import nvcomp
    m = read_meta(path)
    cs = m["chunk_shape"]
    grid = [range(a // c, (b - 1) // c + 1) for (a, b), c in zip(ranges, cs)]
    frames = []
    for idx in itertools.product(*grid):
        fname = os.path.join(path, *chunk_key(m["key"], idx).split("/"))
        if os.path.exists(fname):
            with open(fname, "rb") as f:
                frames.append(xp.asarray(np.frombuffer(f.read(), dtype=np.uint8)))
    frames = nvcomp.as_arrays(frames)  # the batch form decode() takes
    codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW)
    try:
        decoded = codec.decode(frames)  # warm-up
    except TypeError as e:  # keep the signatures pybind lists, not the thousands of arguments
        raise RuntimeError(str(e).split("Invoked with")[0]) from None
    sync(xp)
    nbytes = sum(int(d.buffer_size) for d in decoded)
    runs = []
    for _ in range(repeat):
        decoded = None
        t0 = time.perf_counter()
        decoded = codec.decode(frames)
        sync(xp)
        runs.append(time.perf_counter() - t0)
    secs = statistics.median(runs)
    return {"peer": "nvcomp-ceiling", "case": os.path.basename(os.path.normpath(path)) + " " + format_subset(ranges),
            "bytes": nbytes, "chunks": len(frames), "seconds": secs, "gib_s": nbytes / 2**30 / secs, "runs": runs}


def bench_peer(peer, path, ranges, repeat, xp):
    if peer == "nvcomp-ceiling":
        return nvcomp_ceiling(path, ranges, repeat, xp)
    load = make_loader(peer, xp)
    out = load(path, ranges)  # warm-up (also warms the page cache)
    sync(xp)
    runs = []
    for _ in range(repeat):
        out = None
        t0 = time.perf_counter()
        out = load(path, ranges)
        sync(xp)
        runs.append(time.perf_counter() - t0)
    secs = statistics.median(runs)
    res = {"peer": peer, "case": os.path.basename(os.path.normpath(path)) + " " + format_subset(ranges),
           "subset": format_subset(ranges), "shape": list(out.shape),
           "bytes": int(out.nbytes), "seconds": secs,
           "gib_s": out.nbytes / 2**30 / secs if secs > 0 else None,
           "checksum": float(xp.sum(out.astype(xp.float64))), "runs": runs}
    del out
    if xp is not np:
        xp.get_default_memory_pool().free_all_blocks()
    return res


def run(args):
    if args.dry_host:
        xp = np
    else:
        import cupy as xp
    try:
        configure_zarr(args.batch_size)
    except ImportError as e:  # the zarr peers will report the error themselves
        print(f"warning: zarr unavailable: {e}", file=sys.stderr)
    ranges = parse_subset(args.subset, read_meta(args.array)["shape"])
    for peer in [p.strip() for p in args.peers.split(",") if p.strip()]:
        try:
            res = bench_peer(peer, args.array, ranges, args.repeat, xp)
            if peer.startswith("zarr-gpu"):
                res.update(zarr_gpu_codecs())
        except NotImplementedError as e:
            res = {"peer": peer, "skipped": str(e)}
        except Exception as e:  # noqa: BLE001 - report and go on with the next peer
            text = f"{type(e).__name__}: {e}"
            res = {"peer": peer, "error": text if len(text) <= 600 else text[:300] + " ... " + text[-300:]}
        emit(res, args.json)
        if xp is not np:
            xp.get_default_memory_pool().free_all_blocks()


# ---------------------------------------------------------------- self-test
def self_test():
    """Host-only check: chunk assembly (edge + missing chunks) vs zarr, subset parsing."""
    import shutil
    import tempfile
    import zarr

    assert parse_subset("0:64,:,:", (100, 5, 6)) == [(0, 64), (0, 5), (0, 6)]
    assert parse_subset("", (3, 4)) == [(0, 3), (0, 4)]
    assert parse_subset("2:", (10, 4)) == [(2, 10), (0, 4)]
    assert parse_subset(":-2, 1:3", (10, 4)) == [(0, 8), (1, 3)]
    assert parse_subset("5:2", (10,)) == [(5, 5)] and format_subset([(0, 3)]) == "0:3"
    f4 = np.dtype("<f4")
    assert np.isnan(parse_fill_value("NaN", f4)) and parse_fill_value("0x3f800000", f4) == 1.0
    configure_zarr()
    tmp = tempfile.mkdtemp(prefix="peers-selftest-")
    ok = 0
    try:
        for name, dt, enc, fill in [("a", "float32", "/", 7.0), ("b", "uint16", ".", 3),
                                    ("c", "int64", "/", 0)]:
            p = os.path.join(tmp, name)
            kw = {"chunk_key_encoding": {"name": "default", "separator": enc}}
            z = zarr.create_array(p, shape=(10, 7, 5), chunks=(4, 3, 2), dtype=dt,
                                  fill_value=fill, compressors=None, filters=None, **kw)
            data = (np.arange(z.size) % 1000).reshape(z.shape).astype(dt)
            z[...] = data
            # delete one written chunk file -> must read back as fill value
            os.remove(os.path.join(p, *chunk_key(("default", enc), (1, 1, 0)).split("/")))
            assert read_meta(p)["fill"] == fill
            for sub in ["", "0:64,:,:", "3:9,2:7,1:4", "8:10,6:7,4:5", "4:8,3:6,0:2", "5:5,:,:"]:
                r = parse_subset(sub, z.shape)
                got = load_chunks(p, r, np, host_read)
                want = zarr_load(p, r, np, gpu=False)
                assert got.dtype == want.dtype and got.shape == want.shape, (sub, got.shape)
                assert np.array_equal(got, want), f"mismatch for {name} {sub!r}"
                ok += 1
            res = bench_peer("kvikio", p, parse_subset("", z.shape), 2, np)
            ref = bench_peer("zarr-host", p, parse_subset("", z.shape), 2, np)
            assert res["checksum"] == ref["checksum"] and res["bytes"] == ref["bytes"]
            ok += 1
        p = os.path.join(tmp, "zstd")
        zarr.create_array(p, shape=(4,), chunks=(2,), dtype="int8")[...] = 1
        try:
            load_chunks(p, [(0, 4)], np, host_read)
            raise AssertionError("compressed array should be refused")
        except NotImplementedError:
            ok += 1
    finally:
        shutil.rmtree(tmp)
    print(f"self-test: {ok} passed, 0 failed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--array", help="Zarr v3 array directory (has zarr.json)")
    ap.add_argument("--subset", default="", help='numpy-style slices, e.g. "0:64,:,:"')
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--batch-size", type=int, default=None,
                    help="zarr-python codec_pipeline.batch_size (default: as shipped)")
    ap.add_argument("--dry-host", action="store_true", help="numpy instead of cupy (no GPU)")
    args = parse_args(ap, self_test)
    if args is None:
        return 0
    run(args)


if __name__ == "__main__":
    main()
