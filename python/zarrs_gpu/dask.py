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

Needs dask (``pip install 'dask[array]'``) and, to read, CuPy; dask is imported when a function
here is called, so ``import zarrs_gpu`` works without it.

With ``distributed``, one worker per GPU, each a process that sees only its GPU:

    from distributed import Client
    with zarrs_gpu.dask.local_cluster() as cluster, Client(cluster) as client:
        x.mean().compute()                                # every GPU of this host

``local_cluster`` starts dask-cuda's ``LocalCUDACluster`` where dask_cuda imports, else a
``distributed.LocalCluster`` of worker processes, each with its own ``CUDA_VISIBLE_DEVICES``.
Workers started otherwise (``dask worker`` on other hosts) take ``--preload zarrs_gpu.dask`` so
that CuPy blocks can be sent between them (``register_cupy_serialization``).

Tests read on the host by replacing ``reader`` (and ``make_meta``) in this module, see their
docstrings.
"""

import contextlib
import functools
import itertools
import math
import os
import sys
import threading
from typing import Any, Callable, Mapping, Optional, Sequence, Union

__all__ = ["BLOCK_BYTES", "dask_setup", "from_zarr", "local_cluster", "make_meta", "plan_chunks", "read_on_device",
           "reader", "register_cupy_serialization", "worker_devices"]

#: The size a default block aims at: whole chunks (shards) are put together up to this many bytes.
BLOCK_BYTES = 512 * 2**20

_CUPY_NEEDED = ("zarrs_gpu.dask needs CuPy: its blocks are CuPy arrays on the GPU (install cupy-cuda12x or "
                "cupy-cuda13x, the one for your CUDA version)")


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
    import zarrs_gpu

    from ._arrays import open_cached

    opened = open_cached(path, array.strip("/"), device)
    # None: not an array zarrs can open; zarrs_gpu.open then raises the error naming why.
    return opened if opened is not None else zarrs_gpu.open(path, array, device=device)


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


#: Whether ``register_cupy_serialization`` has run in this process.
_serialization_ready = False

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
    if not _serialization_ready and "distributed" in sys.modules:
        # A distributed worker started without the preload: its blocks may still be sent on.
        register_cupy_serialization()
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


def box_text(box: tuple[tuple[int, int], ...]) -> str:
    """A box as numpy-style slices: ``[0:64, 0:512]``."""
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in box) + "]"


def _with_context(err: Exception, where: str) -> Exception:
    """``err``'s type with ``where`` before its message, or ``err`` itself where its type cannot
    be made from one message. An OSError keeps its errno and file name (``FileNotFoundError``
    handlers read them)."""
    try:
        if isinstance(err, OSError) and err.errno is not None:
            new = type(err)(err.errno, f"{where}: {err.strerror}", *(() if err.filename is None else (err.filename,)))
        else:
            new = type(err)(f"{where}: {err}")
    except Exception:
        return err
    return new if isinstance(new, type(err)) else err


def from_zarr(store: Any, array: str = "/", chunks: Any = None, device: Optional[int] = None, *,
              block_bytes: int = BLOCK_BYTES) -> Any:
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

    The metadata is read here (no GPU needed); the path is made absolute, so workers on other
    hosts need the store at the same path. Errors name the store and the array."""
    import dask.array as da
    from dask.array.core import normalize_chunks
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    import numpy as np

    import zarrs_gpu

    path = os.path.abspath(os.fspath(store))
    if not isinstance(array, str):
        raise TypeError(f"zarrs_gpu.dask.from_zarr: array must be a str (the array's path in the store), "
                        f"not {type(array).__name__}")
    if device is not None and (not isinstance(device, int) or isinstance(device, bool) or device < 0):
        raise ValueError(f"zarrs_gpu.dask.from_zarr: device must be a GPU ordinal (0 or more) or None, "
                         f"not {device!r}")
    where = f"zarrs_gpu.dask.from_zarr: array {array!r} in {path!r}"
    try:
        a = zarrs_gpu.open(path, array, device=0 if device is None else device)
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
    if not _serialization_ready and "distributed" in sys.modules:
        register_cupy_serialization()  # the client receives the results
    name = "zarrs-gpu-from-zarr-" + tokenize(path, array, device, shape, str(dtype), block_chunks)
    dsk = {(name, *index): (_read_block, path, array, device, box) for index, box in _boxes(block_chunks)}
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=())
    return da.Array(graph, name, block_chunks, meta=meta)


# ---------------------------------------------------------------------------------------------
# distributed: one worker process per GPU.

def register_cupy_serialization() -> str:
    """Let CuPy arrays (blocks, partial results of reductions) be sent between distributed's
    workers and to the client from this process; returns how: ``"distributed"``, ``"pickle"``,
    or ``"no cupy"`` (nothing to do).

    distributed's own CuPy serializer (``distributed.protocol.cupy``, tried first) needs rmm or
    numba; without them its lazy registration raises ImportError the first time a CuPy array is
    sent, and the send fails ("Could not serialize object of type ndarray"). Where it cannot
    load, CuPy arrays are handed to distributed's pickle serializer instead (CuPy pickles
    through a host copy, as distributed's own serializer copies to the host for TCP), which the
    receiving process needs nothing for. Idempotent; needs distributed. Run in every worker by
    ``--preload zarrs_gpu.dask`` (``dask_setup``) and by ``local_cluster``'s workers."""
    global _serialization_ready
    try:
        import cupy
    except ImportError:
        _serialization_ready = True
        return "no cupy"
    import importlib

    try:
        importlib.import_module("distributed.protocol.cupy")  # registers distributed's serializer
        how = "distributed"
    except ImportError:
        from distributed.protocol.serialize import dask_serialize

        def refuse(x):
            # distributed's serialize() takes NotImplementedError as "try the next family".
            raise NotImplementedError("CuPy arrays are pickled: distributed's CuPy serializer needs rmm or numba")

        # Registered for the class itself, so the failing lazy registration is never tried.
        dask_serialize.register(cupy.ndarray)(refuse)
        how = "pickle"
    _serialization_ready = True
    return how


def dask_setup(worker: Any) -> None:
    """distributed's preload hook (``dask worker --preload zarrs_gpu.dask``): makes CuPy blocks
    sendable from the worker (``register_cupy_serialization``)."""
    register_cupy_serialization()


def _visible_gpus(environ: Mapping[str, str]) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: its own
    ``CUDA_VISIBLE_DEVICES`` where set, else ``0 .. n-1`` for the n GPUs CUDA counts."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    try:
        import cupy
    except ImportError as err:
        raise ImportError(_CUPY_NEEDED) from err
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError:
        count = 0  # no driver, or no device
    return [str(i) for i in range(count)]


def worker_devices(n_workers: Optional[int] = None, devices: Optional[Sequence[Union[int, str]]] = None,
                   environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The ``CUDA_VISIBLE_DEVICES`` value of each worker ``local_cluster`` starts, one GPU each.

    ``devices`` None: the first ``n_workers`` GPUs this process sees (all of them when
    ``n_workers`` is None). Otherwise one worker per entry: an int is a CUDA ordinal as this
    process sees it (mapped through its own ``CUDA_VISIBLE_DEVICES`` where set: with ``"2,3"``,
    ``1`` is GPU 3), a str is passed as it is (``"GPU-<uuid>"``, ``"MIG-<uuid>"``); an entry may
    repeat, putting several workers on one GPU. ``environ`` defaults to ``os.environ``."""
    environ = os.environ if environ is None else environ
    if n_workers is not None and (not isinstance(n_workers, int) or isinstance(n_workers, bool) or n_workers < 1):
        raise ValueError(f"zarrs_gpu.dask.local_cluster: n_workers must be 1 or more, not {n_workers!r}")
    if devices is None:
        visible = _visible_gpus(environ)
        if not visible:
            raise RuntimeError("zarrs_gpu.dask.local_cluster: no GPU is visible to this process "
                               f"(CUDA_VISIBLE_DEVICES={environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                               "one worker per GPU needs one")
        n = len(visible) if n_workers is None else n_workers
        if n > len(visible):
            raise ValueError(f"zarrs_gpu.dask.local_cluster: n_workers={n} but {len(visible)} GPU(s) are visible "
                             f"({', '.join(visible)}); give devices=[0, 0, ...] to put several workers on one GPU")
        return visible[:n]
    if isinstance(devices, (str, int)):
        raise TypeError(f"zarrs_gpu.dask.local_cluster: devices must be a sequence (one entry per worker), "
                        f"not {devices!r}")
    devices = list(devices)
    if not devices:
        raise ValueError("zarrs_gpu.dask.local_cluster: devices is empty (one entry per worker)")
    if n_workers is not None and n_workers != len(devices):
        raise ValueError(f"zarrs_gpu.dask.local_cluster: n_workers={n_workers} but {len(devices)} devices "
                         f"{devices!r} (one worker per entry)")
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    parent = None if listed is None else [e.strip() for e in listed.split(",") if e.strip()]
    out = []
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, (int, str)):
            raise TypeError(f"zarrs_gpu.dask.local_cluster: a device is a CUDA ordinal (int) or a "
                            f"CUDA_VISIBLE_DEVICES entry (str), not {d!r}")
        if isinstance(d, str):
            if not d.strip() or "," in d:
                raise ValueError(f"zarrs_gpu.dask.local_cluster: device {d!r} is not one CUDA_VISIBLE_DEVICES entry")
            out.append(d.strip())
        elif d < 0:
            raise ValueError(f"zarrs_gpu.dask.local_cluster: device {d} is negative")
        elif parent is None:
            out.append(str(d))
        elif d < len(parent):
            out.append(parent[d])
        else:
            raise ValueError(f"zarrs_gpu.dask.local_cluster: device {d} but this process sees "
                             f"CUDA_VISIBLE_DEVICES={listed!r} ({len(parent)} GPU(s))")
    return out


@functools.lru_cache(maxsize=None)
def _local_gpu_cluster_class():
    """``LocalGPUCluster``, made on first use (distributed is imported then, not with this module)."""
    from distributed import LocalCluster, Nanny

    class GpuNanny(Nanny):
        """A nanny whose worker process sees one GPU: ``CUDA_VISIBLE_DEVICES`` is in the environment
        the nanny sets in the new process before the worker starts (before anything there can
        touch CUDA), and again after every restart."""

        _unnamed = itertools.count()

        def __init__(self, *args, gpu_devices: Sequence[str], gpu_env: Mapping[str, str], name: Any = None,
                     env: Optional[dict] = None, **kwargs):
            # LocalCluster names its workers 0, 1, ... (scale() goes on counting): worker i gets
            # the i-th device, round robin past the end.
            index = name if isinstance(name, int) and not isinstance(name, bool) else next(GpuNanny._unnamed)
            self.gpu = gpu_devices[index % len(gpu_devices)]
            env = {**(env or {}), **gpu_env, "CUDA_VISIBLE_DEVICES": self.gpu}
            super().__init__(*args, name=name, env=env, **kwargs)

    class LocalGPUCluster(LocalCluster):
        """A ``distributed.LocalCluster`` of worker processes, one per entry of ``devices``
        (``CUDA_VISIBLE_DEVICES`` values), each seeing only that GPU (as its device 0) and
        preloading ``zarrs_gpu.dask``; ``worker_env`` is added to every worker's environment.
        ``scale(n)`` adds workers on the devices round robin."""

        def __init__(self, devices: Sequence[str], threads_per_worker: int = 4,
                     worker_env: Optional[Mapping[str, str]] = None, **kwargs):
            import dask

            if kwargs.get("processes", True) is False:
                raise ValueError("zarrs_gpu.dask.local_cluster: processes=False would put every worker in one "
                                 "process, seeing the same GPU; one GPU per worker needs processes")
            kwargs.pop("processes", None)
            preload = list(kwargs.pop("preload", None) or dask.config.get("distributed.worker.preload") or [])
            if __name__ not in preload:
                preload.append(__name__)
            self.devices = tuple(devices)
            super().__init__(n_workers=len(self.devices), threads_per_worker=threads_per_worker, processes=True,
                             worker_class=GpuNanny, gpu_devices=self.devices, gpu_env=dict(worker_env or {}),
                             preload=preload, **kwargs)

    return LocalGPUCluster


def local_cluster(n_workers: Optional[int] = None, *, devices: Optional[Sequence[Union[int, str]]] = None,
                  threads_per_worker: int = 4, dask_cuda: Optional[bool] = None,
                  reader_threads: Optional[int] = None, **kwargs: Any) -> Any:
    """A local Dask cluster of one worker process per GPU, for ``distributed.Client(cluster)``:
    tasks of ``from_zarr`` arrays then read on the GPU of the worker that runs them
    (``device=None``: the worker's own GPU).

    Workers: one per GPU this process sees (``n_workers``: the first that many), or one per
    entry of ``devices`` (see ``worker_devices``: ordinals as this process sees them, or
    ``CUDA_VISIBLE_DEVICES`` entries; ``devices=[0, 0]`` puts two workers on GPU 0), each with
    ``threads_per_worker`` threads (4 by default: a worker's next reads then run beside its
    reductions; on the GPU host one worker reduced 16 GiB at 14.0 GiB/s with 4 threads, 7.9 with
    one). ``dask_cuda`` None: dask-cuda's ``LocalCUDACluster`` where
    ``dask_cuda`` imports (and no device repeats), else this module's ``LocalGPUCluster``, a
    ``distributed.LocalCluster`` whose worker processes each get ``CUDA_VISIBLE_DEVICES`` set to
    their GPU; True: dask-cuda's or an error; False: never dask-cuda's. Other keyword arguments
    go to the cluster (``dashboard_address``, ``memory_limit``, ``local_directory``, ...).

    ``reader_threads`` (``LocalGPUCluster`` only): each worker's zarrs_gpu reader threads
    (``ZARRS_GDS_NTHREADS``). None: this process's cores split evenly between the workers, so
    that workers on one host do not each start a thread per core, unless ``ZARRS_GDS_NTHREADS``
    is set here (the workers inherit it); 0: not set (each worker's reads use every core).

    Note that distributed's memory manager counts device blocks held by a worker as worker
    memory and spills them to host disk past its target (``memory_limit``); dask-cuda's cluster
    manages device memory instead."""
    if not isinstance(threads_per_worker, int) or isinstance(threads_per_worker, bool) or threads_per_worker < 1:
        raise ValueError(f"zarrs_gpu.dask.local_cluster: threads_per_worker must be 1 or more, "
                         f"not {threads_per_worker!r}")
    if reader_threads is not None and (not isinstance(reader_threads, int) or isinstance(reader_threads, bool)
                                       or not 0 <= reader_threads <= 256):
        raise ValueError(f"zarrs_gpu.dask.local_cluster: reader_threads must be None or 0 to 256, "
                         f"not {reader_threads!r}")
    if dask_cuda not in (None, True, False):
        raise ValueError(f"zarrs_gpu.dask.local_cluster: dask_cuda must be None, True or False, not {dask_cuda!r}")
    import importlib.util

    if importlib.util.find_spec("distributed") is None:
        raise ImportError("zarrs_gpu.dask.local_cluster needs distributed (pip install distributed)")
    chosen = worker_devices(n_workers, devices)
    if dask_cuda is not False:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as err:
            if dask_cuda:
                raise ImportError("zarrs_gpu.dask.local_cluster(dask_cuda=True) needs dask-cuda "
                                  "(pip install dask-cuda)") from err
            LocalCUDACluster = None
        if LocalCUDACluster is not None and len(set(chosen)) < len(chosen):
            if dask_cuda:
                raise ValueError(f"zarrs_gpu.dask.local_cluster: dask-cuda puts one worker on each GPU; "
                                 f"devices {chosen} repeat one (dask_cuda=None or False shares a GPU)")
            LocalCUDACluster = None
        if LocalCUDACluster is not None:
            # dask-cuda needs numba, so distributed's own CuPy serializer loads in its workers.
            register_cupy_serialization()
            return LocalCUDACluster(n_workers=len(chosen), CUDA_VISIBLE_DEVICES=chosen,
                                    threads_per_worker=threads_per_worker, **kwargs)
    register_cupy_serialization()  # this process (the client's, usually) sends and receives too
    worker_env = {}
    if reader_threads is None:
        if not os.environ.get("ZARRS_GDS_NTHREADS", "").strip():
            worker_env["ZARRS_GDS_NTHREADS"] = str(min(256, max(1, _cores() // len(chosen))))
    elif reader_threads > 0:
        worker_env["ZARRS_GDS_NTHREADS"] = str(reader_threads)
    return _local_gpu_cluster_class()(chosen, threads_per_worker=threads_per_worker, worker_env=worker_env,
                                      **kwargs)


def _cores() -> int:
    """The cores this process may run on (its affinity where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
