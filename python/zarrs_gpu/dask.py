"""Dask arrays whose blocks zarrs_gpu reads on the GPU: ``from_zarr`` is ``dask.array.from_zarr``
with the chunks decoded on the device of the worker that runs each task, blocks that are CuPy
arrays.

    import zarrs_gpu.dask
    x = zarrs_gpu.dask.from_zarr("volume.zarr", "/0")   # dask.array.Array of CuPy blocks
    x.mean().compute()                                    # threaded scheduler: the current GPU

Blocks, by default, are whole chunks of the array's chunk grid (its shards, when sharded), several
to a block so that each task reads in bulk (``plan_chunks`` has the rule); ``chunks=`` takes any
dask chunks spec instead. The graph holds only plain values, the store's path, the array's path,
the device choice and each block's box, so it pickles and runs on any worker that sees the store:
each task opens the array (once per process, per path and device) and reads its box.

``to_zarr(x, "result.zarr", "/0")`` writes a dask array (CuPy blocks encoded on their GPU) into an
existing array whose chunks its blocks align with.

Needs dask (``pip install 'zarrs-gpu[dask]'``) and, to read, CuPy; dask is imported when a function
here is called, so ``import zarrs_gpu`` works without it.

With ``distributed``, one worker per GPU, each a process that sees only its GPU:

    from distributed import Client
    with zarrs_gpu.dask.local_cluster() as cluster, Client(cluster) as client:
        x.mean().compute()                                # every GPU of this host

``local_cluster`` starts dask-cuda's ``LocalCUDACluster`` where dask_cuda imports, else a
``distributed.LocalCluster`` of worker processes, each with its own ``CUDA_VISIBLE_DEVICES``.
Workers started otherwise (``dask worker`` on other hosts) take ``--preload zarrs_gpu.dask`` so
that CuPy blocks can be sent between them (``register_cupy_serialization``). These need
distributed (``pip install 'zarrs-gpu[distributed]'``); their code is in ``zarrs_gpu._cluster``.

Tests read on the host by replacing ``reader`` (and ``make_meta``) in this module, see their
docstrings.
"""

import contextlib
import math
import os
import threading
from typing import Any, Callable, Optional, Sequence

from ._cluster import dask_setup, ensure_cupy_serialization, local_cluster, register_cupy_serialization, worker_devices
from ._common import DASK_CUPY_NEEDED as _CUPY_NEEDED
from ._common import box_text, missing_dependency
from ._common import with_context as _with_context

__all__ = ["BLOCK_BYTES", "dask_setup", "from_zarr", "local_cluster", "make_meta", "plan_chunks", "read_on_device",
           "reader", "register_cupy_serialization", "to_zarr", "worker_devices"]

#: The size a default block aims at: whole chunks (shards) are put together up to this many bytes.
BLOCK_BYTES = 512 * 2**20

def plan_chunks(shape: Sequence[int], unit: Sequence[int], itemsize: int,
                block_bytes: int = BLOCK_BYTES) -> tuple[tuple[int, ...], ...]:
    """Dask chunks (a tuple of block sizes per axis) made of whole ``unit`` chunks (the array's
    chunk grid: shards when sharded), for an array of ``shape``.

    The rule: axes are filled from the last to the first, as C order lays the array out. Each
    axis takes as many unit chunks as keep the block within ``block_bytes`` (at least one), up to
    all of its chunks; once an axis cannot take all of its chunks, the axes before it take one
    chunk each. The chunks an axis takes are then spread evenly over the blocks that axis needs
    (33 chunks at up to 32 a block are blocks of 17 and 16 chunks, not 32 and 1). A block is
    therefore never more than ``max(block_bytes, one unit chunk)`` bytes, and every block
    boundary is a chunk boundary; the last block along an axis ends at the array's edge (a
    partial chunk there is read as zarr reads it)."""
    if len(unit) != len(shape):
        raise ValueError(f"the chunk shape {tuple(unit)} does not have the array's {len(shape)} dimensions")
    if any(u <= 0 for u in unit):
        raise ValueError(f"the chunk shape {tuple(unit)} has an empty axis")
    budget = max(1, block_bytes // max(1, itemsize))  # elements a block may hold
    # A chunk's extent where it lies in the array (a chunk longer than its axis is the axis).
    extent = [max(1, min(u, s)) for u, s in zip(unit, shape)]
    taken = [1] * len(shape)  # unit chunks per block, per axis
    elements = 1  # of the block along the axes filled so far
    for axis in reversed(range(len(shape))):
        count = max(1, math.ceil(shape[axis] / unit[axis]))  # chunks along the axis
        before = math.prod(extent[:axis])  # the axes before take one chunk at least
        fit = max(1, budget // (elements * extent[axis] * before))
        if fit < count:
            blocks = math.ceil(count / fit)
            taken[axis] = math.ceil(count / blocks)
            break
        taken[axis] = count
        elements *= min(shape[axis], count * unit[axis]) or 1
    chunks = []
    for size, u, k in zip(shape, unit, taken):
        step = u * k
        if size == 0:
            chunks.append((0,))
            continue
        sizes = [step] * (size // step)
        if size % step:
            sizes.append(size % step)
        chunks.append(tuple(sizes))
    return tuple(chunks)


def _boxes(chunks: Sequence[Sequence[int]]):
    """(block index, box) for every block of ``chunks``, in C order; a box is a tuple of
    ``(start, stop)`` per axis."""
    import itertools

    bounds = []
    for sizes in chunks:
        starts = [0]
        for s in sizes:
            starts.append(starts[-1] + s)
        bounds.append([(starts[i], starts[i + 1]) for i in range(len(sizes))])
    for index in itertools.product(*[range(len(b)) for b in bounds]):
        yield index, tuple(bounds[axis][i] for axis, i in enumerate(index))


def _current_device() -> int:
    try:
        import cupy
    except ImportError as err:
        raise ImportError(_CUPY_NEEDED) from err
    return cupy.cuda.Device().id


def _open(path: str, array: str, device: int):
    """The array, opened once per process for each (path, array, device) and again whenever its
    metadata file changes (``zarrs_gpu._arrays``): a long-lived worker must not read an array
    rewritten in place (another data type or fill value) with its old metadata."""
    from ._arrays import open_at, open_cached

    opened = open_cached(path, array.strip("/"), device)
    # None: not an array zarrs can open; zarrs_gpu.open then raises the error naming why.
    return opened if opened is not None else open_at(path, array, device=device)


def read_on_device(path: str, array: str, device: Optional[int], box: tuple[tuple[int, int], ...]) -> Any:
    """The default ``reader``: the ``box`` (``(start, stop)`` per axis) of ``array`` in the store
    at ``path``, read by zarrs_gpu on GPU ``device`` (None: this thread's current CUDA device, as
    CuPy sees it), as a CuPy array (DLPack, no copy)."""
    try:
        import cupy
    except ImportError as err:
        raise ImportError(_CUPY_NEEDED) from err
    if device is None:
        device = cupy.cuda.Device().id
    a = _open(path, array, device)
    x = a[tuple(slice(start, stop) for start, stop in box)]
    with cupy.cuda.Device(device):
        return cupy.from_dlpack(x)

#: What each task calls to read its block: ``reader(path, array, device, box)``, ``box`` a tuple of
#: ``(start, stop)`` per axis, returning an array of the box's shape. Looked up when the task runs,
#: so tests may replace it (with a zarr-python read on the host, say) for the threaded scheduler.
reader: Callable[[str, str, Optional[int], tuple[tuple[int, int], ...]], Any] = read_on_device


def make_meta(dtype: Any, ndim: int) -> Any:
    """The ``meta`` of the dask array: an empty CuPy array of ``dtype`` and ``ndim`` dimensions
    (an ImportError saying CuPy is needed without it). Tests that replace ``reader`` with a host
    read replace this too (a numpy array)."""
    try:
        import cupy
    except ImportError as err:
        raise ImportError(_CUPY_NEEDED) from err
    return cupy.empty((0,) * ndim, dtype=dtype)


def _reads_at_once() -> Optional[int]:
    """``ZARRS_GPU_DASK_READS``: at most how many block reads one process runs at once on one
    device; unset, no limit. Read when the first gate is made."""
    text = os.environ.get("ZARRS_GPU_DASK_READS")
    if text is None or text.strip() == "":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"ZARRS_GPU_DASK_READS must be a whole number of 1 or more, not {text!r}")
    return n


_gates: dict = {}
_gates_lock = threading.Lock()


def _read_gate(device: Optional[int]) -> Any:
    """The gate of ``device``'s block reads in this process: a semaphore of
    ``ZARRS_GPU_DASK_READS`` where that is set, else no gate. Concurrent reads share the host
    threads and pinned buffers without contending (on the GPU host a 16 GiB reduction under 16
    dask threads ran at 18 to 22 GiB/s with reads unlimited, 10.9 with one read at a time); the
    limit is for a process that must bound the device memory its reads hold at once."""
    with _gates_lock:
        if device not in _gates:
            n = _reads_at_once()
            _gates[device] = contextlib.nullcontext() if n is None else threading.BoundedSemaphore(n)
        return _gates[device]


def _thread_device() -> Optional[int]:
    """The device a read with ``device=None`` lands on: this thread's current CUDA device (CuPy's),
    None without CuPy (host reads in tests)."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy.cuda.Device().id


def _read_block(path: str, array: str, device: Optional[int], box: tuple[tuple[int, int], ...]) -> Any:
    """One task: read ``box`` with this module's ``reader`` (through the device's read gate); an
    error names the store, the array and the box."""
    ensure_cupy_serialization()  # a distributed worker started without the preload sends its blocks on
    try:
        with _read_gate(device if device is not None else _thread_device()):
            block = reader(path, array, device, box)
    except Exception as err:
        new = _with_context(err, f"zarrs_gpu.dask: reading {box_text(box)} of array {array!r} in {path!r}")
        if new is err:
            raise
        raise new from err
    expected = tuple(stop - start for start, stop in box)
    if tuple(block.shape) != expected:
        raise ValueError(f"zarrs_gpu.dask: reading {box_text(box)} of array {array!r} in {path!r} gave shape "
                         f"{tuple(block.shape)}, not {expected}")
    return block


def from_zarr(store: Any, array: str = "/", chunks: Any = None, device: Optional[int] = None, *,
              block_bytes: int = BLOCK_BYTES, storage_options: Optional[dict] = None) -> Any:
    """A ``dask.array.Array`` of the Zarr array ``array`` in the filesystem store at ``store``
    (a path), whose blocks are read by zarrs_gpu on the GPU of the worker that runs each task:
    GPU ``device`` where given, else that worker thread's current CUDA device (with one worker
    per GPU, dask-cuda's or ``CUDA_VISIBLE_DEVICES``, its own GPU). Blocks are CuPy arrays;
    ``meta`` is an empty CuPy array of the dtype.

    ``chunks`` None: blocks of whole chunks of the array's grid (shards, when sharded), up to
    ``block_bytes`` each (``plan_chunks``). Otherwise any dask chunks spec (``"auto"``, a block
    shape, explicit sizes per axis, -1 for a whole axis), normalized by dask with the grid's
    chunks as the previous chunks; blocks that split chunks are correct, but read those chunks
    once per block.

    ``store`` may be an object store's URL (``s3://bucket/prefix``, ``https://host/prefix``)
    with ``storage_options`` (as ``zarrs_gpu.open`` takes them): every worker reads from the
    store itself, the options travelling in the graph.

    The metadata is read here (no GPU needed); the path is made absolute, so workers on other
    hosts need the store at the same path. Errors name the store and the array (never the
    storage options)."""
    try:
        import dask.array as da
        from dask.array.core import normalize_chunks
        from dask.base import tokenize
        from dask.highlevelgraph import HighLevelGraph
        import numpy as np
    except ImportError as err:
        raise missing_dependency(err, "zarrs_gpu.dask.from_zarr", "dask") from err

    from ._arrays import location, open_at

    path = location(store, storage_options, "zarrs_gpu.dask.from_zarr")
    if not isinstance(array, str):
        raise TypeError(f"zarrs_gpu.dask.from_zarr: array must be a str (the array's path in the store), "
                        f"not {type(array).__name__}")
    if device is not None and (not isinstance(device, int) or isinstance(device, bool) or device < 0):
        raise ValueError(f"zarrs_gpu.dask.from_zarr: device must be a GPU ordinal (0 or more) or None, "
                         f"not {device!r}")
    where = f"zarrs_gpu.dask.from_zarr: array {array!r} in {path!r}"
    try:
        a = open_at(path, array, device=0 if device is None else device)
        shape, dtype_name, unit = tuple(a.shape), a.dtype, a.regular_chunks
    except Exception as err:
        new = _with_context(err, where)
        if new is err:
            raise
        raise new from err
    del a  # the graph holds no handle
    try:
        dtype = np.dtype(dtype_name)
    except TypeError as err:
        raise TypeError(f"{where}: its data type {dtype_name!r} is not one numpy (and so dask) knows") from err
    if unit is None:
        unit = tuple(max(1, s) for s in shape)  # an irregular grid: the whole array is one unit
        unit_known = False
    else:
        unit = tuple(unit)
        unit_known = True
    if chunks is None:
        if unit_known:
            block_chunks = plan_chunks(shape, unit, dtype.itemsize, block_bytes)
        else:
            block_chunks = normalize_chunks("auto", shape, limit=block_bytes, dtype=dtype)
    else:
        try:
            block_chunks = normalize_chunks(chunks, shape, limit=block_bytes, dtype=dtype,
                                            previous_chunks=unit if unit_known else None)
        except Exception as err:
            new = _with_context(err, f"{where}: chunks={chunks!r}")
            if new is err:
                raise
            raise new from err
    meta = make_meta(dtype, len(shape))
    ensure_cupy_serialization()  # the client receives the results
    name = "zarrs-gpu-from-zarr-" + tokenize(path, array, device, shape, str(dtype), block_chunks)
    dsk = {(name, *index): (_read_block, path, array, device, box) for index, box in _boxes(block_chunks)}
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, block_chunks, meta=meta)


def _store_block(block: Any, path: str, array: str, device: Optional[int], block_info: Any = None) -> Any:
    """One task of ``to_zarr``: ``block`` written into its place of the array (opened for writing
    on ``device``, else the block's own device for a CuPy block, else GPU 0); a count of 1."""
    import numpy as np

    from ._arrays import open_at

    box = tuple(tuple(loc) for loc in block_info[0]["array-location"])
    block_device = getattr(block, "device", None)
    if device is None:
        # CuPy's device has .id, PyTorch's .index (None on the CPU); numpy's is the string "cpu".
        ordinals = (getattr(block_device, attr, None) for attr in ("id", "index"))
        device = next((o for o in ordinals if isinstance(o, int) and not isinstance(o, bool)), 0)
    if type(block).__module__.startswith("cupy"):
        import cupy

        block = cupy.ascontiguousarray(block)  # a view (transposed, sliced) is written as its values
    try:
        a = open_at(path, array, device=device, mode="r+")
        a.write(tuple(slice(start, stop) for start, stop in box), block)
    except Exception as err:
        new = _with_context(err, f"zarrs_gpu.dask.to_zarr: writing {box_text(box)} of array {array!r} in {path!r}")
        if new is err:
            raise
        raise new from err
    return np.ones((1,) * len(box), dtype=np.int64)


def to_zarr(x: Any, store: Any, array: str = "/", *, device: Optional[int] = None, compute: bool = True,
            storage_options: Optional[dict] = None) -> Any:
    """Write the dask array ``x`` into the existing Zarr array ``array`` of the filesystem store at
    ``store`` (a path, or an object store's URL with ``storage_options``; create the array
    first, with zarr-python or zarrs, of ``x``'s shape): each
    block by the task that makes it. CuPy blocks are encoded on their GPU where the array's codecs
    allow (``Array.write``), other blocks are written through numpy and zarrs.

    Every block boundary must fall on a boundary of the array's chunks (its shards, when sharded),
    so that no two tasks write one chunk: a ValueError names the axis otherwise (``x.rechunk``
    to the array's chunks first). ``compute=False`` returns the dask array of the writes (a 1 per
    block) for ``dask.compute`` to run with others."""
    try:
        import numpy as np
    except ImportError as err:
        raise missing_dependency(err, "zarrs_gpu.dask.to_zarr", "dask") from err

    from ._arrays import location, open_at

    path = location(store, storage_options, "zarrs_gpu.dask.to_zarr")
    where = f"zarrs_gpu.dask.to_zarr: array {array!r} in {path!r}"
    try:
        a = open_at(path, array, mode="r+")
        shape, unit = tuple(a.shape), a.regular_chunks
    except Exception as err:
        new = _with_context(err, where)
        if new is err:
            raise
        raise new from err
    if tuple(x.shape) != shape:
        raise ValueError(f"{where}: the dask array has shape {tuple(x.shape)}, the Zarr array {shape}")
    # Blocks of another dtype are cast as numpy's assignment casts (device blocks are written only
    # in the array's own dtype).
    if isinstance(a.dtype, str):
        raise TypeError(f"{where}: its data type {a.dtype} needs ml_dtypes for dask to know it")
    if x.dtype != a.dtype:
        x = x.astype(a.dtype)
    del a
    if unit is None:
        raise ValueError(f"{where}: its chunk grid is not regular; to_zarr writes arrays of regular chunks")
    for axis, (sizes, step) in enumerate(zip(x.chunks, unit)):
        ends = np.cumsum(sizes)[:-1]
        if any(end % step for end in ends):
            raise ValueError(f"{where}: blocks on axis {axis} ({tuple(sizes)}) do not end on its chunks of {step}: "
                             f"two tasks would write one chunk (x.rechunk({tuple(unit)}) first)")
    writes = x.map_blocks(_store_block, path, array, device, dtype=np.int64,
                          chunks=tuple((1,) * len(c) for c in x.chunks), meta=np.empty((0,) * x.ndim, np.int64))
    if not compute:
        return writes
    writes.sum().compute()
    return None
