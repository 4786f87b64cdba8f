"""Zarr arrays (v2 and v3) straight into NVIDIA GPU memory, through zarrs (Rust).

    import zarrs_gpu, cupy, torch
    x = zarrs_gpu.read("volume.zarr", "/0", "0:64, :, :")   # a DeviceArray on GPU 0
    c = cupy.asarray(x)                                      # no copy (CUDA array interface)
    t = torch.from_dlpack(x)                                 # no copy (DLPack)
    a = zarrs_gpu.open("volume.zarr", "/0")
    slab = a[0:64, ..., 100:200]                             # numpy-style indexing, on the GPU
    for key, tile in zarrs_gpu.tiles(a, (64, 512, 512)):      # the next tiles read meanwhile
        t = torch.from_dlpack(tile)

Chunks are read with many parallel reads into pinned memory and copied to the device, then
decoded there (zstd, gzip, zlib and Blosc with nvCOMP, crc32c, transpose, sharding); other codecs are
decoded by zarrs on the host and copied once. Errors are Python exceptions with the Rust
messages: no GPU or driver is a RuntimeError, a bad index an IndexError, a bad option a
ValueError.

Existing zarr-python code gets the same decode inside ``with zarrs_gpu.gpu_zarr_context():``
(zarr-python's GPU buffers and this package's codec pipeline, ``zarrs_gpu.pipeline``), and Dask
arrays of CuPy blocks from ``zarrs_gpu.dask.from_zarr`` (``import zarrs_gpu.dask``; needs dask), and
xarray datasets from ``xr.open_dataset(path, engine="zarrs_gpu")`` (``zarrs_gpu.xarray``; needs xarray), and
PyTorch datasets of crops as CUDA tensors from ``zarrs_gpu.torch.CropDataset`` (needs torch).
"""

# Imported under private names, deleted at the end: dir(zarrs_gpu) lists the package's API only.
import contextlib as _contextlib
from typing import Any as _Any
from typing import Iterable as _Iterable
from typing import Optional as _Optional

from ._zarrs_gpu import (
    Array,
    DeviceArray,
    PendingRead,
    ReadAhead,
    __version__,
    empty_cache,
    memory_in_use,
    open,
    read,
    tiles,
)
from ._create import create
from .errors import ArrayNotFoundError

__all__ = [
    "Array",
    "ArrayNotFoundError",
    "DeviceArray",
    "PendingRead",
    "ReadAhead",
    "create",
    "empty_cache",
    "gpu_zarr_context",
    "memory_in_use",
    "open",
    "read",
    "read_ahead",
    "tiles",
    "__version__",
]


def read_ahead(array: _Any, keys: _Iterable[_Any], *, prefetch: int = 2, device: _Optional[int] = None) -> ReadAhead:
    """Reads of ``keys`` (what ``array[key]`` takes) kept in flight on a background thread, as
    ``Array.read_ahead`` does: yields ``(box, DeviceArray)`` in order while the caller uses the
    ones before. ``array`` is a ``zarrs_gpu.Array``, or a zarr-python array in a local store
    (``zarr.storage.LocalStore``) or in an ``ObjectStore`` of obstore's S3, HTTP or local stores,
    read by zarrs_gpu on GPU ``device`` (default: CuPy's current
    device, else 0), inside ``gpu_zarr_context()`` or not; a ``zarrs_gpu.Array`` reads to the
    device it was opened for, and ``device`` is not used. Bad arguments raise here."""
    if isinstance(array, Array):
        return array.read_ahead(keys, prefetch=prefetch)
    from .pipeline import zarrs_array_of

    if device is None:
        try:
            import cupy

            device = cupy.cuda.Device().id
        except ImportError:
            device = 0
    return zarrs_array_of(array, device).read_ahead(keys, prefetch=prefetch)


@_contextlib.contextmanager
def gpu_zarr_context():
    """zarr-python with GPU buffers and this package's codec pipeline: inside, ``zarr`` reads of
    rectangular selections of arrays in local stores (and in ``ObjectStore``s of obstore's S3,
    HTTP and local stores) are decoded on the GPU by zarrs_gpu into
    zarr-python's CuPy output (see ``zarrs_gpu.pipeline``); the rest is zarr-python's own work.
    Needs CuPy (zarr-python's GPU buffers are CuPy arrays): without it, an ImportError at once."""
    try:
        import cupy  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "zarrs_gpu.gpu_zarr_context() needs CuPy: zarr-python's GPU buffers are CuPy arrays "
            "(install cupy-cuda12x or cupy-cuda13x, the one for your CUDA version)"
        ) from err
    import zarr

    from .pipeline import GpuCodecPipeline

    path = f"{GpuCodecPipeline.__module__}.{GpuCodecPipeline.__qualname__}"
    with zarr.config.enable_gpu(), zarr.config.set({"codec_pipeline.path": path}):
        yield


def __dir__():
    """The API (``__all__``), the public submodules imported so far and the module's dunders: not
    the private modules (``_zarrs_gpu``, ``_create``, ...), which stay importable by name."""
    public = {"dask", "errors", "pipeline", "torch", "xarray"}
    names = set(__all__) | {n for n in globals() if n in public or (n.startswith("__") and n.endswith("__"))}
    return sorted(names)


del _contextlib, _Any, _Iterable, _Optional
