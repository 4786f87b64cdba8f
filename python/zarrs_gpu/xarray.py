"""An xarray backend whose reads are zarrs_gpu's: ``xr.open_dataset(store, engine="zarrs_gpu")``.

    import xarray as xr
    ds = xr.open_dataset("climate.zarr", engine="zarrs_gpu")              # lazy; reads on the GPU
    t = ds["t2m"].isel(time=0).data                                       # a CuPy array
    dsk = xr.open_dataset("climate.zarr", engine="zarrs_gpu", chunks={})  # Dask, blocks read on the GPU

The group's metadata (v2 ``.zgroup``/``.zarray``/``.zattrs`` or v3 ``zarr.json``, consolidated
metadata where present) is read with zarr-python (``zarr.open_group(store, mode="r")``), which
here only lists the arrays, their shapes, data types, attributes and dimension names
(``_ARRAY_DIMENSIONS`` for v2, ``dimension_names`` for v3); it reads no data. Data is read by
zarrs_gpu, lazily, one box per indexing (``ZarrsGpuBackendArray``), on GPU ``device`` (None:
the reading thread's current CUDA device).

CF decoding (``mask_and_scale``, ``decode_times``, ``decode_coords`` ...) is xarray's own
(``xarray.conventions.decode_cf_variables``), as for its zarr engine, with the same fill value
rule (v2: the array's ``fill_value`` is ``_FillValue``; v3: the ``_FillValue`` attribute). xarray
decodes on the host only (its decoders call ``np.asarray``), so for now:

* a data variable that decoding leaves alone (no fill value other than NaN, no
  ``scale_factor``/``add_offset``, no time units) stays on the device: its reads are CuPy arrays;
* a variable that decoding transforms is read on the device and copied to the host, where xarray
  decodes it (numpy results);
* coordinates (1-D arrays named like their dimension, and those named in ``coordinates``
  attributes) are copied to the host too: xarray's indexes are pandas'.

Decoding on the device is a later step. With ``chunks=`` xarray wraps each variable in a Dask
array whose blocks are these reads (CuPy blocks for device variables); xarray sets such arrays'
``meta`` to numpy's whatever their blocks are, so ``meta`` does not say CuPy there.

Tests read on the host by replacing ``zarrs_gpu.dask.reader`` (the one read function both
modules use, looked up at each read).
"""

import base64
import os
import struct
from typing import Any, Iterable, Optional

import numpy as np
from xarray.backends import BackendArray, BackendEntrypoint
from xarray.backends.common import AbstractDataStore
from xarray.core import indexing

__all__ = ["ZarrsGpuBackendArray", "ZarrsGpuBackendEntrypoint", "ZarrsGpuStore"]

DIMENSION_KEY = "_ARRAY_DIMENSIONS"


def _to_host(x: Any) -> np.ndarray:
    """``x`` as a numpy array: a CuPy array copied from the device, a numpy one as it is."""
    if isinstance(x, np.ndarray):
        return x
    get = getattr(x, "get", None)  # CuPy's copy to the host
    if callable(get) and type(x).__module__.startswith("cupy"):
        return get()
    return np.asarray(x)


def _box_and_rest(key: tuple, shape: tuple[int, ...]):
    """A basic key (integers and slices, any step) as the box to read (``(start, stop)`` per axis,
    what zarrs_gpu reads: no steps) and the numpy key that takes the key's elements from it."""
    box, rest = [], []
    for k, size in zip(key, shape):
        if isinstance(k, slice):
            r = range(*k.indices(size))
            if len(r) == 0:
                box.append((0, 0))
                rest.append(slice(None))
                continue
            lo, hi = min(r[0], r[-1]), max(r[0], r[-1]) + 1
            box.append((lo, hi))
            first, last = r[0] - lo, r[-1] - lo
            if r.step > 0:
                rest.append(slice(first, last + 1, r.step) if r.step != 1 else slice(None))
            else:
                rest.append(slice(first, last - 1 if last >= 1 else None, r.step))
        else:
            i = int(k)
            if i < 0:
                i += size
            if not 0 <= i < size:
                raise IndexError(f"index {int(k)} is out of bounds for axis with size {size}")
            box.append((i, i + 1))
            rest.append(0)
    return tuple(box), tuple(rest)


class ZarrsGpuBackendArray(BackendArray):
    """One Zarr array, read lazily by zarrs_gpu: indexing reads the key's box (one read) with
    ``zarrs_gpu.dask.reader`` and takes the key's elements from it. ``host``: the result is
    copied to the host (a numpy array) instead of staying a CuPy array. Holds plain values only
    (store path, array path, device), so it pickles."""

    def __init__(self, path: str, array: str, shape: tuple[int, ...], dtype: np.dtype,
                 device: Optional[int] = None, host: bool = False):
        self.path = path
        self.array = array
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.host = host

    def __getitem__(self, key: indexing.ExplicitIndexer) -> Any:
        # xarray hands backends normalized slices (``slice.indices``), where a reversed slice
        # down to 0 has stop -1, which its own decomposition for BASIC backends then reads as
        # "the last element" (an IndexError); such a stop is "none".
        items = tuple(slice(k.start, None, k.step) if isinstance(k, slice) and k.step is not None and k.step < 0
                      and k.stop == -1 else k for k in key.tuple)
        if items != key.tuple:
            key = type(key)(items)
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC, self._read)

    def _read(self, key: tuple) -> Any:
        from . import dask as zd

        box, rest = _box_and_rest(key, self.shape)
        try:
            # zarrs_gpu.dask._read_block: the module's reader, errors naming store, array and box.
            block = zd._read_block(self.path, self.array, self.device, box)
        except Exception as err:
            new = zd._with_context(err, "zarrs_gpu.xarray")
            if new is err:
                raise
            raise new from err
        if self.host:
            block = _to_host(block)
        return block[rest]


def _decode_fill_value(value: Any, dtype: np.dtype) -> Any:
    """A v3 ``_FillValue`` attribute as xarray's zarr engine reads it (floats base64 of a
    little-endian double, as its ``to_zarr`` writes them)."""
    if dtype.kind == "f" and isinstance(value, (str, bytes)):
        return struct.unpack("<d", base64.standard_b64decode(value))[0]
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind in "iu":
        return int(value)
    return value


class ZarrsGpuStore(AbstractDataStore):
    """The group at ``path`` (a filesystem store; ``group`` inside it): its metadata through
    zarr-python, its data through ``ZarrsGpuBackendArray``."""

    def __init__(self, path: str, group: Optional[str] = None, *, consolidated: Optional[bool] = None,
                 use_zarr_fill_value_as_mask: Optional[bool] = None, device: Optional[int] = None):
        import zarr

        self.path = path
        self.group_path = (group or "").strip("/")
        self.device = device
        where = f"zarrs_gpu.xarray: group {('/' + self.group_path)!r} in {path!r}"
        if not os.path.exists(path):
            raise FileNotFoundError(f"{where}: no such store")
        try:
            self.zarr_group = zarr.open_group(path, mode="r", path=self.group_path or None,
                                              use_consolidated=consolidated)
        except Exception as err:
            if not _rebuildable(err):
                raise
            raise type(err)(f"{where}: {err}") from err
        self.zarr_format = self.zarr_group.metadata.zarr_format
        if use_zarr_fill_value_as_mask is None:
            use_zarr_fill_value_as_mask = self.zarr_format == 2  # xarray's zarr engine's default
        self.use_zarr_fill_value_as_mask = use_zarr_fill_value_as_mask
        self.where = where
        self._arrays = dict(self.zarr_group.arrays())

    def _dims_and_attrs(self, name: str, a: Any) -> tuple[tuple[str, ...], dict]:
        attrs = dict(a.attrs)
        if self.zarr_format == 3:
            dims = tuple(a.metadata.dimension_names or ())
        else:
            dims = tuple(attrs.pop(DIMENSION_KEY, ()) or ())
        if len(dims) != len(a.shape):
            key = "dimension_names" if self.zarr_format == 3 else f"attribute {DIMENSION_KEY!r}"
            raise KeyError(f"{self.where}: array {name!r} has no {key} naming its {len(a.shape)} dimensions "
                           f"(xarray needs them)")
        return dims, attrs

    def open_store_variable(self, name: str, a: Any) -> Any:
        from xarray import Variable

        dims, attrs = self._dims_and_attrs(name, a)
        dtype = np.dtype(a.dtype)
        if self.use_zarr_fill_value_as_mask:
            if a.fill_value is not None:
                attrs["_FillValue"] = a.fill_value
        elif "_FillValue" in attrs:
            attrs["_FillValue"] = _decode_fill_value(attrs["_FillValue"], dtype)
        # Host until the backend knows xarray's decoding leaves the variable alone (a data
        # variable read straight from its array): the safe side.
        array = "/" + "/".join(p for p in (self.group_path, name) if p)
        data = ZarrsGpuBackendArray(self.path, array, a.shape, dtype, self.device, host=True)
        unit = a.shards or a.chunks
        encoding = {"chunks": a.chunks, "shards": a.shards, "preferred_chunks": dict(zip(dims, unit)),
                    "source": self.path}
        return Variable(dims, indexing.LazilyIndexedArray(data), attrs, encoding)

    def get_variables(self):
        return {name: self.open_store_variable(name, a) for name, a in self._arrays.items()}

    def get_attrs(self):
        return {k: v for k, v in dict(self.zarr_group.attrs).items() if not k.lower().startswith("_nc")}

    def get_dimensions(self):
        dims = {}
        for name, a in self._arrays.items():
            for d, s in zip(self._dims_and_attrs(name, a)[0], a.shape):
                if dims.setdefault(d, s) != s:
                    raise ValueError(f"{self.where}: dimension {d!r} has lengths {dims[d]} and {s}")
        return dims

    def close(self):
        pass


def _rebuildable(err: Exception) -> bool:
    try:
        return isinstance(type(err)("x"), type(err))
    except Exception:
        return False


def _ours(data: Any) -> Optional[ZarrsGpuBackendArray]:
    """The ZarrsGpuBackendArray a decoded variable's data reads straight from (no decoding
    function in between), else None."""
    if isinstance(data, indexing.LazilyIndexedArray) and isinstance(data.array, ZarrsGpuBackendArray):
        return data.array
    return None


class ZarrsGpuBackendEntrypoint(BackendEntrypoint):
    """xarray's ``engine="zarrs_gpu"``: Zarr groups (v2, v3) in filesystem stores, data read by
    zarrs_gpu on the GPU; see the module's docstring."""

    description = "Zarr groups (v2 and v3) in local stores, read by zarrs_gpu into GPU memory (CuPy)"
    open_dataset_parameters = (
        "filename_or_obj", "drop_variables", "mask_and_scale", "decode_times", "concat_characters",
        "decode_coords", "use_cftime", "decode_timedelta", "group", "consolidated",
        "use_zarr_fill_value_as_mask", "device",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        # Only when asked for by name: xarray's own zarr engine is the default for Zarr stores.
        return False

    def open_dataset(self, filename_or_obj: Any, *, drop_variables: Optional[Iterable[str]] = None,
                     mask_and_scale: bool = True, decode_times: Any = True, concat_characters: bool = True,
                     decode_coords: Any = True, use_cftime: Optional[bool] = None, decode_timedelta: Any = None,
                     group: Optional[str] = None, consolidated: Optional[bool] = None,
                     use_zarr_fill_value_as_mask: Optional[bool] = None, device: Optional[int] = None):
        from xarray.backends import StoreBackendEntrypoint

        if not isinstance(filename_or_obj, (str, os.PathLike)):
            raise TypeError(f"zarrs_gpu.xarray: the store must be a path (a filesystem store), "
                            f"not {type(filename_or_obj).__name__}")
        if device is not None and (not isinstance(device, int) or isinstance(device, bool) or device < 0):
            raise ValueError(f"zarrs_gpu.xarray: device must be a GPU ordinal (0 or more) or None, not {device!r}")
        path = os.path.abspath(os.fspath(filename_or_obj))
        store = ZarrsGpuStore(path, group, consolidated=consolidated,
                              use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask, device=device)
        ds = StoreBackendEntrypoint().open_dataset(
            store, mask_and_scale=mask_and_scale, decode_times=decode_times, concat_characters=concat_characters,
            decode_coords=decode_coords, drop_variables=drop_variables, use_cftime=use_cftime,
            decode_timedelta=decode_timedelta)
        # xarray decodes on the host only: every variable is read to the host but the data
        # variables its decoding left alone (our array straight, no decoding function on it),
        # which stay on the device. Coordinates stay on the host (pandas indexes).
        for name in ds.data_vars:
            array = _ours(ds.variables[name]._data)
            if array is not None:
                array.host = False
        return ds
