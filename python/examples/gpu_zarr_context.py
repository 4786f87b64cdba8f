"""Existing zarr-python code, decoded on the GPU by zarrs_gpu: inside gpu_zarr_context(),
zarr-python returns CuPy arrays whose chunks were read, checked and decoded on the device.

    python python/examples/gpu_zarr_context.py [PATH]

Without PATH a zstd-compressed, sharded float32 sample array is written with zarr-python
first. Needs an NVIDIA GPU, cupy, zarr-python and nvCOMP (pip install nvidia-libnvcomp-cu13).
"""
import time

import cupy as cp
import numpy as np
import zarr

import zarrs_gpu
from zarrs_gpu.pipeline import GpuCodecPipeline

from _sample import path_or_sample


def sample(path):
    z = zarr.create_array(store=path, shape=(64, 1024, 1024), chunks=(8, 128, 128), shards=(32, 512, 512),
                          dtype="float32", compressors=zarr.codecs.ZstdCodec(level=3))
    z[:] = np.random.default_rng(1).standard_normal(z.shape, dtype="float32").round(1)


def main():
    path = path_or_sample("sharded.zarr", sample)

    host = zarr.open_array(path, mode="r")[10:40, ..., :300]          # zarr-python on the host
    with zarrs_gpu.gpu_zarr_context():
        z = zarr.open_array(path, mode="r")
        t0 = time.perf_counter()
        gpu = z[10:40, ..., :300]                                      # the same code, on the GPU
        seconds = time.perf_counter() - t0
    print(f"{type(gpu).__module__}.{type(gpu).__name__} {gpu.shape} {gpu.dtype} in {seconds:.3f} s; "
          f"reads done by zarrs_gpu so far: {GpuCodecPipeline.device_reads}")
    assert isinstance(gpu, cp.ndarray) and np.array_equal(cp.asnumpy(gpu), host)
    print("the same elements as zarr-python's host read")


if __name__ == "__main__":
    main()
