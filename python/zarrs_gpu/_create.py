"""``zarrs_gpu.create``: a new array's metadata written (v3, sharded or not, or v2), then the array
opened for writing. What zarr-python's ``create_array`` writes for the same arguments, so that
every Zarr reader opens it; zarrs checks the metadata when the array is opened (invalid metadata
is removed again and raised)."""
import json
import os
import shutil
import warnings
from typing import Any, Optional, Sequence, Union

#: A compressor: a name ("zstd", "gzip", "zlib", "blosc"), a v3 codec's JSON (``{"name": ...,
#: "configuration": {...}}``), or a zarr-python codec (anything with ``to_dict()``).
Compressor = Union[str, dict, Any]

_V3_TYPES = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
_ZARR_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs")


def _data_type(dtype) -> str:
    """The v3 data type name of a numpy dtype (fixed-size numbers and booleans)."""
    kind = _V3_TYPES.get(dtype.kind)
    if kind is None:
        raise TypeError(f"zarrs_gpu.create: dtype {dtype} is not a number or a boolean")
    return "bool" if kind == "bool" else f"{kind}{dtype.itemsize * 8}"


def _fill(dtype, fill_value: Any) -> Any:
    """A fill value as JSON, in the dtype (NaN and infinities as v3 and v2 spell them)."""
    import numpy as np

    refused = ValueError(f"zarrs_gpu.create: fill_value {fill_value!r} is not a value of dtype {dtype}")
    try:
        given = np.asarray(fill_value if fill_value is not None else 0)
        # Casts that lose something are refused below, not warned about.
        with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = given.astype(dtype)[()]
    except (OverflowError, TypeError, ValueError) as err:
        raise refused from err
    # A cast that changes the value would store another fill value: an integer out of range or a
    # fraction, a finite number that overflows to infinity, an imaginary part dropped.
    if given.dtype.kind not in "biufc":
        raise refused
    if dtype.kind in "biu" and value != given[()]:
        raise refused
    if dtype.kind in "fc" and np.all(np.isfinite(given)) and not np.all(np.isfinite(value)):
        raise refused
    if dtype.kind != "c" and given.dtype.kind == "c" and given[()].imag != 0:
        raise refused
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)

    def real(x):
        x = float(x)
        if np.isnan(x):
            return "NaN"
        if np.isinf(x):
            return "Infinity" if x > 0 else "-Infinity"
        return x

    if dtype.kind == "c":
        return [real(value.real), real(value.imag)]
    return real(value)


_DEFAULT_LEVELS = {"zstd": 0, "gzip": 5, "zlib": 1}


def _v3_codec(compressor: Compressor, itemsize: int) -> dict:
    """A bytes-to-bytes codec's v3 JSON."""
    if hasattr(compressor, "to_dict"):
        compressor = _evolved(compressor, itemsize)
    if isinstance(compressor, dict):
        return compressor
    if compressor == "zstd":
        return {"name": "zstd", "configuration": {"level": 0, "checksum": False}}
    if compressor == "gzip":
        return {"name": "gzip", "configuration": {"level": 5}}
    if compressor == "zlib":
        return {"name": "numcodecs.zlib", "configuration": {"level": 1}}
    if compressor == "blosc":
        return {"name": "blosc", "configuration": {"cname": "zstd", "clevel": 5, "shuffle": "shuffle",
                                                   "typesize": itemsize, "blocksize": 0}}
    if compressor == "crc32c":
        return {"name": "crc32c"}
    raise ValueError(f"zarrs_gpu.create: compressor {compressor!r}: a name (zstd, gzip, zlib, blosc, crc32c), "
                     "a v3 codec's JSON, or a zarr-python codec")


def _evolved(codec: Any, itemsize: int) -> dict:
    """A zarr-python codec's JSON for an array of `itemsize`-byte elements: what zarr-python's
    ``evolve_from_array_spec`` sets for Blosc (typesize and shuffle left unset are the element
    size, and bit-shuffle for bytes, shuffle otherwise)."""
    value = codec.to_dict()
    unset = getattr(codec, "_tunable_attrs", set())
    if value.get("name") == "blosc":
        config = dict(value.get("configuration", {}))
        if "typesize" in unset or config.get("typesize") is None:
            config["typesize"] = itemsize
        if "shuffle" in unset or config.get("shuffle") is None:
            config["shuffle"] = "bitshuffle" if itemsize == 1 else "shuffle"
        value = {**value, "configuration": config}
    return value


def _v2_compressor(compressor: Compressor, itemsize: int) -> Optional[dict]:
    """A numcodecs compressor's JSON (v2 arrays take one)."""
    if compressor is None:
        return None
    if hasattr(compressor, "get_config"):  # a numcodecs codec
        return compressor.get_config()
    if isinstance(compressor, dict):
        if "id" in compressor:
            return compressor
        raise ValueError(f"zarrs_gpu.create: a v2 array's compressor is numcodecs' JSON ({{'id': ...}}), not {compressor!r}")
    if compressor in _DEFAULT_LEVELS:
        return {"id": compressor, "level": _DEFAULT_LEVELS[compressor]}
    if compressor == "blosc":
        return {"id": "blosc", "cname": "zstd", "clevel": 5, "shuffle": 1, "blocksize": 0}
    raise ValueError(f"zarrs_gpu.create: compressor {compressor!r} for a v2 array: zstd, gzip, zlib, blosc, "
                     "numcodecs' JSON or a numcodecs codec")


def _metadata(shape, chunks, dtype, compressors, fill_value, shards, zarr_format, dimension_names):
    """The array's metadata: (file name, JSON) of its format."""
    shape, chunks = [int(n) for n in shape], [int(n) for n in chunks]
    if len(chunks) != len(shape) or any(n < 1 for n in chunks) or any(n < 0 for n in shape):
        raise ValueError(f"zarrs_gpu.create: chunks {chunks} do not fit shape {shape}")
    listed = [] if compressors is None else (
        list(compressors) if isinstance(compressors, (list, tuple)) else [compressors])
    if zarr_format == 2:
        if shards is not None:
            raise ValueError("zarrs_gpu.create: v2 arrays have no shards")
        if len(listed) > 1:
            raise ValueError("zarrs_gpu.create: a v2 array takes one compressor")
        return ".zarray", {
            "zarr_format": 2, "shape": shape, "chunks": chunks, "dtype": dtype.str,
            "compressor": _v2_compressor(listed[0] if listed else None, dtype.itemsize),
            "fill_value": _fill(dtype, fill_value), "order": "C", "filters": None, "dimension_separator": ".",
        }
    if zarr_format != 3:
        raise ValueError(f"zarrs_gpu.create: zarr_format {zarr_format}: 2 or 3")
    # The stored byte order: the dtype's own (big-endian where it says so).
    endian = "big" if dtype.byteorder == ">" else "little"
    codecs = [{"name": "bytes", "configuration": {"endian": endian}} if dtype.itemsize > 1 else {"name": "bytes"}]
    codecs += [_v3_codec(c, dtype.itemsize) for c in listed]
    grid = chunks
    if shards is not None:
        shards = [int(n) for n in shards]
        if len(shards) != len(shape) or any(s % c for s, c in zip(shards, chunks)):
            raise ValueError(f"zarrs_gpu.create: shards {shards} are not whole multiples of chunks {chunks}")
        grid = shards
        codecs = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": chunks, "codecs": codecs,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
            "index_location": "end"}}]
    metadata = {
        "zarr_format": 3, "node_type": "array", "shape": shape, "data_type": _data_type(dtype),
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": grid}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill(dtype, fill_value), "codecs": codecs, "attributes": {},
    }
    if dimension_names is not None:
        metadata["dimension_names"] = list(dimension_names)
    return "zarr.json", metadata


def create(store_path: Union[str, os.PathLike], array: str = "/", *, shape: Sequence[int], dtype: Any,
           chunks: Sequence[int], shards: Optional[Sequence[int]] = None,
           compressors: Union[None, Compressor, Sequence[Compressor]] = "zstd", fill_value: Any = 0,
           zarr_format: int = 3, dimension_names: Optional[Sequence[Optional[str]]] = None,
           overwrite: bool = False, device: int = 0):
    """Create the array `array` (a node path) in the directory store at `store_path` and open it
    for writing (``mode="r+"``) to GPU `device`; it holds the fill value until written.

    `dtype`'s byte order is the stored one (little-endian unless it says ``>``). `compressors`:
    None, or one or more of "zstd" (level 0, zarr-python's default), "gzip",
    "zlib", "blosc", "crc32c", v3 codec JSON dicts or zarr-python codecs (v2: one compressor, a
    name, numcodecs' JSON or a numcodecs codec). `shards`: the shard shape (v3; `chunks` are then
    the inner chunks, with a crc32c index at the end). Parent groups are created as needed. An
    existing node at the path is a FileExistsError unless `overwrite` (then it is removed first).
    """
    import numpy as np

    import zarrs_gpu

    dtype = np.dtype(dtype)
    name, metadata = _metadata(shape, chunks, dtype, compressors, fill_value, shards, zarr_format, dimension_names)
    root = os.fspath(store_path)
    parts = [p for p in array.strip("/").split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"zarrs_gpu.create: array {array!r}: a node path has no '.' or '..' parts")
    node = os.path.join(root, *parts)
    if any(os.path.exists(os.path.join(node, f)) for f in _ZARR_FILES):
        if not overwrite:
            raise FileExistsError(f"zarrs_gpu.create: {node} holds a Zarr node already (overwrite=True replaces it)")
        # The old node is removed only once zarrs has accepted the new metadata.
        _validate(name, metadata, device)
        shutil.rmtree(node)
    # Parent groups, as zarr-python writes them (a root group too).
    for depth in range(len(parts)):
        group = os.path.join(root, *parts[:depth])
        os.makedirs(group, exist_ok=True)
        if not any(os.path.exists(os.path.join(group, f)) for f in _ZARR_FILES):
            if zarr_format == 3:
                _write_json(os.path.join(group, "zarr.json"), {"zarr_format": 3, "node_type": "group", "attributes": {}})
            else:
                _write_json(os.path.join(group, ".zgroup"), {"zarr_format": 2})
    os.makedirs(node, exist_ok=True)
    path = os.path.join(node, name)
    _write_json(path, metadata)
    try:
        return zarrs_gpu.open(root, "/" + "/".join(parts), device=device, mode="r+")
    except Exception:
        # Metadata zarrs refuses is not left behind.
        os.remove(path)
        raise


def _validate(name: str, metadata: dict, device: int) -> None:
    """Raise what zarrs raises when opening an array of `metadata`, without touching the target."""
    import tempfile

    import zarrs_gpu

    with tempfile.TemporaryDirectory(prefix="zarrs_gpu_create_") as scratch:
        _write_json(os.path.join(scratch, name), metadata)
        zarrs_gpu.open(scratch, "/", device=device)


def _write_json(path, value):
    """`value` as JSON into `path`, replaced atomically (a temporary file, then a rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=2, allow_nan=False)
    os.replace(tmp, path)
