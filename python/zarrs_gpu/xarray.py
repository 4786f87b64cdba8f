"""An xarray backend whose reads are zarrs_gpu's: ``xr.open_dataset(store, engine="zarrs_gpu")``.

    import xarray as xr
    ds = xr.open_dataset("climate.zarr", engine="zarrs_gpu")              # lazy; reads on the GPU
    t = ds["t2m"].isel(time=0).data                                       # a CuPy array
    dsk = zarrs_gpu.xarray.open_dataset("climate.zarr", chunks={})        # Dask of CuPy blocks

The group's metadata (v2 ``.zgroup``/``.zarray``/``.zattrs`` or v3 ``zarr.json``, consolidated
metadata where present) is read with zarr-python (``zarr.open_group(store, mode="r")``), which
here only lists the arrays, their shapes, data types, attributes and dimension names
(``_ARRAY_DIMENSIONS`` for v2, ``dimension_names`` for v3); it reads no data. Data is read by
zarrs_gpu, lazily, one box per indexing (``ZarrsGpuBackendArray``), on GPU ``device`` (None:
the reading thread's current CUDA device).

CF decoding is xarray's own (``xarray.conventions.decode_cf_variables``, as for its zarr engine,
with the same fill value rule: v2, the array's ``fill_value`` is ``_FillValue``; v3, the
``_FillValue`` attribute), but for mask and scale, whose values are computed on the device:

* a variable whose decoding is mask and scale (``_Unsigned``, ``_FillValue``/``missing_value``,
  ``scale_factor``/``add_offset``) and whose other decoders (times, timedeltas, booleans) leave
  it alone is decoded by ``CFMaskScaleArray``, lazily (a read of ``ds.v[0:10]`` reads that box)
  and with the array module of what was read: CuPy for data variables, which stay on the device.
  xarray's own coders (CFMaskCoder, CFScaleOffsetCoder) decide its attrs, encoding, fill values
  and dtype; their functions are read back as steps that this module computes with numpy's type
  promotion in numpy's order, so the values are xarray's bit for bit. xarray is then asked not to
  mask and scale that variable again (``mask_and_scale`` per variable); every other option
  (``mask_and_scale=False``, ``decode_cf=False``, ``decode_times``, ``drop_variables``, per-variable
  dicts) is xarray's;
* a data variable that decoding leaves alone (no fill value other than NaN, no packing, no time
  units) is read straight, a CuPy array;
* a variable xarray decodes otherwise (times, timedeltas, a fill value with time units) is read on
  the device and copied to the host, where xarray decodes it (numpy results);
* coordinates (1-D arrays named like their dimension, and those named in ``coordinates``
  attributes) are copied to the host too (xarray's indexes are pandas'), then decoded as above
  with numpy.

With ``chunks=``, use ``zarrs_gpu.xarray.open_dataset(store, chunks=...)`` (or pass
``chunked_array_type=zarrs_gpu.xarray.DeviceDaskManager()`` to ``xr.open_dataset``): device
variables become Dask arrays of CuPy blocks (``meta`` CuPy), each block one read (decoded on the
device). xarray's default chunk manager makes every block ``np.asarray`` of the read, which CuPy
refuses ("Implicit conversion to a NumPy array is not allowed"), so ``xr.open_dataset(...,
engine="zarrs_gpu", chunks=...)`` alone works only for variables read to the host.

Needs xarray, numpy and zarr-python (``pip install 'zarrs-gpu[xarray]'``; without them, importing
this module says so), and dask for ``chunks=``.

Tests read on the host by replacing ``zarrs_gpu.dask.reader`` (the one read function both
modules use, looked up at each read).
"""

import base64
import os
import struct
from typing import Any, Iterable, Optional

from ._common import missing_dependency, require
from ._common import with_context as _with_context

try:
    import numpy as np
    from xarray.backends import BackendArray, BackendEntrypoint
    from xarray.backends.common import AbstractDataStore
    from xarray.core import indexing
except ImportError as _err:
    raise missing_dependency(_err, "zarrs_gpu.xarray", "xarray") from _err

__all__ = ["CFMaskScaleArray", "DeviceDaskManager", "ZarrsGpuBackendArray", "ZarrsGpuBackendEntrypoint",
           "ZarrsGpuStore", "open_dataset"]

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
            new = _with_context(err, "zarrs_gpu.xarray")
            if new is err:
                raise
            raise new from err
        if self.host:
            block = _to_host(block)
        return block[rest]


def _xarray_keeps_fill_value() -> bool:
    """Whether xarray's zarr engine keeps a v3 array's ``fill_value`` in the encoding (xarray
    2026.07 and later, pydata/xarray#11345), which this engine then does too."""
    import xarray

    try:
        year, month = (int(p) for p in xarray.__version__.split(".")[:2])
    except ValueError:
        return True  # a development build: the current behaviour
    return (year, month) >= (2026, 7)


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
        from ._arrays import RemoteLocation, zarr_python_store

        zarr = require("zarr", "zarrs_gpu.xarray", "xarray")  # lists the group
        self.path = path
        self.group_path = (group or "").strip("/")
        self.device = device
        where = f"zarrs_gpu.xarray: group {('/' + self.group_path)!r} in {path!r}"
        remote = isinstance(path, RemoteLocation)
        if not remote and not os.path.exists(path):
            raise FileNotFoundError(f"{where}: no such store")
        try:
            # An object store is listed through obstore (zarr-python's ObjectStore).
            self.zarr_group = zarr.open_group(zarr_python_store(path) if remote else path, mode="r",
                                              path=self.group_path or None, use_consolidated=consolidated)
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
                    "source": getattr(self.path, "shown", self.path)}
        if not self.use_zarr_fill_value_as_mask and self.zarr_format == 3 and _xarray_keeps_fill_value():
            encoding["fill_value"] = a.fill_value  # as xarray's zarr engine does, so writes keep it
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
    """The ZarrsGpuBackendArray a decoded variable's data reads from, straight or through
    ``CFMaskScaleArray`` (no xarray decoding function in between), else None."""
    if isinstance(data, CFMaskScaleArray):
        data = data.array
    if isinstance(data, indexing.LazilyIndexedArray) and isinstance(data.array, ZarrsGpuBackendArray):
        return data.array
    return None


# CF mask and scale on the data's own array module. xarray's coders (CFMaskCoder,
# CFScaleOffsetCoder) decide everything about a variable but its values: which attributes move to
# ``encoding``, the fill values, the decoded dtype. They express the values as a chain of
# ``functools.partial``s of three functions (np.asarray for ``_Unsigned``, _apply_mask,
# _scale_offset_decoding) that call numpy, which refuses CuPy arrays. ``_steps_of`` reads that
# chain back as plain steps and ``_apply_steps`` computes them with numpy or CuPy, with every
# operation's dtype fixed by numpy's own promotion rule (np.result_type): CuPy's rule for scalars
# need not be numpy's, and the same dtypes in the same order give the same bits.


def _array_module(x: Any):
    """CuPy for a CuPy array, else numpy."""
    if type(x).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _apply_steps(x: Any, steps: tuple) -> Any:
    """The values of xarray's decoding ``steps`` (``_steps_of``) on ``x``, in ``x``'s array module
    and, for CuPy, on ``x``'s device (a read on GPU 1 from a thread whose current device is 0
    would otherwise be decoded on GPU 0, or refused)."""
    xp = _array_module(x)
    if xp is np:
        return _steps(np, np.asarray(x), steps)  # a numpy scalar from an integer key: an array, as xarray's np.asarray makes it
    with x.device:
        return _steps(xp, x, steps)


def _steps(xp: Any, x: Any, steps: tuple) -> Any:
    for step in steps:
        kind = step[0]
        if kind == "cast":  # _Unsigned: np.asarray(data, dtype=...), a C cast (wraps)
            x = x.astype(step[1], copy=False)
        elif kind == "mask":  # _apply_mask: fill values to the decoded fill value, in ``dtype``
            _, fills, decoded, dtype = step
            x = x.astype(dtype, copy=False)
            condition = None
            for fv in fills:
                common = np.result_type(x.dtype, fv)  # what ``data == fv`` compares in
                equal = x.astype(common, copy=False) == xp.asarray(fv, dtype=common)
                condition = equal if condition is None else condition | equal
            out = np.result_type(decoded, x.dtype)  # what np.where(cond, decoded, data) makes
            x = xp.where(condition, xp.asarray(decoded, dtype=out), x.astype(out, copy=False))
        elif kind == "scale":  # _scale_offset_decoding: a copy in ``dtype``, then *= and += in place
            _, scale_factor, add_offset, dtype = step
            x = x.astype(dtype, copy=True)
            for value, op in ((scale_factor, "mul"), (add_offset, "add")):
                if value is None:
                    continue
                common = np.result_type(x.dtype, value)  # the in-place ufunc's loop, cast back
                operand = common.type(value)
                if common == x.dtype:  # x is this step's own copy: in place, as xarray does
                    if op == "mul":
                        x *= operand
                    else:
                        x += operand
                else:
                    v = x.astype(common)
                    x = (v * operand if op == "mul" else v + operand).astype(dtype, copy=False)
        else:
            raise AssertionError(f"zarrs_gpu.xarray: unknown decoding step {kind!r}")
    return x


def _steps_of(data: Any, source: Any) -> Optional[tuple]:
    """The steps of the chain of xarray decoding functions ``data`` is, from ``source`` (innermost
    first), or None where ``data`` is not such a chain over ``source`` or a function in it is not
    one of the three that this module computes (a later xarray: its host decoding is used)."""
    from functools import partial

    from xarray.coding import variables as xv
    from xarray.coding.common import _ElementwiseFunctionArray

    steps = []
    while isinstance(data, _ElementwiseFunctionArray):
        f = data.func
        if not isinstance(f, partial) or f.args:
            return None
        kw = f.keywords
        # Native byte order throughout (CuPy has no other; the values are the same): where
        # xarray's result is not native, its EndianCoder makes it so next.
        dtype = np.dtype(kw.get("dtype")).newbyteorder("=")
        if f.func is np.asarray and set(kw) == {"dtype"}:
            steps.append(("cast", dtype))
        elif f.func is xv._apply_mask and set(kw) == {"encoded_fill_values", "decoded_fill_value", "dtype"}:
            steps.append(("mask", tuple(kw["encoded_fill_values"]), kw["decoded_fill_value"], dtype))
        elif f.func is xv._scale_offset_decoding and set(kw) == {"scale_factor", "add_offset", "dtype"}:
            steps.append(("scale", kw["scale_factor"], kw["add_offset"], dtype))
        else:
            return None
        data = data.array
    if data is not source or not steps:
        return None
    # Numbers only (an attribute of another type, a string scale_factor say, is left to xarray
    # to fail on as it does), and numeric dtypes.
    for step in steps:
        values = step[1] if step[0] == "mask" else step[1:3] if step[0] == "scale" else ()
        values = list(values) + ([step[2]] if step[0] == "mask" else [])
        if not all(v is None or (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool))
                   for v in values) or step[-1].kind not in "iuf":
            return None
    return tuple(reversed(steps))


class CFMaskScaleArray(indexing.ExplicitlyIndexedNDArrayMixin):
    """A variable's CF mask-and-scale decoding (``_Unsigned``, ``_FillValue``/``missing_value``,
    ``scale_factor``/``add_offset``), lazily: indexing composes with the wrapped (lazily indexed)
    array, so a read is of the key's box only, and the values are computed when asked for with
    the array module of what the read gave (CuPy on the GPU: they stay on the device)."""

    def __init__(self, array: Any, steps: tuple, dtype: Any):
        self.array = indexing.as_indexable(array)
        self.steps = steps
        self._dtype = np.dtype(dtype)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    def transpose(self, order):
        return type(self)(self.array.transpose(order), self.steps, self._dtype)

    def _oindex_get(self, key):
        return type(self)(self.array.oindex[key], self.steps, self._dtype)

    def _vindex_get(self, key):
        return type(self)(self.array.vindex[key], self.steps, self._dtype)

    def __getitem__(self, key):
        return type(self)(self.array[key], self.steps, self._dtype)

    def get_duck_array(self):
        return _apply_steps(self.array.get_duck_array(), self.steps)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.array!r}, steps={self.steps!r}, dtype={self._dtype!r})"


def _bounds_names(variables: dict) -> set:
    """Variables named by a ``bounds`` attribute: xarray may give them the time attributes of
    the variable they bound before decoding, so they are left to it."""
    names = set()
    for v in variables.values():
        b = v.attrs.get("bounds")
        if isinstance(b, str):
            names.update(b.split())
    return names


def _decode_mask_and_scale(variables: dict, mask_and_scale: Any, drop_variables: Any):
    """The variables with CF mask-and-scale decoding done by ``CFMaskScaleArray`` wherever that
    is all xarray's ``decode_cf_variable`` would do to a variable's values before its other
    decoders (times, booleans) and those would leave it alone; and the ``mask_and_scale`` to hand
    xarray: per variable, False for those decoded here, the caller's choice for the rest.

    Attributes, encoding and dtype are xarray's coders' own (run here with this module's array
    under them); only the values are this module's."""
    import warnings
    from collections.abc import Mapping

    from xarray import Variable
    from xarray.coding.variables import CFMaskCoder, CFScaleOffsetCoder, _is_time_like

    def wanted(name):  # xarray's reading of a per-variable option (conventions._item_or_default)
        return mask_and_scale.get(name, True) if isinstance(mask_and_scale, Mapping) else mask_and_scale

    if isinstance(drop_variables, str):
        drop_variables = [drop_variables]
    dropped = set(drop_variables or ())
    bounds = _bounds_names(variables)
    out, per_variable = {}, {}
    for name, var in variables.items():
        out[name] = var
        per_variable[name] = wanted(name)
        if name in dropped or not per_variable[name] or name in bounds:
            continue
        units = var.attrs.get("units")
        if (_ours(var._data) is None or var.dtype.kind not in "iuf" or "dtype" in var.attrs
                or (units is not None and ("since" in str(units) or _is_time_like(units)))):
            continue  # not ours, or times, timedeltas or booleans: xarray's decoders, on the host
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                # On a copy: CFMaskCoder pops the fill values from the attributes it is given.
                copy = Variable(var.dims, var._data, dict(var.attrs), dict(var.encoding), fastpath=True)
                decoded = CFMaskCoder().decode(copy, name=name)
                decoded = CFScaleOffsetCoder().decode(decoded, name=name)
            except Exception:
                continue  # xarray raises it again, with its note naming the variable
        steps = _steps_of(decoded._data, var._data)
        if steps is None:
            continue  # nothing to compute (a NaN fill value only), or not a chain we know
        for w in caught:  # xarray's own warnings (multiple fill values, ...), said once
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        encoding = dict(decoded.encoding)
        dtype = decoded._data.dtype
        # As decode_cf_variable records it: the stored dtype, unless the decoded one is not
        # native (a big-endian float with a fill value), which its EndianCoder makes native.
        encoding["dtype"] = var.dtype if dtype.isnative else dtype.newbyteorder("=")
        data = CFMaskScaleArray(var._data, steps, dtype.newbyteorder("="))
        out[name] = Variable(decoded.dims, data, decoded.attrs, encoding, fastpath=True)
        per_variable[name] = False
    return out, per_variable


class ZarrsGpuBackendEntrypoint(BackendEntrypoint):
    """xarray's ``engine="zarrs_gpu"``: Zarr groups (v2, v3) in filesystem stores, data read by
    zarrs_gpu on the GPU; see the module's docstring."""

    description = "Zarr groups (v2 and v3) in local or object stores, read by zarrs_gpu into GPU memory (CuPy)"
    open_dataset_parameters = (
        "filename_or_obj", "drop_variables", "mask_and_scale", "decode_times", "concat_characters",
        "decode_coords", "use_cftime", "decode_timedelta", "group", "consolidated",
        "use_zarr_fill_value_as_mask", "device", "storage_options",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        # Only when asked for by name: xarray's own zarr engine is the default for Zarr stores.
        return False

    def open_dataset(self, filename_or_obj: Any, *, drop_variables: Optional[Iterable[str]] = None,
                     mask_and_scale: bool = True, decode_times: Any = True, concat_characters: bool = True,
                     decode_coords: Any = True, use_cftime: Optional[bool] = None, decode_timedelta: Any = None,
                     group: Optional[str] = None, consolidated: Optional[bool] = None,
                     use_zarr_fill_value_as_mask: Optional[bool] = None, device: Optional[int] = None,
                     storage_options: Optional[dict] = None):
        from xarray import Coordinates, Dataset
        from xarray.conventions import decode_cf_variables

        from ._arrays import location

        if not isinstance(filename_or_obj, (str, os.PathLike)):
            raise TypeError(f"zarrs_gpu.xarray: the store must be a path (a filesystem store) or an object "
                            f"store's URL, not {type(filename_or_obj).__name__}")
        if device is not None and (not isinstance(device, int) or isinstance(device, bool) or device < 0):
            raise ValueError(f"zarrs_gpu.xarray: device must be a GPU ordinal (0 or more) or None, not {device!r}")
        path = location(filename_or_obj, storage_options, "zarrs_gpu.xarray")
        store = ZarrsGpuStore(path, group, consolidated=consolidated,
                              use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask, device=device)
        # What xarray's StoreBackendEntrypoint does, with mask and scale done first by
        # CFMaskScaleArray where it can (and then turned off for those variables only).
        variables, attrs = store.load()
        variables, mask_and_scale = _decode_mask_and_scale(dict(variables), mask_and_scale, drop_variables)
        variables, attrs, coord_names = decode_cf_variables(
            variables, attrs, mask_and_scale=mask_and_scale, decode_times=decode_times,
            concat_characters=concat_characters, decode_coords=decode_coords, drop_variables=drop_variables,
            use_cftime=use_cftime, decode_timedelta=decode_timedelta)
        coords = {n: v for n, v in variables.items() if n in coord_names or v.dims == (n,)}
        data_vars = {n: v for n, v in variables.items() if n not in coords}
        ds = Dataset(data_vars, coords=Coordinates(coords, indexes={}), attrs=attrs)
        ds.set_close(store.close)
        ds.encoding = store.get_encoding()
        # Data variables read straight or decoded by CFMaskScaleArray stay on the device; the
        # rest (coordinates: pandas indexes; what xarray decodes, times say) are read to the host.
        for name in ds.data_vars:
            array = _ours(ds.variables[name]._data)
            if array is not None:
                array.host = False
        return ds


class _DeviceBlocks:
    """What ``dask.array.from_array`` takes a device variable's blocks from: xarray's lazy adapter
    of the variable, each block its duck array (CuPy) where xarray's own path makes it
    ``np.asarray`` of one, which CuPy refuses."""

    def __init__(self, adapter: Any):
        self.adapter = adapter
        self.shape = tuple(adapter.shape)
        self.dtype = adapter.dtype
        self.ndim = len(self.shape)

    def __getitem__(self, key):
        part = self.adapter[key]
        get = getattr(part, "get_duck_array", None)  # still lazy: read (and decode) it now
        return get() if callable(get) else part


def _on_device(adapter: Any) -> bool:
    """Whether the variable xarray's lazy ``adapter`` wraps is read to the device: this engine's
    backend array (straight or under ``CFMaskScaleArray``) not marked for the host. Decided from
    the variable, not by reading, so that a client without a GPU can build the graph."""
    data = adapter.array
    while isinstance(data, (indexing.CopyOnWriteArray, indexing.MemoryCachedArray)):
        data = data.array
    array = _ours(data)
    return array is not None and not array.host


def _device_dask_manager_class():
    from xarray.core.indexing import ImplicitToExplicitIndexingAdapter
    from xarray.namedarray.daskmanager import DaskManager

    class DeviceDaskManager(DaskManager):
        """xarray's Dask chunk manager, but a variable this engine reads to the device becomes a
        Dask array of CuPy blocks (``meta`` CuPy) instead of xarray's numpy conversion of each
        block. Pass an instance as ``chunked_array_type`` to ``xr.open_dataset`` with ``chunks=``
        (``zarrs_gpu.xarray.open_dataset`` does); it is not registered, so every other Dask array
        keeps xarray's own manager."""

        def from_array(self, data: Any, chunks: Any, **kwargs: Any):
            if isinstance(data, ImplicitToExplicitIndexingAdapter) and data.ndim and _on_device(data):
                import dask.array as da

                from . import dask as zd

                kwargs.update(meta=zd.make_meta(data.dtype, data.ndim), asarray=False)
                return da.from_array(_DeviceBlocks(data), chunks, **kwargs)
            return super().from_array(data, chunks, **kwargs)

    return DeviceDaskManager


def __getattr__(name: str) -> Any:
    # DeviceDaskManager subclasses xarray's DaskManager, which needs dask: made on first use.
    if name == "DeviceDaskManager":
        cls = _device_dask_manager_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def open_dataset(store: Any, *, chunks: Any = None, **kwargs: Any):
    """``xr.open_dataset(store, engine="zarrs_gpu", chunks=chunks, **kwargs)``, with, when
    ``chunks`` is given, Dask arrays of CuPy blocks for the variables read to the device (through
    ``DeviceDaskManager``; xarray's default chunk manager would turn each block into numpy, which
    CuPy refuses). Coordinates and host-decoded variables are Dask arrays of numpy blocks, as
    xarray makes them."""
    import xarray as xr

    if chunks is not None and kwargs.get("chunked_array_type") is None:
        kwargs["chunked_array_type"] = __getattr__("DeviceDaskManager")()
    return xr.open_dataset(store, engine=ZarrsGpuBackendEntrypoint, chunks=chunks, **kwargs)
