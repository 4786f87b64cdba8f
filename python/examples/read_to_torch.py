"""Read a Zarr array (or a slab of it) straight into GPU memory and hand it to PyTorch and CuPy
without a copy; compare with zarr-python's host read.

    python python/examples/read_to_torch.py [PATH [ARRAY]]

Without PATH a zstd-compressed float32 sample array is written with zarr-python first. Needs an
NVIDIA GPU, torch, cupy, zarr-python and, for compressed arrays, nvCOMP
(pip install nvidia-libnvcomp-cu13).
"""
import sys
import time

import cupy as cp
import numpy as np
import torch
import zarr

import zarrs_gpu

from _sample import path_or_sample


def sample(path):
    z = zarr.create_array(store=path, shape=(64, 512, 512), chunks=(16, 128, 128), dtype="float32",
                          compressors=zarr.codecs.ZstdCodec(level=3))
    z[:] = np.random.default_rng(0).standard_normal(z.shape, dtype="float32").round(2)


def main():
    path = path_or_sample("sample.zarr", sample)
    node = sys.argv[2] if len(sys.argv) > 2 else "/"

    array = zarrs_gpu.open(path, node)
    print(array)
    t0 = time.perf_counter()
    slab = array[0:16, ...]                     # numpy-style indexing, read on the GPU
    seconds = time.perf_counter() - t0
    print(f"{slab} in {seconds:.3f} s ({slab.nbytes / 2**30 / seconds:.2f} GiB/s); report: {slab.report}")

    t = torch.from_dlpack(slab)                 # DLPack: no copy
    c = cp.asarray(slab)                        # CUDA array interface: no copy
    assert t.data_ptr() == c.data.ptr
    host = np.asarray(zarr.open_array(store=path, path=node.strip("/") or None, mode="r")[0:16, ...])
    print(f"torch mean {t.double().mean().item():.6f}, cupy max {float(c.max()):.6f}, "
          f"zarr-python's mean {host.astype(np.float64).mean():.6f}")
    assert np.array_equal(t.cpu().numpy(), host), "the GPU read differs from zarr-python's"
    print("the same elements as zarr-python's read")

    # A tile loop sharing the GPU with PyTorch: each output comes from PyTorch's own allocator and
    # is read into in place, so this package allocates nothing for results; what it keeps idle
    # between reads is bounded (zarrs_gpu.memory_in_use(); empty_cache() gives it back).
    tile = torch.empty((4, *array.shape[1:]), dtype=t.dtype, device="cuda")
    for start in range(0, t.shape[0] - 3, 4):
        array.read_into(tile, (slice(start, start + 4),))
        assert torch.equal(tile.cpu(), t[start:start + 4].cpu())
    zarrs_gpu.empty_cache()
    print(f"tiles read into PyTorch memory; after empty_cache(): {zarrs_gpu.memory_in_use()}")


if __name__ == "__main__":
    main()
