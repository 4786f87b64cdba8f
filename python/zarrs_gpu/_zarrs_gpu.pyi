"""Type stubs of the compiled module ``zarrs_gpu._zarrs_gpu`` (Rust, PyO3)."""

import os
from types import EllipsisType
from typing import Any, Literal, Optional, SupportsIndex, TypedDict, Union, final

from typing_extensions import CapsuleType, TypeAlias

__version__: str
__all__ = ["Array", "DeviceArray", "__version__", "_selection", "open", "read"]

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

@final
class Array:
    """A Zarr array in a filesystem store, opened for reads to the GPU."""

    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def chunks(self) -> tuple[int, ...]: ...
    @property
    def shards(self) -> Optional[tuple[int, ...]]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def regular_chunks(self) -> Optional[tuple[int, ...]]: ...
    def read(self, subset: Union[str, _Index, None] = None) -> DeviceArray: ...
    def read_into(self, out: Any, key: Optional[_Index] = None) -> _ReadReport: ...
    def __getitem__(self, key: _Index, /) -> DeviceArray: ...
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

def open(
    store_path: Union[str, os.PathLike[str]],
    array: str = "/",
    *,
    device: int = 0,
    backend: Optional[Literal["auto", "gds", "posix"]] = None,
    decode_trust: Optional[Literal["verified", "checked", "trusted"]] = None,
) -> Array: ...
def read(
    store_path: Union[str, os.PathLike[str]],
    array: str = "/",
    subset: Union[str, _Index, None] = None,
    *,
    device: int = 0,
    backend: Optional[Literal["auto", "gds", "posix"]] = None,
    decode_trust: Optional[Literal["verified", "checked", "trusted"]] = None,
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

def memory_in_use(device: int = 0) -> _MemoryInUse:
    """The memory reads on GPU `device` hold now, in bytes."""

def _nvcomp_candidates() -> list[str]:
    """Where nvCOMP will be looked for, in order (tests)."""

def _selection(key: Union[str, _Index, None], shape: list[int]) -> tuple[list[tuple[int, int]], list[int]]:
    """What `key` selects of an array of `shape`: the box read and the result's shape (tests)."""
