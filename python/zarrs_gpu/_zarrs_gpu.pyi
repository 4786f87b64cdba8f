"""Type stubs of the compiled module ``zarrs_gpu._zarrs_gpu`` (Rust, PyO3)."""

import os
from types import EllipsisType
from collections.abc import Iterable, Sequence
from typing import Any, Dict, Literal, Optional, SupportsIndex, TypedDict, Union, final, overload

import numpy
from typing_extensions import CapsuleType, TypeAlias

__version__: str
__all__ = [
    "Array",
    "DeviceArray",
    "PendingRead",
    "ReadAhead",
    "__version__",
    "_nvcomp_candidates",
    "_selection",
    "empty_cache",
    "memory_in_use",
    "open",
    "read",
    "tiles",
]

#: What indexes an array: an integer, a slice with step 1 (or None), ``...``, or a tuple of them.
_Index: TypeAlias = Union[SupportsIndex, slice, EllipsisType, tuple[Union[SupportsIndex, slice, EllipsisType], ...]]

class _ReadReport(TypedDict):
    """What a read did."""

    decode: str
    io: Optional[str]
    chunks: int
    missing_chunks: int
    host_decoded_chunks: int
    bytes_read: int
    #: The most device memory the read held at once (its output, staging, nvCOMP's scratch).
    peak_device_bytes: int
    #: Reads of other threads served by the same request, this one included (1: alone;
    #: ZARRS_GPU_COALESCE_WINDOW_US gathers them).
    coalesced_reads: int
    device_decoder: Optional[str]
    host_reason: Optional[str]
    schedule: Optional[str]
    stages: dict[str, float]

class _CudaArrayInterface(TypedDict):
    """The CUDA array interface, version 3."""

    shape: tuple[int, ...]
    typestr: str
    data: tuple[int, bool]
    strides: None
    stream: None
    version: int

class _WriteReport(TypedDict, total=False):
    """What a write did: "path" ("device" or "host") and "reason" always; the counts and times
    for writes from device memory."""

    path: str
    reason: Optional[str]
    chunks: int
    written: int
    erased: int
    modified: int
    bytes_encoded: int
    bytes_stored: int
    seconds: float
    encode_seconds: float
    read_seconds: float
    store_seconds: float

@final
class Array:
    """A Zarr array in a filesystem store, opened for reads to the GPU (and writes, with
    ``mode="r+"``)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> Union[numpy.dtype[Any], str]:
        """numpy's dtype of what reads return (native byte order); bfloat16 without ml_dtypes
        installed: the name "bfloat16"."""
    @property
    def size(self) -> int: ...
    @property
    def nbytes(self) -> int:
        """``size`` times the element size (as zarr-python's ``Array.nbytes``)."""
    @property
    def attrs(self) -> dict[str, Any]:
        """The array's attributes, a new dict at each call."""
    @property
    def fill_value(self) -> Union[numpy.generic, float, None]:
        """A numpy scalar of ``dtype`` (as zarr-python's ``Array.fill_value``); None where a v2
        array's metadata says null; a float for bfloat16 without ml_dtypes."""
    @property
    def chunks(self) -> tuple[int, ...]: ...
    @property
    def shards(self) -> Optional[tuple[int, ...]]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def device(self) -> int:
        """The GPU this array's reads land on (`open`'s `device`)."""
    @property
    def regular_chunks(self) -> Optional[tuple[int, ...]]: ...
    def read(self, subset: Union[str, _Index, None] = None) -> DeviceArray:
        """Read `subset` to the device. Ctrl-C interrupts the wait (KeyboardInterrupt); the read
        stops at its next stage on its own thread and its array is dropped there (as for
        ``a[key]`` and ``read_many``)."""
    def read_into(self, out: Any, key: Optional[_Index] = None) -> _ReadReport:
        """Read into `out`, memory the caller owns. Ctrl-C stops the read at its next stage and
        raises KeyboardInterrupt once it stopped (at most 0.5 s later): it writes nothing more
        into `out` (unless it was still waiting on storage then)."""
    def read_async(self, key: Union[str, _Index, None] = None) -> PendingRead:
        """Start reading the selection `key` (as for `read`) on a background thread and return at
        once; `.result()` waits for the DeviceArray. A bad key raises here."""
    def read_ahead(self, keys: Iterable[Union[str, _Index]], *, prefetch: int = 2) -> ReadAhead:
        """Read the selections `keys` (a finite iterable, taken at once: random crops, say) in
        order on a background thread, `prefetch` (1 or more) reads ahead of the one in use, in
        requests of up to `prefetch` keys (one read each: a chunk several keys meet is decoded
        once). Every key is checked here; iterating yields ``(key, DeviceArray)``, `key` the
        tuple of slices of the box read."""
    @overload
    def read_many(self, keys: Iterable[Union[str, _Index]], *, stack: Literal[False] = False) -> list[DeviceArray]: ...
    @overload
    def read_many(self, keys: Iterable[Union[str, _Index]], *, stack: Literal[True]) -> DeviceArray:
        """Read the selections `keys` as one request (planned once; a chunk several keys meet
        read and decoded once): a list of DeviceArrays, one per key (views of one allocation), or
        with `stack=True` one DeviceArray of shape ``(len(keys), *shape)`` where every key selects
        `shape`. Every key is checked before anything is read."""
    def write(self, key: _Index, value: Any) -> _WriteReport:
        """Store `value` into the selection `key` (needs ``mode="r+"``): from device memory (a CuPy
        array, a PyTorch CUDA tensor, any DLPack 1.0 producer on a CUDA device, of the array's dtype
        and the selection's shape) encoded on the device where the codecs allow; from anything
        numpy takes (broadcast and cast as numpy's assignment does) written by zarrs."""
    def __getitem__(self, key: _Index, /) -> DeviceArray: ...
    def __setitem__(self, key: _Index, value: Any, /) -> None: ...
    def __len__(self) -> int: ...

@final
class DeviceArray:
    """An array in GPU memory (DLPack and CUDA array interface, no copies)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def ndim(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def device(self) -> int: ...
    @property
    def report(self) -> _ReadReport: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[tuple[int, int]] = None,
        dl_device: Optional[tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> CapsuleType: ...
    def __dlpack_device__(self) -> tuple[Literal[2], int]: ...
    @property
    def __cuda_array_interface__(self) -> _CudaArrayInterface: ...
    def __len__(self) -> int: ...

@final
class PendingRead:
    """One read running on a background thread (``Array.read_async``)."""

    def done(self) -> bool:
        """Whether the read has finished (``result()`` returns without waiting for it)."""
    def result(self, timeout: Optional[float] = None) -> DeviceArray:
        """The array read (the same object every call), waiting without the interpreter lock; a
        failed read raises its error. With `timeout` (seconds), a read not finished by then raises
        TimeoutError and goes on: a later call takes it (as ``concurrent.futures``). Ctrl-C
        interrupts the wait (KeyboardInterrupt) the same way."""

@final
class ReadAhead:
    """Reads kept in flight on a background thread while earlier ones are used
    (``zarrs_gpu.tiles``, ``Array.read_ahead``). Up to `prefetch` finished reads wait and one
    more is being read; each array is complete when yielded, for any stream."""

    def __iter__(self) -> ReadAhead: ...
    def __next__(self) -> tuple[tuple[slice, ...], DeviceArray]:
        """The next read, in order: its key (a tuple of slices) and array. Waits without the
        interpreter lock (Ctrl-C interrupts the wait; the read goes on and a later call takes
        it); a failed read raises (naming the box) and ends the iteration."""
    def close(self) -> None:
        """Stop: no further read starts, the arrays read ahead are dropped (those yielded stay
        valid). Returns at once, also while a read is in flight or another thread waits in
        ``__next__`` (which then ends the iteration); the read in flight is dropped when done."""

def tiles(
    array: Array,
    tile_shape: Sequence[int],
    *,
    order: Literal["C", "random"] = "C",
    prefetch: int = 2,
    seed: int = 0,
) -> ReadAhead:
    """The tiles of `tile_shape` covering `array` (edge tiles clipped), read in `order` ("C":
    row-major over the tile grid; "random": a permutation fixed by `seed`) on a background
    thread, `prefetch` (1 or more) reads ahead of the one in use. Bad arguments raise here."""

def open(
    store_path: Union[str, os.PathLike[str]],
    array: str = "/",
    *,
    device: int = 0,
    backend: Optional[Literal["auto", "gds", "posix"]] = None,
    decode_trust: Optional[Literal["verified", "checked", "trusted"]] = None,
    mode: Literal["r", "r+"] = "r",
    storage_options: Optional[Dict[str, Any]] = None,
) -> Array:
    """`store_path`: a directory, or an object store's URL (``s3://bucket/prefix``,
    ``https://host/prefix``) with `storage_options` (object_store's keys or s3fs's: ``key``,
    ``secret``, ``endpoint_url``, ``anon``, ``client_kwargs``...; credentials also from the AWS
    environment)."""
def read(
    store_path: Union[str, os.PathLike[str]],
    array: str = "/",
    subset: Union[str, _Index, None] = None,
    *,
    device: int = 0,
    backend: Optional[Literal["auto", "gds", "posix"]] = None,
    decode_trust: Optional[Literal["verified", "checked", "trusted"]] = None,
    storage_options: Optional[Dict[str, Any]] = None,
) -> DeviceArray: ...
def empty_cache() -> None:
    """Give back the device and pinned memory this package keeps idle between reads."""

class _MemoryInUse(TypedDict):
    device_free: int
    device_total: int
    output_pool_idle: int
    staging_pooled: int
    pinned_pooled: int
    pool_keep: int
    pinned_keep: int

def memory_in_use(device: int = 0) -> _MemoryInUse:
    """The memory reads on GPU `device` hold now, in bytes."""

def _nvcomp_candidates() -> list[str]:
    """Where nvCOMP will be looked for, in order (tests)."""

def _selection(key: Union[str, _Index, None], shape: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """What `key` selects of an array of `shape`: the box read and the result's shape (tests)."""
