"""Zarr arrays (v2 and v3) straight into NVIDIA GPU memory, through zarrs (Rust).

    import zarrs_gpu, cupy, torch
    x = zarrs_gpu.read("volume.zarr", "/0", "0:64, :, :")   # a DeviceArray on GPU 0
    c = cupy.asarray(x)                                      # no copy (CUDA array interface)
    t = torch.from_dlpack(x)                                 # no copy (DLPack)
    a = zarrs_gpu.open("volume.zarr", "/0")
    slab = a[0:64, ..., 100:200]                             # numpy-style indexing, on the GPU

Chunks are read with many parallel reads into pinned memory and copied to the device, then
decoded there (zstd and gzip with nvCOMP, crc32c, transpose, sharding); other codecs are decoded
by zarrs on the host and copied once. Errors are Python exceptions with the Rust messages: no GPU
or driver is a RuntimeError, a bad index an IndexError, a bad option a ValueError.
"""

from ._zarrs_gpu import Array, DeviceArray, __version__, open, read

__all__ = ["Array", "DeviceArray", "open", "read", "__version__"]
