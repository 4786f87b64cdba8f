"""A zarr-python codec pipeline that decodes on the GPU with zarrs_gpu.

Under ``zarr.config.enable_gpu()`` zarr-python asks its codec pipeline to fill a CuPy output
buffer chunk by chunk, decoding on the host. With this pipeline, a read of a rectangular
selection of an array in a local store, or in zarr-python's ``ObjectStore`` of obstore's S3,
HTTP or local store (their configuration handed over as storage_options; not an S3 store with a
Python credential provider), is read by zarrs_gpu straight into that buffer (chunks
read in parallel, checked, decoded and placed on the device), and a write of a device value (a
CuPy array, a PyTorch CUDA tensor) of the selection's shape and the array's dtype into such a
selection is zarrs_gpu's (chunks assembled and encoded on the device where the codecs allow);
anything else (host buffers and values, other stores, broadcasts, casts) is zarr-python's own
``BatchedCodecPipeline``. Errors of a device
read (a corrupt chunk, say) are raised, never answered by the fallback. For arrays using this
pipeline, a selection that is one box is handed to zarrs_gpu before zarr-python walks its chunks
one by one (``AsyncArray._get_selection`` is wrapped: zarr-python's walk costs tens of ms for
thousands of small chunks; that and the other private methods replaced are in ``_zarr_hooks``).
Coordinate, mask and orthogonal array selections (``vindex``,
``oindex``), which zarr-python cannot serve into GPU buffers, are read as the bounding box of
their elements and gathered on the device with CuPy; a box more than 64 times the elements
selected and over 256 MiB is read chunk by chunk instead (only the chunks holding elements, each
its part that holds them).

    import zarr, zarrs_gpu
    with zarrs_gpu.gpu_zarr_context():
        x = zarr.open_array("volume.zarr")[0:64]      # a CuPy array, decoded on the GPU

or, by configuration: ``zarr.config.set({"codec_pipeline.path":
"zarrs_gpu.pipeline.GpuCodecPipeline"})`` with ``zarr.config.enable_gpu()``.
"""
import asyncio
import operator
import os
import re
import sys
import threading

from zarr.core.codec_pipeline import BatchedCodecPipeline
from zarr.registry import register_pipeline
from zarr.storage import LocalStore

from . import _zarr_hooks
from ._arrays import _ARRAY_METADATA
from ._arrays import open_cached as _open_array
from ._arrays import ZARR_PYTHON_STORES, zarr_python_root



class GpuCodecPipeline(BatchedCodecPipeline):
    """zarr-python's pipeline, with reads into GPU buffers done by zarrs_gpu."""

    #: Reads this process did on the device (the rest went to zarr-python's pipeline).
    device_reads = 0
    #: Writes of device values this process handed to zarrs_gpu.
    device_writes = 0
    _lock = threading.Lock()
    _prefixes = {}  # store root -> array paths met there

    async def write(self, batch_info, value, drop_axes=()):
        """zarr-python's write, holding the locks zarrs_gpu's own writes take on the chunks of a
        local store it changes (read, modified and written again): a write from another thread or
        task of this process, by zarr-python or zarrs_gpu, into one of them waits, so that no
        update is lost."""
        batch_info = list(batch_info)
        paths = _chunk_files(batch_info)
        if not paths:
            return await super().write(batch_info, value, drop_axes)
        from ._zarrs_gpu import _lock_files

        # Waiting for another write's locks must not stop zarr's event loop.
        locks = await asyncio.to_thread(_lock_files, paths)
        try:
            return await super().write(batch_info, value, drop_axes)
        finally:
            locks.release()

    async def read(self, batch_info, out, drop_axes=()):
        batch_info = list(batch_info)
        plan = _device_plan(batch_info, out, drop_axes)
        if plan is None:
            return await super().read(batch_info, out, drop_axes)
        array, key, target = plan
        # `out` may be the caller's, with work queued on a stream of another thread: let it finish.
        import cupy

        cupy.cuda.Device(target.device.id).synchronize()
        # zarrs_gpu releases the interpreter lock; a thread keeps zarr's event loop free meanwhile.
        report = await asyncio.to_thread(array.read_into, target, key)
        with GpuCodecPipeline._lock:
            GpuCodecPipeline.device_reads += 1
        # Per chunk, whether it exists (zarr-python 3.2 and later read these; earlier ones none).
        if report["missing_chunks"] == 0:
            return tuple({"status": "present"} for _ in batch_info)
        return tuple({"status": "present" if os.path.exists(os.path.join(str(bg.store.root), bg.path)) else "missing"}
                     for bg, *_ in batch_info)


def _chunk_files(batch_info):
    """The files of the chunks a write's `batch_info` changes, in a local directory store (resolved
    as zarrs_gpu resolves a store's directory, so both name one file alike); [] for other stores."""
    paths = []
    for byte_setter, *_ in batch_info:
        store = getattr(byte_setter, "store", None)
        root = zarr_python_root(store) if store is not None else None
        if not isinstance(root, str) or not os.path.isdir(root):
            continue
        paths.append(os.path.join(os.path.realpath(root), *str(byte_setter.path).split("/")))
    return paths


def _device_plan(batch_info, out, drop_axes):
    """The zarrs_gpu array, the index and the CuPy target of a read the device can do, or None."""
    import zarr

    # Missing chunks as errors is zarr-python's to report, chunk by chunk.
    if not batch_info or zarr.config.get("array.read_missing_chunks", True) is False:
        return None
    target = out.as_ndarray_like()
    if type(target).__module__.split(".")[0] != "cupy" or not target.flags.c_contiguous:
        return None
    # The array's own setting too (zarr-python 3.2 and later).
    if getattr(getattr(batch_info[0][1], "config", None), "read_missing_chunks", True) is False:
        return None
    device = target.device.id
    lows = None
    dropped = {}
    array = None
    first_store = first_shape = keys = None
    for byte_getter, chunk_spec, chunk_selection, out_selection, _ in batch_info:
        # The chunk's array and grid coordinates: the first chunk's found by looking at the store,
        # the others' (the same store and chunk shape, almost always) by matching keys.
        store = getattr(byte_getter, "store", None)
        match = None
        if store is first_store and chunk_spec.shape == first_shape:
            match = keys.match(byte_getter.path)
        if match is not None:
            coords = [int(c) for c in match.groups()]
        else:
            # Only regular grids: a chunk's origin is its coordinates times the chunk shape.
            if not isinstance(store, LocalStore):
                return None
            located = _locate(str(store.root), byte_getter.path, len(chunk_spec.shape), device)
            if located is None:
                return None
            this, coords, prefix = located
            if (array is not None and this is not array) or this.regular_chunks != tuple(chunk_spec.shape):
                return None
            if array is None:
                array, first_store, first_shape = this, store, chunk_spec.shape
                keys = _key_pattern(prefix, len(coords))
        if len(chunk_selection) != len(coords):
            return None
        out_dims = iter(out_selection if isinstance(out_selection, tuple) else (out_selection,))
        chunk_lows = []
        for dim, (sel, coord, extent) in enumerate(zip(chunk_selection, coords, chunk_spec.shape)):
            origin = coord * extent
            if sel.__class__ is not slice:
                # An integer drops its dimension (no output selection); anything else (arrays of
                # an advanced selection) is zarr-python's.
                try:
                    index = origin + operator.index(sel)
                except TypeError:
                    return None
                if dropped.setdefault(dim, index) != index:
                    return None
                continue
            out_sel = next(out_dims, None)
            if (sel.step not in (None, 1) or out_sel.__class__ is not slice or out_sel.step not in (None, 1)
                    or sel.stop - sel.start != out_sel.stop - out_sel.start):
                return None
            # Where the output's first element lies in the array, by this chunk.
            chunk_lows.append(origin + sel.start - out_sel.start)
        if lows is None:
            lows = chunk_lows
        elif chunk_lows != lows:
            return None
    if array is None or str(target.dtype) != str(array.dtype) or len(lows) != target.ndim:
        return None
    key, out_dim = [], 0
    for dim in range(array.ndim):
        if dim in dropped:
            key.append(dropped[dim])
        else:
            key.append(slice(lows[out_dim], lows[out_dim] + target.shape[out_dim]))
            out_dim += 1
    if any(s.start < 0 or s.stop > n for s, n in zip(key, array.shape) if isinstance(s, slice)):
        return None
    return array, tuple(key), target


def _locate(root, path, ndim, device):
    """The zarrs_gpu array a chunk key belongs to, and the chunk's grid coordinates, or None."""
    coords = None
    # An array met before (no file system calls for its other chunks)...
    for prefix in GpuCodecPipeline._prefixes.get(root, ()):
        if prefix == "" or path.startswith(prefix + "/"):
            coords = _coords(path[len(prefix):], ndim)
            if coords is not None:
                break
    if coords is None:
        # ... else the array's directory: the longest prefix holding array metadata, at most
        # ndim + 1 parts up (v3 "c/1/2", v3 "c.1.2", v2 "1.2" or "1/2").
        parts = path.split("/")
        for up in range(1, min(ndim + 1, len(parts)) + 1):
            prefix = "/".join(parts[:-up])
            if any(os.path.isfile(os.path.join(root, prefix, name)) for name in _ARRAY_METADATA):
                break
        else:
            return None
        coords = _coords(path[len(prefix):], ndim)
        if coords is None:
            return None
    array = _open_array(root, prefix, device)
    if array is None or array.ndim != ndim:
        return None
    with GpuCodecPipeline._lock:
        known = GpuCodecPipeline._prefixes.setdefault(root, [])
        if prefix not in known:
            known.append(prefix)
            known.sort(key=len, reverse=True)
    return array, coords, prefix


def _key_pattern(prefix, ndim):
    """Chunk keys of the array at `prefix` with `ndim` dimensions, coordinates as groups (v3
    default "c/1/2" or "c.1.2", v2 "1.2" or "1/2")."""
    head = re.escape(prefix + "/") if prefix else ""
    if ndim == 0:
        return re.compile(head + "c$")
    return re.compile(head + r"(?:c[./])?" + r"[./]".join([r"(\d+)"] * ndim) + "$")


def zarrs_array_of(array, device=0):
    """The zarrs_gpu array that reads a zarr-python `array` to GPU `device` (kept between calls
    like the pipeline's own, while its metadata is the same): an array in a local store, or in an
    `ObjectStore` that `zarr_python_root` can name. TypeError for an array of another store,
    ValueError when zarrs cannot open it."""
    store = getattr(getattr(array, "store_path", None), "store", None)
    root = None if store is None else zarr_python_root(store)
    if root is None:
        where = f" in a {type(store).__name__}" if store is not None else ""
        raise TypeError(
            f"expected a zarrs_gpu.Array or a zarr-python array in {ZARR_PYTHON_STORES}, "
            f"not a {type(array).__name__}{where}"
        )
    gpu = _open_array(root, array.store_path.path, device)
    if gpu is None:
        raise ValueError(f"zarrs_gpu cannot open the array {array.store_path.path!r} of {root}")
    return gpu


def _coords(rest, ndim):
    """A chunk's grid coordinates from its key below the array's path, or None."""
    parts = re.split(r"[./]", rest.lstrip("/"))
    if parts and parts[0] == "c":
        parts = parts[1:]
    if parts == [""]:
        parts = []
    if len(parts) != ndim or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def _device_root(array, prototype, fields):
    """Where zarrs_gpu reads an array this pipeline reads on the device (`zarr_python_root` of its
    store): its codec pipeline is this one, no structured fields (`fields` is None or an empty
    list when there are none), missing chunks read as the fill value, and GPU buffers asked for
    (enable_gpu()'s `zarr.core.buffer.gpu.NDBuffer`, or a subclass of it); else None."""
    if not isinstance(array.codec_pipeline, GpuCodecPipeline) or fields:
        return None
    if getattr(array.config, "read_missing_chunks", True) is False:
        return None
    if not any(c.__module__.endswith("buffer.gpu") for c in getattr(prototype.nd_buffer, "__mro__", ())):
        return None
    return zarr_python_root(array.store_path.store)


def _selection_plan(array, indexer, prototype, out, fields):
    """For an array whose codec pipeline is this one: the zarrs_gpu array, the index and the
    output buffer of a selection read whole by zarrs_gpu (a box of a regular-grid array in a store
    `zarr_python_root` names, into a new C-order GPU buffer), or None for zarr-python's own way."""
    root = None if out is not None else _device_root(array, prototype, fields)
    if root is None:
        return None
    if getattr(array.metadata, "order", "C") != "C" or getattr(array.config, "order", "C") != "C":
        return None
    key = _box_key(indexer)
    if key is None:
        return None
    buffer = prototype.nd_buffer.empty(shape=indexer.shape, dtype=array.metadata.dtype.to_native_dtype(), order="C")
    target = buffer.as_ndarray_like()
    if type(target).__module__.split(".")[0] != "cupy":
        return None
    # Read on the device the buffer is on (CuPy's current device).
    gpu_array = _open_array(root, array.store_path.path, target.device.id)
    if gpu_array is None or gpu_array.regular_chunks is None or gpu_array.shape != tuple(array.shape):
        return None
    if str(target.dtype) != str(gpu_array.dtype):
        return None
    return gpu_array, key, buffer


#: A bounding box this many times larger than the elements selected, and this large in bytes, is
#: not read whole: each chunk holding selected elements is read on its own (its part that holds
#: them), so that a few scattered points never read a whole volume.
_BOX_WASTE = 64
_BOX_BYTES = 256 << 20


class _Piece:
    """One read of an advanced selection: the box `lo`..`hi` of the array, and how its elements
    go to the output (`take(box, xp)` the values, `put` where they go)."""

    __slots__ = ("lo", "hi", "take", "put")

    def __init__(self, lo, hi, take, put):
        self.lo, self.hi, self.take, self.put = lo, hi, take, put


def _too_large(lo, hi, selected, itemsize):
    box = 1
    for a, b in zip(lo, hi):
        box *= b - a
    return box > _BOX_WASTE * max(selected, 1) and box * itemsize > _BOX_BYTES


def _point_pieces(indexer, itemsize):
    """The reads of a coordinate (or mask) selection, zarr-python's `CoordinateIndexer`: its
    points (flat, grouped by chunk, `sel_sort` their places in the output) in their bounding box,
    or chunk by chunk when that box is too large (None where the chunks cannot be told)."""
    import numpy as np

    selection = indexer.selection
    lo = [int(d.min()) for d in selection]
    hi = [int(d.max()) + 1 for d in selection]
    if not _too_large(lo, hi, len(selection[0]), itemsize):
        put = slice(None) if indexer.sel_sort is None else indexer.sel_sort
        local = tuple(np.asarray(d - a) for d, a in zip(selection, lo))
        return [_Piece(lo, hi, lambda box, xp, local=local: box[tuple(xp.asarray(i) for i in local)], put)]
    grids = _dimension_grids(indexer)
    if grids is None:
        return None
    pieces = []
    for chunk_coords, chunk_selection, out_selection, *_ in indexer:
        origin = [int(g.chunk_offset(int(c))) for c, g in zip(chunk_coords, grids)]
        first = [int(d.min()) for d in chunk_selection]
        local = tuple(np.asarray(d - f) for d, f in zip(chunk_selection, first))
        lo = [o + f for o, f in zip(origin, first)]
        hi = [o + int(d.max()) + 1 for o, d in zip(origin, chunk_selection)]
        pieces.append(_Piece(lo, hi, lambda box, xp, local=local: box[tuple(xp.asarray(i) for i in local)],
                             out_selection))
    return pieces


def _orthogonal_dims(indexer):
    """Per dimension of an advanced `OrthogonalIndexer`: an int (dropped) or the indices it takes,
    in output order (numpy int arrays), or None for an indexer this does not know."""
    import numpy as np

    dims = []
    for dim in indexer.dim_indexers:
        name = type(dim).__name__
        if name == "IntDimIndexer":
            dims.append(int(dim.dim_sel))
        elif name == "SliceDimIndexer":
            dims.append(np.arange(dim.start, dim.stop, dim.step, dtype=np.int64)[: dim.nitems])
        elif name == "IntArrayDimIndexer":
            # zarr-python sorted them by chunk; `dim_out_sel` says where each came from.
            values = np.asarray(dim.dim_sel, dtype=np.int64)
            if dim.dim_out_sel is not None:
                ordered = np.empty_like(values)
                ordered[np.asarray(dim.dim_out_sel)] = values
                values = ordered
            dims.append(values)
        elif name == "BoolArrayDimIndexer":
            dims.append(np.nonzero(np.asarray(dim.dim_sel))[0].astype(np.int64))
        else:
            return None
    return dims


def _orthogonal_pieces(indexer, itemsize):
    """The reads of an orthogonal selection with integer or Boolean arrays (`oindex`): the box of
    its indices, or one box per chunk holding some when that is too large."""
    import itertools

    import numpy as np

    dims = _orthogonal_dims(indexer)
    if dims is None:
        return None
    lo = [d if isinstance(d, int) else int(d.min()) for d in dims]
    hi = [d + 1 if isinstance(d, int) else int(d.max()) + 1 for d in dims]
    selected = 1
    for n in indexer.shape:
        selected *= n
    split = _too_large(lo, hi, selected, itemsize)
    grids = _dimension_grids(indexer) if split else [None] * len(dims)
    if grids is None:
        return None
    # Per kept dimension, its groups: (where in the output, which indices); one group unless split.
    groups = []
    for d, grid in zip(dims, grids):
        if isinstance(d, int):
            groups.append([(None, np.asarray([d]))])
        elif not split:
            groups.append([(np.arange(len(d)), d)])
        else:
            owner = np.asarray(grid.indices_to_chunks(d))
            groups.append([(np.nonzero(owner == c)[0], d[owner == c]) for c in np.unique(owner)])
    drop = tuple(0 if isinstance(d, int) else slice(None) for d in dims)
    pieces = []
    for combination in itertools.product(*groups):
        lo = [int(values.min()) for _, values in combination]
        hi = [int(values.max()) + 1 for _, values in combination]
        local = [values - a for (_, values), a, d in zip(combination, lo, dims) if not isinstance(d, int)]
        put = [where for (where, _), d in zip(combination, dims) if not isinstance(d, int)]

        def take(box, xp, local=local):
            return box[drop][xp.ix_(*[xp.asarray(i) for i in local])]

        pieces.append(_Piece(lo, hi, take, put))
    return pieces


class _RegularDimension:
    """One dimension of a regular chunk grid, as zarr-python 3.4's `FixedDimension` serves it."""

    __slots__ = ("size",)

    def __init__(self, size):
        self.size = size

    def chunk_offset(self, chunk_ix):
        return chunk_ix * self.size

    def indices_to_chunks(self, indices):
        return indices // self.size


def _dimension_grids(indexer):
    """Per dimension of zarr-python's `indexer`, its chunks (`chunk_offset(chunk)`,
    `indices_to_chunks(indices)`): zarr-python 3.4's `dim_grids`, or from 3.1's `chunk_shape`.
    None where the indexer has neither (another zarr-python): the caller then declines the device
    route and zarr-python reads the selection its own way."""
    grids = getattr(indexer, "dim_grids", None)
    if grids is not None:
        if all(hasattr(g, "chunk_offset") and hasattr(g, "indices_to_chunks") for g in grids):
            return list(grids)
        return None
    chunk_shape = getattr(indexer, "chunk_shape", None)
    if chunk_shape is None:
        return None
    return [_RegularDimension(int(n)) for n in chunk_shape]


def _indexer_chunk_grid(array):
    """The chunk grid zarr-python's indexers take for `array` (a `zarr.Array`), as its own
    selection methods pass it: 3.4's `Array._chunk_grid` (there `metadata.chunk_grid` is only a
    description, which the indexers refuse), else 3.1's `metadata.chunk_grid`."""
    grid = getattr(array, "_chunk_grid", None)
    return array.metadata.chunk_grid if grid is None else grid


def _advanced_pieces(indexer, itemsize):
    """The reads of a coordinate, mask or advanced orthogonal selection, or None for others (and
    for an indexer whose chunks `_dimension_grids` cannot tell)."""
    from zarr.core.indexing import CoordinateIndexer, OrthogonalIndexer

    if isinstance(indexer, CoordinateIndexer):
        read = _point_pieces
    elif isinstance(indexer, OrthogonalIndexer) and getattr(indexer, "is_advanced", False):
        read = _orthogonal_pieces
    else:
        return None
    if any(n == 0 for n in indexer.shape):
        return []  # nothing selected, nothing read
    return read(indexer, itemsize)


def _place(out, piece, box, xp):
    """Put `piece`'s elements of `box` (its box read) in their places of `out`."""
    values = piece.take(box, xp)
    if isinstance(piece.put, list):
        out[xp.ix_(*[xp.asarray(p) for p in piece.put])] = values
    elif isinstance(piece.put, slice):
        out[piece.put] = values
    else:
        out[xp.asarray(piece.put)] = values


def _assemble(indexer, pieces, dtype, read_box, xp):
    """The selection's result (`indexer.shape`) from its pieces, each box read by `read_box(lo,
    hi)` as an array of module `xp` (what the CPU tests run with numpy)."""
    out = xp.empty(indexer.shape, dtype=dtype)
    for piece in pieces:
        _place(out, piece, read_box(piece.lo, piece.hi), xp)
    return out


def _advanced_plan(array, indexer, prototype, fields):
    """For an array whose codec pipeline is this one: the zarrs_gpu array, the reads of an
    advanced selection (coordinates, a mask, orthogonal integer or Boolean arrays) that
    zarr-python cannot serve into GPU buffers, and the dtype; or None."""
    root = None if len(array.shape) == 0 else _device_root(array, prototype, fields)
    if root is None:
        return None
    import cupy

    dtype = array.metadata.dtype.to_native_dtype()
    gpu_array = _open_array(root, array.store_path.path, cupy.cuda.Device().id)
    if gpu_array is None or gpu_array.shape != tuple(array.shape) or str(dtype) != str(gpu_array.dtype):
        return None
    try:
        pieces = _advanced_pieces(indexer, dtype.itemsize)
    except AttributeError:
        # An indexer without the fields this reads (a zarr-python this was not written against):
        # declined, zarr-python reads the selection its own way.
        return None
    if pieces is None:
        return None
    return gpu_array, pieces, dtype


async def _read_advanced(gpu_array, indexer, pieces, dtype):
    """Read an advanced selection's boxes with zarrs_gpu, one after the other, and gather their
    elements on the device (CuPy) into a new array of `indexer.shape`."""
    import cupy

    out = cupy.empty(indexer.shape, dtype=dtype)
    for piece in pieces:
        key = tuple(slice(a, b) for a, b in zip(piece.lo, piece.hi))
        box = await asyncio.to_thread(gpu_array.__getitem__, key)
        _place(out, piece, cupy.from_dlpack(box), cupy)
    with GpuCodecPipeline._lock:
        GpuCodecPipeline.device_reads += 1
    return out


def _box_key(indexer):
    """The box a basic or orthogonal indexer selects (slices of step 1 and integers), as a key of
    zarrs_gpu's `read`/`write`, or None."""
    kind = type(indexer).__name__
    if kind not in ("BasicIndexer", "OrthogonalIndexer") or getattr(indexer, "is_advanced", False):
        return None
    key = []
    for dim in indexer.dim_indexers:
        name = type(dim).__name__
        if name == "SliceDimIndexer" and dim.step == 1 and dim.stop > dim.start:
            key.append(slice(dim.start, dim.stop))
        elif name == "IntDimIndexer":
            key.append(dim.dim_sel)
        else:
            return None
    return tuple(key)


def _cuda_device(value):
    """The CUDA device a DLPack value lives on, or None (host memory, or not DLPack)."""
    try:
        kind, device = value.__dlpack_device__()
    except (AttributeError, TypeError, ValueError):
        return None
    # kDLCUDA (2) and kDLCUDAManaged (13).
    return int(device) if int(kind) in (2, 13) else None


def _same_dtype(value, dtype):
    """Whether a device value holds `dtype`'s elements (byte order aside: zarrs stores it as the
    array's codecs say)."""
    import numpy as np

    name = str(value.dtype).removeprefix("torch.")
    try:
        return np.dtype(name).newbyteorder("=") == np.dtype(dtype).newbyteorder("=")
    except TypeError:
        return False


def _c_contiguous(value):
    flags = getattr(value, "flags", None)
    if flags is not None:
        return bool(flags.c_contiguous)
    is_contiguous = getattr(value, "is_contiguous", None)
    return bool(is_contiguous()) if callable(is_contiguous) else False


def _write_plan(array, indexer, value, fields):
    """For an array whose codec pipeline is this one: the writable zarrs_gpu array and the key of
    a write of `value` zarrs_gpu does (a C-contiguous device value of the array's dtype and the
    box's shape, into a regular-grid array of a store `zarr_python_root` names that erases chunks of fill
    value, as zarrs does), or None for zarr-python's own way."""
    if not isinstance(array.codec_pipeline, GpuCodecPipeline) or fields:
        return None
    store = array.store_path.store
    root = zarr_python_root(store)
    if root is None or getattr(array.config, "write_empty_chunks", False):
        return None
    # A read-only array or store: zarr-python's own write raises.
    if getattr(store, "read_only", False) or getattr(array, "read_only", False):
        return None
    device = _cuda_device(value)
    if device is None or not hasattr(value, "shape") or not hasattr(value, "dtype"):
        return None
    key = _box_key(indexer)
    if key is None or tuple(value.shape) != tuple(indexer.shape) or not _c_contiguous(value):
        return None
    dtype = array.metadata.dtype.to_native_dtype()
    if not _same_dtype(value, dtype):
        return None
    gpu_array = _open_array(root, array.store_path.path, device)
    if gpu_array is None or gpu_array.regular_chunks is None or gpu_array.shape != tuple(array.shape):
        return None
    return gpu_array, key


register_pipeline(GpuCodecPipeline)
_zarr_hooks.install(sys.modules[__name__])
