#!/usr/bin/env python3
"""Write a matrix of small Zarr arrays with zarr-python (v2 and v3, many codecs and data types)
and, when it is installed, tensorstore, and what zarr-python reads back from each, for the
project's interoperability tests.

    python3 tests/interop/write_matrix.py OUT_DIR

OUT_DIR/manifest.json lists the cases: {"name", "path" (the array, relative to OUT_DIR),
"zarr_format", "dtype" (numpy, native byte order), "shape", "expected" (a .npy file of zarr-python's
read of the whole array, C order, native byte order)}. Arrays have partial edge chunks and chunks
never written (fill value).
"""
import json
import os
import sys

import numpy as np
import zarr
import zarr.codecs as zc
import numcodecs
from numcodecs import Blosc, blosc

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
SHAPE = (19, 23, 10)
CHUNKS = (8, 8, 4)


def data(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    # smooth plus noise, rounded: compressible like real data
    base = np.fromfunction(lambda z, y, x: np.sin(x * 0.3) * 50 + y + z * 2, shape)
    return np.round(base + rng.integers(0, 4, shape)).astype(dt)


def fill_for(dtype):
    dt = np.dtype(dtype)
    return {"b": True, "i": -7, "u": 9, "f": 1.5, "c": 0.5 - 2j}[dt.kind]


def ramps(dtype, shape, seed, chunks):
    """Smooth ramps plus a little noise (compressible, like real data, but varied), with a band
    of noise across three quarters of the second chunk column (along the second axis): there some
    blocks, or some byte planes of a shuffled block, do not compress, and Blosc stores those
    streams (or the whole chunk) as they are."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    i = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    x = np.clip(np.sin(i / 5000.0) * 0.4 + (i % 1531) / 1531 * 0.6 + rng.normal(0, 0.003, shape), -0.4, 1.0)
    c = chunks[1]
    band = (slice(None), slice(c, c + 3 * c // 4))
    if dt == np.bool_:
        out = x > 0.3
        out[band] = rng.integers(0, 2, out[band].shape).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        amplitude = {1: 100, 2: 20000}.get(dt.itemsize, 1_000_000) * (2 if dt.kind == "u" else 1)
        out = np.round((x + 0.4) / 1.4 * amplitude if dt.kind == "u" else x * amplitude).astype(dt)
        out[band] = rng.integers(info.min, info.max, out[band].shape, endpoint=True, dtype=dt)
    elif dt.kind == "c":
        out = (x * 100 + 1j * (1 - x) * 50).astype(dt)
        out[band] = rng.uniform(-1e6, 1e6, out[band].shape) + 1j * rng.uniform(-1e6, 1e6, out[band].shape)
    else:
        out = (x * 100).astype(dt)
        bound = 1e3 if dt.itemsize == 2 else 1e6
        out[band] = rng.uniform(-bound, bound, out[band].shape)
    return out


def write_partial(arr, values, chunks=CHUNKS):
    """Write all but the last chunk row along the first axis' first chunk: some chunks stay
    missing (fill value)."""
    arr[chunks[0]:] = values[chunks[0]:]
    arr[: chunks[0], : chunks[1]] = values[: chunks[0], : chunks[1]]


def main(out):
    os.makedirs(out, exist_ok=True)
    cases = []

    def add(name, zarr_format, dtype, make, blank=None, shape=SHAPE, chunks=CHUNKS, values=None):
        """`blank`: a region written with the fill value (inner chunks zarr leaves out); `shape`
        and `chunks` those `make` was given; `values(dtype, shape, seed)`: the data, else `data`'s."""
        assert all(c["name"] != name for c in cases), f"{name}: a second case of that name"
        path = os.path.join(out, name)
        values = (values or data)(dtype, shape, len(cases) + 1)
        if blank is not None:
            values[blank] = fill_for(dtype)
        arr = make(path, dtype)
        write_partial(arr, values, chunks)
        back = zarr.open_array(path, mode="r")[...]
        written = getattr(arr, "tensorstore_read", None)
        if written is not None:  # another writer: zarr-python must read what it wrote
            assert np.array_equal(back, written(), equal_nan=True), f"{name}: zarr-python and the writer disagree"
        back = np.ascontiguousarray(back.astype(back.dtype.newbyteorder("=")))
        np.save(os.path.join(out, name + ".npy"), back)
        cases.append({"name": name, "path": name, "zarr_format": zarr_format, "dtype": back.dtype.str,
                      "shape": list(back.shape), "expected": name + ".npy"})

    def v3(compressors=None, filters=None, serializer="auto", chunks=CHUNKS, shards=None, shape=SHAPE):
        def make(path, dtype):
            return zarr.create_array(path, shape=shape, chunks=chunks, shards=shards, dtype=dtype,
                                     fill_value=fill_for(dtype), compressors=compressors, filters=filters,
                                     serializer=serializer, zarr_format=3, overwrite=True)
        return make

    def v2(compressor=None, filters=None, order="C", endian="<", shape=SHAPE, chunks=CHUNKS):
        def make(path, dtype):
            dt = np.dtype(dtype)
            if dt.itemsize > 1 and dt.kind != "b":
                dt = dt.newbyteorder(endian)
            return zarr.create_array(path, shape=shape, chunks=chunks, dtype=dt, fill_value=fill_for(dtype),
                                     compressors=compressor, filters=filters, order=order, zarr_format=2,
                                     overwrite=True)
        return make

    for dtype in DTYPES:
        add(f"v3_raw_{dtype}", 3, dtype, v3())
        add(f"v3_zstd_{dtype}", 3, dtype, v3(compressors=[zc.ZstdCodec(level=3)]))
        add(f"v2_raw_{dtype}", 2, dtype, v2())
        add(f"v2_zstd_{dtype}", 2, dtype, v2(compressor=numcodecs.Zstd(level=3)))
    for level in (1, 19):
        add(f"v3_zstd{level}_float32", 3, "float32", v3(compressors=[zc.ZstdCodec(level=level)]))
    add("v3_zstd_checksum_float32", 3, "float32", v3(compressors=[zc.ZstdCodec(level=3, checksum=True)]))
    add("v3_zstd_crc32c_float32", 3, "float32", v3(compressors=[zc.ZstdCodec(level=3), zc.Crc32cCodec()]))
    add("v3_crc32c_int16", 3, "int16", v3(compressors=[zc.Crc32cCodec()]))
    add("v3_gzip_float64", 3, "float64", v3(compressors=[zc.GzipCodec(level=5)]))
    add("v3_blosc_float32", 3, "float32", v3(compressors=[zc.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]))
    add("v3_transpose_uint16", 3, "uint16", v3(filters=[zc.TransposeCodec(order=(2, 0, 1))]))
    add("v3_bigendian_int32", 3, "int32", v3(serializer=zc.BytesCodec(endian="big")))
    add("v3_bigendian_zstd_float64", 3, "float64",
        v3(serializer=zc.BytesCodec(endian="big"), compressors=[zc.ZstdCodec(level=3)]))
    add("v3_sharded_zstd_float32", 3, "float32", v3(compressors=[zc.ZstdCodec(level=3)], chunks=(4, 4, 2), shards=CHUNKS))
    # Shards with their index at the start, and missing inner chunks (written as fill values).
    blank = (slice(8, 12), slice(0, 4), slice(0, 2))
    add("v3_sharded_start_crc32c_int16", 3, "int16",
        v3(serializer=zc.ShardingCodec(chunk_shape=(4, 4, 2), codecs=[zc.BytesCodec(), zc.Crc32cCodec()],
                                       index_location="start"), chunks=CHUNKS), blank=blank)
    add("v3_sharded_end_zstd_missing_float64", 3, "float64",
        v3(compressors=[zc.ZstdCodec(level=3)], chunks=(4, 4, 2), shards=CHUNKS), blank=blank)
    add("v3_sharded_gzip_uint32", 3, "uint32", v3(compressors=[zc.GzipCodec(level=3)], chunks=(4, 4, 2), shards=CHUNKS))
    add("v2_blosc_float32", 2, "float32", v2(compressor=numcodecs.Blosc(cname="zstd", clevel=3)))
    add("v2_zlib_int32", 2, "int32", v2(compressor=numcodecs.Zlib(level=4)))
    add("v2_gzip_uint8", 2, "uint8", v2(compressor=numcodecs.GZip(level=4)))
    add("v2_order_f_float32", 2, "float32", v2(order="F"))
    add("v2_order_f_zstd_int64", 2, "int64", v2(compressor=numcodecs.Zstd(level=3), order="F"))
    add("v2_bigendian_zstd_float32", 2, "float32", v2(compressor=numcodecs.Zstd(level=3), endian=">"))
    delta_cases(add, v2, v3)
    blosc_cases(add, v2, v3)
    writers = f"zarr-python {zarr.__version__}, numcodecs {numcodecs.__version__}"
    try:
        import tensorstore as ts
    except ImportError:
        ts = None
    if ts is not None:
        from importlib.metadata import version
        writers += ", tensorstore " + version("tensorstore")
        tensorstore_cases(add, ts)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"writer": writers,
                   "cases": cases}, f, indent=1)
    print(f"wrote {len(cases)} arrays to {out}")


def delta_cases(add, v2, v3):
    """numcodecs' Delta filter (v2 filter `delta`, v3 `numcodecs.delta` through numcodecs.zarr3) on
    every integer and float data type, with zstd; then uncompressed, sharded, big-endian (v2) and
    with an astype narrower or wider than the dtype (names `delta_astype_`: decoded on the host)."""
    from numcodecs.zarr3 import Delta as DeltaV3
    zstd_v3 = [zc.ZstdCodec(level=3)]
    for dtype in [d for d in DTYPES if np.dtype(d).kind in "iuf"]:
        little = np.dtype(dtype).newbyteorder("<").str
        add(f"v2_delta_zstd_{dtype}", 2, dtype,
            v2(compressor=numcodecs.Zstd(level=3), filters=[numcodecs.Delta(dtype=little)]))
        add(f"v3_delta_zstd_{dtype}", 3, dtype, v3(compressors=zstd_v3, filters=[DeltaV3(dtype=dtype)]))
    add("v3_delta_raw_uint16", 3, "uint16", v3(filters=[DeltaV3(dtype="uint16")]))
    add("v3_delta_raw_float32", 3, "float32", v3(filters=[DeltaV3(dtype="float32")]))
    add("v3_sharded_delta_zstd_int32", 3, "int32",
        v3(compressors=zstd_v3, filters=[DeltaV3(dtype="int32")], chunks=(4, 4, 2), shards=CHUNKS))
    add("v2_delta_bigendian_zstd_int32", 2, "int32",
        v2(compressor=numcodecs.Zstd(level=3), filters=[numcodecs.Delta(dtype=">i4")], endian=">"))
    add("v2_delta_bigendian_float64", 2, "float64", v2(filters=[numcodecs.Delta(dtype=">f8")], endian=">"))
    # The data's differences fit int16 (values within +-1000): the narrowing round-trips.
    add("v2_delta_astype_int32_int16", 2, "int32",
        v2(compressor=numcodecs.Zstd(level=3), filters=[numcodecs.Delta(dtype="<i4", astype="<i2")]))
    add("v3_delta_astype_int16_int64", 3, "int16",
        v3(compressors=zstd_v3, filters=[DeltaV3(dtype="<i2", astype="<i8")]))
    add("v3_delta_astype_float32_float64", 3, "float32",
        v3(compressors=zstd_v3, filters=[DeltaV3(dtype="<f4", astype="<f8")]))


def blosc_cases(add, v2, v3):
    """Blosc (c-blosc 1.x chunks), written by numcodecs' Blosc as the zarr v2 compressor and by
    zarr-python's BloscCodec in v3: every compressor numcodecs' Blosc has, every shuffle,
    typesizes 1, 2, 4 and 8 (and typesizes other than the data type's), blocks chosen by c-blosc
    or set (4096 and 65536 bytes, and smaller), chunks of a single block and of many (a short last
    block; split into one stream per byte of the typesize, or not), streams stored as they are,
    partial edge chunks and missing chunks. Names: format, cname, shuffle, data type, then what
    differs from c-blosc's choice (a set typesize or blocksize, large chunks)."""
    cnames = blosc.list_compressors()  # blosclz, lz4, lz4hc, zlib, zstd (and snappy if built in)
    shuffles = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
    typed = {2: {1: "uint8", 2: "int16", 4: "float32", 8: "float64"},
             3: {1: "int8", 2: "float16", 4: "uint32", 8: "int64"}}

    def case(fmt, cname, shuffle, dtype, shape, chunks, clevel=5, blocksize=0, typesize=None, tail=""):
        name = f"v{fmt}_blosc_{cname}_{shuffle}_{dtype}{tail}"
        if fmt == 2:
            make = v2(compressor=Blosc(cname=cname, clevel=clevel, shuffle=shuffles[shuffle], blocksize=blocksize,
                                       typesize=typesize), shape=shape, chunks=chunks)
        else:
            make = v3(compressors=[zc.BloscCodec(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize,
                                                 typesize=typesize)], shape=shape, chunks=chunks)
        add(name, fmt, dtype, make, shape=shape, chunks=chunks,
            values=lambda dtype, shape, seed: ramps(dtype, shape, seed, chunks))

    # Every format, compressor and shuffle, the typesize turning over so that each compressor
    # meets every typesize and each shuffle every typesize: chunks of 7544 elements (7.4 to 59
    # KiB, one block), a 3 x 3 grid with partial edge chunks and two chunks missing.
    for fmt, turn in ((2, 0), (3, 2)):
        for c, cname in enumerate(cnames):
            for s, shuffle in enumerate(shuffles):
                dtype = typed[fmt][(1, 2, 4, 8)[(c + s + turn) % 4]]
                case(fmt, cname, shuffle, dtype, (60, 90, 8), (23, 41, 8))
    # Chunks of 320 000 bytes (a 2 x 2 grid): several blocks of c-blosc's choosing (it enlarges
    # those of split compressors), the last one short, at clevels 1, 5 and 9.
    for c, cname in enumerate(cnames):
        for fmt, dtype in ((2, ("float64", "float32", "uint16", "int32", "complex64")[c]),
                           (3, ("float32", "int64", "int8", "uint32", "float16")[c])):
            chunks = (32 // np.dtype(dtype).itemsize, 100, 100)
            shuffle = list(shuffles)[(c + fmt) % 3]
            case(fmt, cname, shuffle, dtype, (chunks[0] + 2, 120, 100), chunks,
                 clevel=(1, 5, 9)[(c + fmt) % 3], tail="_large")
    # Block sizes set, over chunks of 44585 elements (44 to 348 KiB), the last block short. A
    # size is the metadata's: c-blosc keeps 4096 for zstd (which it never splits) but enlarges
    # the blocks of split compressors to 64 KiB or to 4096 x typesize at least; it keeps sizes
    # too small to split (under 128 x typesize: 128, 512, 1000, bit shuffled blocks of 125
    # elements, which it stores unshuffled), hundreds of blocks a chunk.
    for c, cname in enumerate(cnames):
        for b, blocksize in enumerate((4096, 65536)):
            fmt = 2 + (c + b) % 2
            dtype = ("int16", "float32", "uint64", "bool", "float64", "int32")[(c + b) % 6]
            shuffle = list(shuffles)[(c + 2 * b) % 3]
            case(fmt, cname, shuffle, dtype, (6, 40, 260), (5, 37, 241), blocksize=blocksize, tail=f"_block{blocksize}")
    for fmt, cname, shuffle, dtype, blocksize in ((2, "lz4", "shuffle", "float64", 512),
                                                   (3, "blosclz", "bitshuffle", "int16", 128),
                                                   (3, "lz4hc", "bitshuffle", "uint64", 1000)):
        case(fmt, cname, shuffle, dtype, (6, 40, 260), (5, 37, 241), blocksize=blocksize, tail=f"_block{blocksize}")
    # A typesize other than the data type's (v3 records it; in v2 only the chunks do): odd ones,
    # and 24, above the 16 up to which c-blosc splits blocks into streams.
    for fmt, cname, shuffle, dtype, typesize in ((3, "lz4", "shuffle", "float32", 3),
                                                  (3, "zstd", "bitshuffle", "int16", 5),
                                                  (3, "lz4hc", "shuffle", "float64", 6),
                                                  (3, "zlib", "bitshuffle", "uint8", 7),
                                                  (3, "blosclz", "shuffle", "int32", 3),
                                                  (3, "lz4", "bitshuffle", "uint16", 24),
                                                  (2, "lz4", "shuffle", "float64", 6)):
        case(fmt, cname, shuffle, dtype, (6, 40, 260), (5, 37, 241), typesize=typesize, tail=f"_typesize{typesize}")


class TensorstoreArray:
    """A tensorstore array that takes numpy-style writes, and reads back what it holds."""

    def __init__(self, store):
        self.store = store

    def __setitem__(self, sel, values):
        self.store[sel].write(values).result()

    def tensorstore_read(self):
        return self.store.read().result()


def tensorstore_cases(add, ts):
    """Arrays written by tensorstore: zarr3 (zstd, gzip, blosc, sharded with the index at either
    end, crc32c) and zarr v2 (zstd, blosc), with partial edge chunks and missing chunks."""
    def zarr3(codecs, chunks=CHUNKS):
        def make(path, dtype):
            spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": path},
                    "metadata": {"shape": list(SHAPE), "data_type": np.dtype(dtype).name,
                                 "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
                                 "chunk_key_encoding": {"name": "default"},
                                 "fill_value": fill_for(dtype), "codecs": codecs}}
            return TensorstoreArray(ts.open(spec, create=True, delete_existing=True).result())
        return make

    def zarr2(compressor):
        def make(path, dtype):
            spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": path},
                    "metadata": {"shape": list(SHAPE), "chunks": list(CHUNKS), "dtype": np.dtype(dtype).str,
                                 "fill_value": fill_for(dtype), "compressor": compressor, "order": "C"}}
            return TensorstoreArray(ts.open(spec, create=True, delete_existing=True).result())
        return make

    def sharded(inner_codecs, location):
        return [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [4, 4, 2], "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}] + inner_codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": location}}]

    little = [{"name": "bytes", "configuration": {"endian": "little"}}]
    zstd = {"name": "zstd", "configuration": {"level": 3, "checksum": False}}
    blank = (slice(8, 12), slice(0, 4), slice(0, 2))
    add("ts_v3_zstd_float32", 3, "float32", zarr3(little + [zstd]))
    add("ts_v3_zstd_crc32c_int64", 3, "int64", zarr3(little + [zstd, {"name": "crc32c"}]))
    add("ts_v3_gzip_uint16", 3, "uint16", zarr3(little + [{"name": "gzip", "configuration": {"level": 5}}]))
    add("ts_v3_blosc_float64", 3, "float64", zarr3(little + [{"name": "blosc", "configuration": {
        "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 8, "blocksize": 0}}]))
    add("ts_v3_sharded_end_zstd_float32", 3, "float32", zarr3(sharded([zstd], "end")), blank=blank)
    add("ts_v3_sharded_start_crc32c_int32", 3, "int32", zarr3(sharded([{"name": "crc32c"}], "start")), blank=blank)
    add("ts_v2_zstd_float32", 2, "float32", zarr2({"id": "zstd", "level": 3}))
    add("ts_v2_blosc_int16", 2, "int16", zarr2({"id": "blosc", "cname": "zstd", "clevel": 3, "shuffle": 1}))


if __name__ == "__main__":
    main(sys.argv[1])
