"""distributed's side of zarrs_gpu.dask: one worker process per GPU (``local_cluster``), and CuPy
arrays made sendable between workers (``register_cupy_serialization``, run by the worker preload
``zarrs_gpu.dask``'s ``dask_setup``). The public names are zarrs_gpu.dask's; distributed is imported
when a function here is called."""

import functools
import itertools
import os
import sys
from typing import Any, Mapping, Optional, Sequence, Union

from ._common import DASK_CUPY_NEEDED, require

#: The module workers preload (``dask worker --preload zarrs_gpu.dask``): its ``dask_setup``.
PRELOAD = "zarrs_gpu.dask"

#: Whether ``register_cupy_serialization`` has run in this process.
_serialization_ready = False


def ensure_cupy_serialization() -> None:
    """``register_cupy_serialization`` in a process where distributed is loaded and it has not run
    (a client, or a worker started without the preload: its blocks may still be sent on)."""
    if not _serialization_ready and "distributed" in sys.modules:
        register_cupy_serialization()


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
        raise ImportError(DASK_CUPY_NEEDED) from err
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
            if PRELOAD not in preload:
                preload.append(PRELOAD)
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
    require("distributed", "zarrs_gpu.dask.local_cluster", "distributed")
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
