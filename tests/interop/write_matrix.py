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


def write_partial(arr, values):
    """Write all but the last chunk row along the first axis' first chunk: some chunks stay
    missing (fill value)."""
    arr[CHUNKS[0]:] = values[CHUNKS[0]:]
    arr[: CHUNKS[0], : CHUNKS[1]] = values[: CHUNKS[0], : CHUNKS[1]]


def main(out):
    os.makedirs(out, exist_ok=True)
    cases = []

    def add(name, zarr_format, dtype, make, blank=None):
        """`blank`: a region written with the fill value (inner chunks zarr leaves out)."""
        path = os.path.join(out, name)
        values = data(dtype, SHAPE, len(cases) + 1)
        if blank is not None:
            values[blank] = fill_for(dtype)
        arr = make(path, dtype)
        write_partial(arr, values)
        back = zarr.open_array(path, mode="r")[...]
        written = getattr(arr, "tensorstore_read", None)
        if written is not None:  # another writer: zarr-python must read what it wrote
            assert np.array_equal(back, written(), equal_nan=True), f"{name}: zarr-python and the writer disagree"
        back = np.ascontiguousarray(back.astype(back.dtype.newbyteorder("=")))
        np.save(os.path.join(out, name + ".npy"), back)
        cases.append({"name": name, "path": name, "zarr_format": zarr_format, "dtype": back.dtype.str,
                      "shape": list(back.shape), "expected": name + ".npy"})

    def v3(compressors=None, filters=None, serializer="auto", chunks=CHUNKS, shards=None):
        def make(path, dtype):
            return zarr.create_array(path, shape=SHAPE, chunks=chunks, shards=shards, dtype=dtype,
                                     fill_value=fill_for(dtype), compressors=compressors, filters=filters,
                                     serializer=serializer, zarr_format=3, overwrite=True)
        return make

    def v2(compressor=None, filters=None, order="C", endian="<"):
        def make(path, dtype):
            dt = np.dtype(dtype)
            if dt.itemsize > 1 and dt.kind != "b":
                dt = dt.newbyteorder(endian)
            return zarr.create_array(path, shape=SHAPE, chunks=CHUNKS, dtype=dt, fill_value=fill_for(dtype),
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
