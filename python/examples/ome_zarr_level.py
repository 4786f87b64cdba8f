"""Read one level of an OME-Zarr multiscale image to the GPU (the levels are the arrays that
the group's "multiscales" metadata lists, finest first).

    python python/examples/ome_zarr_level.py [IMAGE_GROUP [LEVEL]]

Without IMAGE_GROUP a two-level sample image is written with zarr-python first. Needs an NVIDIA
GPU, cupy, zarr-python and nvCOMP (pip install nvidia-libnvcomp-cu13).
"""
import sys

import cupy as cp
import numpy as np
import zarr

import zarrs_gpu

from _sample import path_or_sample


def sample(path):
    root = zarr.open_group(path, mode="w")
    full = np.random.default_rng(2).integers(0, 4000, (64, 512, 512), dtype="uint16")
    levels = [full, full[::2, ::2, ::2]]
    for i, data in enumerate(levels):
        a = root.create_array(str(i), shape=data.shape, chunks=(16, 128, 128), dtype=data.dtype,
                              compressors=zarr.codecs.ZstdCodec(level=3))
        a[:] = data
    root.attrs["ome"] = {"version": "0.5", "multiscales": [{"name": "sample", "axes": [
        {"name": n, "type": "space"} for n in "zyx"], "datasets": [
        {"path": str(i), "coordinateTransformations": [{"type": "scale", "scale": [2.0 ** i] * 3}]}
        for i in range(len(levels))]}]}


def levels(group):
    attrs = dict(group.attrs)
    multiscales = attrs.get("ome", attrs).get("multiscales")
    if not multiscales:
        raise SystemExit(f"{group.store_path}: no OME-Zarr multiscales metadata")
    return [d["path"] for d in multiscales[0]["datasets"]]


def main():
    path = path_or_sample("image.zarr", sample)
    level = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    paths = levels(zarr.open_group(path, mode="r"))
    array = zarrs_gpu.open(path, paths[level])
    data = array[...]
    print(f"level {level} ({paths[level]}) of {len(paths)}: {data}")
    c = cp.asarray(data)
    want = np.asarray(zarr.open_array(path, path=paths[level], mode="r")[...])
    assert np.array_equal(cp.asnumpy(c), want)
    print(f"mean {float(c.mean()):.3f}, the same elements as zarr-python's read")


if __name__ == "__main__":
    main()
