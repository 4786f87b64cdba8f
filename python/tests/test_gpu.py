"""zarrs_gpu on a GPU, against zarr-python element for element: every array of the project's
interoperability matrix (v2 and v3, every codec chain, sharded, missing chunks, 14 data types),
whole and in numpy-style subsets, taken by CuPy (CUDA array interface and DLPack) and PyTorch
(DLPack) without a copy; zarrs_gpu.dask's arrays of device blocks against dask.array.from_zarr;
zarrs_gpu.dask on distributed worker processes; zarrs_gpu.xarray's datasets against xarray's zarr
engine; zarrs_gpu.torch's crops, batches and the DDP example (python/examples/ddp_train.py, two ranks).
Needs a CUDA GPU, cupy, torch, zarr-python, numcodecs, dask[array], distributed and xarray; a missing one is a failure,
not a skip.

    python -m unittest discover -s python/tests -p 'test_gpu.py'
"""
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import cupy as cp
import numpy as np
import torch
import zarr

import zarrs_gpu

HERE = os.path.dirname(os.path.abspath(__file__))
MATRIX = os.path.join(HERE, "..", "..", "tests", "interop", "write_matrix.py")
# numpy dtypes torch takes through DLPack on every version we meet.
TORCH_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64", "complex64",
                "complex128"}
KEYS = [
    (slice(3, None), Ellipsis, slice(-5, None)),
    (5,),
    (Ellipsis, 2),
    (-1, slice(0, 7)),
    (slice(None), 4, slice(2, 9)),
    (slice(-100, 100), slice(1, 2), 0),
    (0, 0, 0),
]


def write_array(path, data, options):
    """``data`` written by zarr-python at ``path`` with ``create_array``'s ``options``; the array."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        z = zarr.create_array(store=path, shape=data.shape, dtype=data.dtype, **options)
    z[...] = data
    return z


class GpuTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        subprocess.run([sys.executable, MATRIX, cls.dir.name], check=True, capture_output=True)
        with open(os.path.join(cls.dir.name, "manifest.json")) as f:
            manifest = json.load(f)
        cls.cases = manifest["cases"] if isinstance(manifest, dict) else manifest

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def path(self, case):
        return os.path.join(self.dir.name, case["path"])

    def test_whole_arrays_match_zarr_python(self):
        self.assertGreater(len(self.cases), 20)
        for case in self.cases:
            with self.subTest(case=case["name"]):
                want = np.load(os.path.join(self.dir.name, case["expected"]))
                x = zarrs_gpu.read(self.path(case))
                self.assertEqual(x.shape, want.shape)
                self.assertEqual(np.dtype(x.dtype), want.dtype.newbyteorder("="))
                # The CUDA array interface (cupy.asarray) and DLPack (cupy.from_dlpack), no copy.
                c = cp.asarray(x)
                self.assertEqual(c.data.ptr, x.__cuda_array_interface__["data"][0])
                # Array.dtype (numpy's) is what reads give.
                self.assertEqual(zarrs_gpu.open(self.path(case)).dtype, c.dtype)
                np.testing.assert_array_equal(cp.asnumpy(c), want)
                np.testing.assert_array_equal(cp.asnumpy(cp.from_dlpack(x)), want)
                if x.dtype in TORCH_DTYPES:
                    t = torch.from_dlpack(x)
                    self.assertEqual(t.data_ptr(), c.data.ptr)
                    np.testing.assert_array_equal(t.cpu().numpy(), want)

    def test_subsets_match_zarr_python(self):
        for case in self.cases:
            if not case["name"].startswith(("v3_sharded", "v3_zstd", "v2_", "v3_raw", "v3_gzip")):
                continue
            z = zarr.open_array(self.path(case), mode="r")
            a = zarrs_gpu.open(self.path(case))
            for key in KEYS:
                with self.subTest(case=case["name"], key=key):
                    want = np.asarray(z[key])
                    got = a[key]
                    self.assertEqual(got.shape, want.shape)
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(got)), want)
            # The command line's string form selects the same.
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a.read("3:, ..., -5:"))), np.asarray(z[3:, ..., -5:]))

    def test_slices_clamp_and_empty_selections_as_zarr_python(self):
        # numpy's rule for every form: a stop past the end clamps, an empty slice is an empty
        # device array of the right shape (no chunk read), negative bounds count from the end.
        keys = [(slice(3, 3),), (slice(0, 10**6),), (slice(-5, None),), (slice(5, 2), Ellipsis, 0),
                (slice(-100, 100), slice(22, 10**9)), (Ellipsis, slice(10, 10)), (slice(None), slice(-10**30, 3)),
                (-1, slice(0, 0), slice(None))]
        for name in ("v3_sharded_zstd_float32", "v3_zstd_float32", "v2_zstd_int16", "v3_raw_uint8"):
            case = next(c for c in self.cases if c["name"] == name)
            z = zarr.open_array(self.path(case), mode="r")
            a = zarrs_gpu.open(self.path(case))
            for key in keys:
                with self.subTest(case=name, key=key):
                    want = np.asarray(z[key])
                    got = a[key]
                    self.assertEqual(got.shape, want.shape)
                    c = cp.asarray(got)
                    self.assertEqual(c.shape, want.shape)
                    np.testing.assert_array_equal(cp.asnumpy(c), want)
                    np.testing.assert_array_equal(cp.asnumpy(cp.from_dlpack(a[key])), want)
                    if want.size == 0:
                        self.assertEqual((got.nbytes, got.report["chunks"], got.report["bytes_read"]), (0, 0, 0))
                        if got.dtype in TORCH_DTYPES:
                            self.assertEqual(tuple(torch.from_dlpack(a[key]).shape), want.shape)
                    # Into caller memory of the selection's shape, empty ones too.
                    out = cp.full(want.shape, 99, dtype=want.dtype)
                    a.read_into(out, key)
                    np.testing.assert_array_equal(cp.asnumpy(out), want)
            # The string form (the command line's) clamps alike.
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a.read("0:1000"))), np.asarray(z[0:1000]))
            self.assertEqual(a.read("3:3, :, :").shape, (0,) + z.shape[1:])

    def test_vindex_and_oindex_in_the_context_match_zarr_python(self):
        from zarrs_gpu import pipeline
        from zarrs_gpu.pipeline import GpuCodecPipeline

        rng = np.random.default_rng(11)
        for name in ("v3_sharded_zstd_float32", "v3_zstd_float32", "v2_zstd_int16",
                     "v3_sharded_end_zstd_missing_float64"):
            case = next(c for c in self.cases if c["name"] == name)
            host = zarr.open_array(self.path(case), mode="r")
            shape = host.shape
            points = tuple(rng.integers(-n, n, 40) for n in shape)
            mask = rng.random(shape) < 0.1
            selections = [
                ("vindex", points),
                ("vindex", tuple(p.reshape(5, 8) for p in points)),
                ("vindex", mask),
                ("vindex", (np.array([0, shape[0] - 1]), np.array([shape[1] - 1, 0]), np.array([3, 3]))),
                ("oindex", (np.array([5, 1, 1, -1]), slice(2, None, 3), np.array([True] * 3 + [False] * (shape[2] - 3)))),
                ("oindex", (np.array([2, 0]), 4, slice(None))),
                ("getitem", (np.array([7, 3, 18]),)),
                ("vindex", (np.array([], dtype=np.int64),) * 3),
            ]
            for split in (False, True):
                saved = pipeline._BOX_WASTE, pipeline._BOX_BYTES
                if split:  # chunk by chunk, as for scattered points in a large array
                    pipeline._BOX_WASTE, pipeline._BOX_BYTES = 1, 0
                try:
                    for how, sel in selections:
                        with self.subTest(case=name, how=how, sel=sel, split=split):
                            pick = lambda z: z.vindex[sel] if how == "vindex" else z.oindex[sel] if how == "oindex" else z[sel]
                            want = np.asarray(pick(host))
                            before = GpuCodecPipeline.device_reads
                            with zarrs_gpu.gpu_zarr_context():
                                got = pick(zarr.open_array(self.path(case), mode="r"))
                            self.assertIsInstance(got, cp.ndarray)
                            self.assertEqual(got.shape, want.shape)
                            np.testing.assert_array_equal(cp.asnumpy(got), want)
                            if want.size:
                                self.assertEqual(GpuCodecPipeline.device_reads, before + 1, "read by zarrs_gpu")
                finally:
                    pipeline._BOX_WASTE, pipeline._BOX_BYTES = saved

    def test_dlpack_capsules_streams_and_lifetimes(self):
        case = next(c for c in self.cases if c["name"] == "v3_sharded_zstd_float32")
        want = np.load(os.path.join(self.dir.name, case["expected"]))
        x = zarrs_gpu.read(self.path(case))
        self.assertEqual(x.__dlpack_device__(), (2, 0))
        self.assertEqual(x.report["decode"], "device")
        self.assertGreater(x.report["stages"]["decode"], 0)
        self.assertGreaterEqual(x.report["peak_device_bytes"], x.nbytes)
        # On a side stream of torch's: the stream waits for the read, the host does not.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.from_dlpack(x)
            total = t.double().sum()
        side.synchronize()
        self.assertAlmostEqual(total.item(), float(want.astype(np.float64).sum()), delta=1e-6 * abs(want).sum())
        with self.assertRaises(BufferError):
            x.__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            x.__dlpack__(dl_device=(1, 0))
        with self.assertRaises(ValueError):
            x.__dlpack__(stream=0)
        # The tensor keeps the memory after the array object is gone.
        del x
        gc.collect()
        torch.cuda.synchronize()
        np.testing.assert_array_equal(t.cpu().numpy(), want)
        # Capsules never consumed are released by their destructor.
        y = zarrs_gpu.read(self.path(case))
        for _ in range(3):
            capsule = y.__dlpack__(max_version=(1, 0))
            self.assertEqual(type(capsule).__name__, "PyCapsule")
            del capsule
        legacy = y.__dlpack__()
        del legacy, y
        gc.collect()

    def test_reads_into_cupy_and_torch_memory(self):
        for name in ("v3_sharded_zstd_float32", "v3_blosc_float32", "v2_zstd_int16"):
            case = next(c for c in self.cases if c["name"] == name)
            z = zarr.open_array(self.path(case), mode="r")
            a = zarrs_gpu.open(self.path(case))
            for key in [None, (slice(3, None), Ellipsis, slice(-5, None)), (5,)]:
                with self.subTest(case=name, key=key):
                    want = np.asarray(z[...] if key is None else z[key])
                    out = cp.full(want.shape, 99, dtype=want.dtype)
                    ptr = out.data.ptr
                    report = a.read_into(out, key)
                    self.assertEqual(out.data.ptr, ptr, "in place")
                    self.assertIn(report["decode"], ("device", "host decode + one copy"))
                    np.testing.assert_array_equal(cp.asnumpy(out), want)
                    t = torch.full(want.shape, 99, dtype=getattr(torch, want.dtype.name), device="cuda")
                    a.read_into(t, key)
                    np.testing.assert_array_equal(t.cpu().numpy(), want)
            # Another size or another dtype: refused, the destination's owner unharmed.
            with self.assertRaises(ValueError):
                a.read_into(cp.empty((2, 2), dtype=z.dtype))
            with self.assertRaises((TypeError, ValueError)):
                a.read_into(cp.empty(z.shape, dtype=np.uint8 if z.dtype != np.uint8 else np.int8))

    def test_zarr_python_code_decodes_on_the_device_in_the_context(self):
        from zarrs_gpu.pipeline import GpuCodecPipeline

        names = ("v3_zstd_float32", "v3_sharded_zstd_float32", "v3_sharded_end_zstd_missing_float64",
                 "v2_zstd_int16", "v3_raw_uint8", "v3_zstd_crc32c_float32", "v3_blosc_float32")
        for name in names:
            case = next(c for c in self.cases if c["name"] == name)
            host = zarr.open_array(self.path(case), mode="r")
            for key in [(Ellipsis,), (slice(3, None), Ellipsis, slice(-5, None)), (5,), (-1, slice(0, 7), 2)]:
                with self.subTest(case=name, key=key):
                    want = np.asarray(host[key])
                    before = GpuCodecPipeline.device_reads
                    with zarrs_gpu.gpu_zarr_context():
                        got = zarr.open_array(self.path(case), mode="r")[key]
                    self.assertIsInstance(got, cp.ndarray)
                    np.testing.assert_array_equal(cp.asnumpy(got), want)
                    self.assertEqual(GpuCodecPipeline.device_reads, before + 1, "read by zarrs_gpu")
        # Into an output buffer of the caller's (the codec pipeline's own route, chunk by chunk).
        from zarr.core.buffer.gpu import NDBuffer

        case = next(c for c in self.cases if c["name"] == "v3_sharded_zstd_float32")
        key = (slice(3, None), Ellipsis, slice(-5, None))
        want = np.asarray(zarr.open_array(self.path(case), mode="r")[key])
        out = cp.full(want.shape, 99, dtype=want.dtype)
        before = GpuCodecPipeline.device_reads
        with zarrs_gpu.gpu_zarr_context():
            zarr.open_array(self.path(case), mode="r").get_basic_selection(key, out=NDBuffer.from_ndarray_like(out))
        np.testing.assert_array_equal(cp.asnumpy(out), want)
        self.assertEqual(GpuCodecPipeline.device_reads, before + 1, "read by zarrs_gpu through the pipeline")
        # What the device does not take (a step; an array in memory) is zarr-python's, still right.
        case = next(c for c in self.cases if c["name"] == "v3_zstd_float32")
        want = np.asarray(zarr.open_array(self.path(case), mode="r")[::2])
        before = GpuCodecPipeline.device_reads
        with zarrs_gpu.gpu_zarr_context():
            np.testing.assert_array_equal(cp.asnumpy(zarr.open_array(self.path(case), mode="r")[::2]), want)
            memory = zarr.create_array(store=zarr.storage.MemoryStore(), shape=(6, 5), chunks=(4, 4), dtype="int32")
            memory[:] = np.arange(30, dtype="int32").reshape(6, 5)
            np.testing.assert_array_equal(cp.asnumpy(memory[1:5]), np.arange(30).reshape(6, 5)[1:5])
        self.assertEqual(GpuCodecPipeline.device_reads, before)

    def test_bfloat16_goes_through_dlpack_only(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bf16.zarr")
            meta = {"zarr_format": 3, "node_type": "array", "shape": [6, 4], "data_type": "bfloat16",
                    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
                    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                    "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
            os.makedirs(path)
            with open(os.path.join(path, "zarr.json"), "w") as f:
                json.dump(meta, f)
            values = torch.arange(16, dtype=torch.float32).reshape(4, 4).to(torch.bfloat16)
            os.makedirs(os.path.join(path, "c", "0"))
            values.view(torch.int16).numpy().tofile(os.path.join(path, "c", "0", "0"))
            x = zarrs_gpu.read(path)
            self.assertEqual(x.dtype, "bfloat16")
            self.assertEqual(str(zarrs_gpu.open(path).dtype), "bfloat16")  # ml_dtypes' or the name
            with self.assertRaises(TypeError):
                x.__cuda_array_interface__
            t = torch.from_dlpack(x)
            self.assertEqual(t.dtype, torch.bfloat16)
            self.assertTrue(torch.equal(t[:4].cpu(), values))
            self.assertTrue(torch.equal(t[4:].cpu(), torch.zeros(2, 4, dtype=torch.bfloat16)))


    def test_nested_shards_match_zarr_python(self):
        """Nested shards written by zarr-python, 2 and 3 levels, index at the start and the end, some
        inner shards left at the fill value: every element and the whole through the package (whose
        arrays keep a shard index cache: the files are aged so that it is used) and through
        zarr-python's pipeline, equal to zarr-python's host read. The first case is the layout of
        the report that found shard indexes mixed up between levels."""
        from zarr.codecs import BytesCodec, ShardingCodec, ShardingCodecIndexLocation, ZstdCodec

        def nest(shapes, location, inner):
            codec = ShardingCodec(chunk_shape=shapes[-1], codecs=inner, index_location=location)
            for shape in reversed(shapes[:-1]):
                codec = ShardingCodec(chunk_shape=shape, codecs=[codec], index_location=location)
            return codec

        cases = []
        for loc in (ShardingCodecIndexLocation.end, ShardingCodecIndexLocation.start):
            cases.append(((16,), (16,), [(4,), (1,)], loc, [BytesCodec()]))
            cases.append(((20, 37), (16, 16), [(8, 8), (4, 4), (2, 2)], loc, [BytesCodec(), ZstdCodec(level=1)]))
        with tempfile.TemporaryDirectory() as d:
            for n, (shape, chunks, shapes, loc, inner) in enumerate(cases):
                with self.subTest(case=n, shape=shape, levels=shapes, location=str(loc)):
                    path = os.path.join(d, f"nested{n}.zarr")
                    z = zarr.create_array(store=path, shape=shape, chunks=chunks, dtype="int32", fill_value=0,
                                          serializer=nest(shapes, loc, inner), compressors=None,
                                          config={"write_empty_chunks": False})
                    values = np.arange(1, int(np.prod(shape)) + 1, dtype="int32").reshape(shape)
                    # Elements 4..8 of the 1-d case (an inner shard), a band of the 2-d ones.
                    values[4:8] = 0
                    z[...] = values
                    then = os.stat(path).st_mtime - 60
                    for root, _, files in os.walk(path):
                        for f in files:
                            os.utime(os.path.join(root, f), (then, then))
                    a = zarrs_gpu.open(path)
                    for _ in range(2):
                        np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a[...])), values)
                        for i in range(shape[0]):
                            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a[i:i + 1])), values[i:i + 1])
                    with zarrs_gpu.gpu_zarr_context():
                        g = zarr.open_array(path, mode="r")
                        np.testing.assert_array_equal(cp.asnumpy(g[...]), values)
                        np.testing.assert_array_equal(cp.asnumpy(g[1:2]), values[1:2])

    def test_memory_is_given_back_after_a_large_read(self):
        """A read of 1 GiB of zstd chunks, freed: the package keeps at most its idle bound of device
        memory, CuPy then allocates 90% of what was free before the read, and empty_cache() gives
        back the rest."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "big.zarr")
            shape = (64, 2048, 2048)  # 1 GiB of float32, 1 MiB chunks
            z = zarr.create_array(store=path, shape=shape, chunks=(1, 512, 512), dtype="float32",
                                  compressors=zarr.codecs.ZstdCodec(level=1))
            plane = (np.arange(2048 * 2048, dtype="float32") % 1000).reshape(2048, 2048)
            for i in range(0, 64, 8):
                z[i:i + 8] = plane[None] + np.arange(i, i + 8, dtype="float32")[:, None, None]
            pool = cp.get_default_memory_pool()
            pool.free_all_blocks()
            free_before = cp.cuda.runtime.memGetInfo()[0]
            x = zarrs_gpu.read(path)
            c = cp.asarray(x)
            self.assertEqual(float(c[63, 0, 1]), 64.0)
            del c, x
            gc.collect()
            m = zarrs_gpu.memory_in_use()
            idle = m["output_pool_idle"] + m["staging_pooled"]
            self.assertLessEqual(idle, m["pool_keep"], m)
            # Pinned buffers within their bound, beside the host share's rings (1 GiB at most).
            self.assertLessEqual(m["pinned_pooled"], m["pinned_keep"] + (1 << 30), m)
            self.assertGreaterEqual(m["pinned_keep"], m["pool_keep"], m)
            held = free_before - cp.cuda.runtime.memGetInfo()[0]
            # What the library keeps idle, and its fixed state (kernels, nvCOMP, streams).
            self.assertLessEqual(held, m["pool_keep"] + (512 << 20), m)
            big = cp.empty(int(free_before * 0.9), dtype=cp.uint8)
            del big
            pool.free_all_blocks()
            zarrs_gpu.empty_cache()
            m = zarrs_gpu.memory_in_use()
            self.assertEqual((m["output_pool_idle"], m["staging_pooled"], m["pinned_pooled"]), (0, 0, 0), m)
            # Reads work after it.
            self.assertEqual(float(cp.asarray(zarrs_gpu.read(path, subset="5, 0, 1")).item()), 6.0)

    def tiles_array(self, d):
        """A zstd array of odd shape whose chunks from row 24 on were never written (fill value),
        and its values as zarr-python reads them."""
        path = os.path.join(d, "tiles.zarr")
        z = zarr.create_array(store=path, shape=(37, 70, 45), chunks=(8, 16, 16), dtype="float32",
                              compressors=zarr.codecs.ZstdCodec(level=3), fill_value=-7.5)
        z[:24] = np.random.default_rng(0).standard_normal((24, 70, 45), dtype="float32")
        return path, z, np.asarray(z[...])

    def test_tiles_read_ahead_match_zarr_python(self):
        with tempfile.TemporaryDirectory() as d:
            path, z, want = self.tiles_array(d)
            a = zarrs_gpu.open(path)
            # Chunks never written read as Array.fill_value, zarr-python's.
            self.assertEqual((type(a.fill_value), a.fill_value), (type(z.fill_value), z.fill_value))
            self.assertTrue(bool((cp.asarray(a[30:32]) == a.fill_value).all()))
            # Tiles that divide neither the shape nor the chunks, in both orders.
            for options in ({}, {"order": "random", "seed": 3, "prefetch": 1},
                            {"order": "random", "seed": 4, "prefetch": 5}):
                with self.subTest(**options):
                    boxes = []
                    for key, tile in zarrs_gpu.tiles(a, (10, 24, 20), **options):
                        self.assertIsInstance(key, tuple)
                        self.assertTrue(all(isinstance(k, slice) for k in key), key)
                        self.assertEqual(tile.shape, want[key].shape)
                        np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), want[key])
                        np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), np.asarray(z[key]))
                        boxes.append(tuple((k.start, k.stop) for k in key))
                    self.assertEqual(len(boxes), 4 * 3 * 3)
                    self.assertEqual(len(set(boxes)), len(boxes))
                    if not options:
                        self.assertEqual(boxes, sorted(boxes))
                    else:
                        self.assertNotEqual(boxes, sorted(boxes))
            # The same seed, the same order.
            first = [k for k, _ in zarrs_gpu.tiles(a, (10, 24, 20), order="random", seed=9)]
            self.assertEqual(first, [k for k, _ in zarrs_gpu.tiles(a, (10, 24, 20), order="random", seed=9)])
            # PyTorch takes the tiles without a copy and computes on them at once.
            for key, tile in zarrs_gpu.tiles(a, (16, 32, 45)):
                t = torch.from_dlpack(tile)
                np.testing.assert_array_equal((t * 2).cpu().numpy(), want[key] * 2)

    def test_read_ahead_of_explicit_keys_matches_zarr_python(self):
        with tempfile.TemporaryDirectory() as d:
            path, z, want = self.tiles_array(d)
            a = zarrs_gpu.open(path)
            rng = np.random.default_rng(1)
            crops = []
            for _ in range(12):
                start = [int(rng.integers(0, n - 8)) for n in want.shape]
                crops.append(tuple(slice(s, s + 8) for s in start))
            keys = crops + [(5, slice(None), slice(-10, None)), (Ellipsis, 7), (slice(30, 100),)]
            got = list(a.read_ahead(keys, prefetch=3))
            self.assertEqual(len(got), len(keys))
            for key, (box, tile) in zip(keys, got):
                with self.subTest(key=key):
                    expected = np.asarray(z[key])
                    self.assertEqual(tile.shape, expected.shape)
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), expected)
                    # The box read, as slices: the same elements with every dimension kept.
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)).reshape(want[box].shape), want[box])
            # A generator of keys, and the command line's string form (integers keep their dimension).
            (box, tile), = a.read_ahead(k for k in ["1:30, 2, 4:40"])
            self.assertEqual(box, (slice(1, 30), slice(2, 3), slice(4, 40)))
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), want[1:30, 2:3, 4:40])

    def test_read_many_as_one_request_matches_zarr_python(self):
        # Every sharded, zstd and v2 case of the matrix: crops overlapping each other and the
        # edges, repeated, integer keys, as a list of arrays and stacked.
        for case in self.cases:
            if not case["name"].startswith(("v3_sharded", "v3_zstd", "v2_", "v3_raw")):
                continue
            z = zarr.open_array(self.path(case), mode="r")
            a = zarrs_gpu.open(self.path(case))
            want = np.asarray(z[...])
            rng = np.random.default_rng(len(case["name"]))
            crop = [max(1, n // 2) for n in want.shape]
            boxes = []
            for _ in range(6):
                start = [int(rng.integers(0, n - c + 1)) for n, c in zip(want.shape, crop)]
                boxes.append(tuple(slice(s, s + c) for s, c in zip(start, crop)))
            boxes.append(boxes[0])
            with self.subTest(case=case["name"]):
                got = a.read_many(boxes)
                self.assertIsInstance(got, list)
                self.assertEqual(len(got), len(boxes))
                for box, x in zip(boxes, got):
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(x)), want[box])
                stacked = a.read_many(boxes, stack=True)
                self.assertEqual(stacked.shape, (len(boxes), *crop))
                np.testing.assert_array_equal(cp.asnumpy(cp.asarray(stacked)), np.stack([want[b] for b in boxes]))
                if stacked.dtype in TORCH_DTYPES:
                    t = torch.from_dlpack(stacked)
                    self.assertEqual(tuple(t.shape), (len(boxes), *crop))
                    np.testing.assert_array_equal(t.cpu().numpy(), np.stack([want[b] for b in boxes]))
                # Keys of other shapes, integers dropping their dimension, as numpy does.
                mixed = [KEYS[0], KEYS[1], KEYS[4], (Ellipsis,)]
                for key, x in zip(mixed, a.read_many(mixed)):
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(x)), np.asarray(z[key]))
                with self.assertRaisesRegex(ValueError, "one shape"):
                    a.read_many(mixed, stack=True)
        self.assertEqual(a.read_many([]), [])

    def test_created_arrays_take_device_writes_that_zarr_python_reads(self):
        root = os.path.join(self.dir.name, "created-gpu.zarr")
        rng = np.random.default_rng(37)
        for node, kwargs in (("/zstd", {}), ("/sharded", {"shards": (32, 64, 64), "compressors": ["zstd", "crc32c"]}),
                             ("/blosc", {"compressors": "blosc"}), ("/v2", {"zarr_format": 2, "compressors": "gzip"})):
            a = zarrs_gpu.create(root, node, shape=(40, 70, 90), chunks=(16, 32, 32), dtype="float32", **kwargs)
            want = np.round(rng.random((40, 70, 90), dtype=np.float32) * 50)
            report = a.write(Ellipsis, cp.asarray(want))
            self.assertEqual(report["path"], "device", (node, report))
            a[3:30, 5:66, 7:80] = cp.asarray(want[3:30, 5:66, 7:80] + 1)
            want[3:30, 5:66, 7:80] += 1
            np.testing.assert_array_equal(zarr.open_array(root, path=node.strip("/"), mode="r")[...], want, err_msg=node)
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a[...])), want, err_msg=node)

    def test_zarr_python_writes_of_device_values_are_encoded_on_the_device(self):
        import zarr.codecs as zc

        from zarrs_gpu.pipeline import GpuCodecPipeline

        rng = np.random.default_rng(31)
        codecs = (("zstd", zc.ZstdCodec(level=3)), ("blosc", zc.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")))
        for name, compressors in codecs:
            path = os.path.join(self.dir.name, f"zarr-python-device-write-{name}.zarr")
            zarr.create_array(store=path, shape=(40, 70, 90), chunks=(16, 32, 32), dtype="float32",
                              compressors=compressors, fill_value=0)
            want = np.round(rng.random((40, 70, 90), dtype=np.float32) * 100)
            want[:16, :32, :32] = 0
            before = GpuCodecPipeline.device_writes
            with zarrs_gpu.gpu_zarr_context():
                z = zarr.open_array(path, mode="r+")
                z[...] = cp.asarray(want)
                # A CuPy tile at an unaligned place, a PyTorch one, an integer index.
                tile = cp.asarray(rng.random((32, 50, 57), dtype=np.float32))
                z[5:37, 20:70, 33:90] = tile
                want[5:37, 20:70, 33:90] = cp.asnumpy(tile)
                plane = torch.full((70, 90), 2.5, dtype=torch.float32, device="cuda")
                z[38] = plane
                want[38] = 2.5
                # A broadcast scalar: zarr-python's own write, as before.
                z[39, 0:3] = 4.0
                want[39, 0:3] = 4.0
                np.testing.assert_array_equal(cp.asnumpy(z[...]), want, err_msg=name)
            self.assertEqual(GpuCodecPipeline.device_writes - before, 3, name)
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want, err_msg=name)

    def test_device_values_are_written_and_read_back_by_zarr_python(self):
        import zarr.codecs as zc

        rng = np.random.default_rng(29)
        codecs = (("zstd", zc.ZstdCodec(level=3)), ("raw", None), ("gzip", zc.GzipCodec(level=5)),
                  ("blosc", zc.BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")),
                  ("blosc-zstd", zc.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")))
        for name, compressors in codecs:
            path = os.path.join(self.dir.name, f"device-write-{name}.zarr")
            zarr.create_array(store=path, shape=(40, 70, 90), chunks=(16, 32, 32), dtype="float32",
                              compressors=compressors, fill_value=0)
            a = zarrs_gpu.open(path, mode="r+")
            want = np.round(rng.random((40, 70, 90), dtype=np.float32) * 100)
            want[:16, :32, :32] = 0  # a chunk of the fill value: erased
            report = a.write(slice(None), cp.asarray(want))
            self.assertEqual(report["path"], "device", report)
            # A PyTorch tile at an unaligned place (partial and edge chunks read, modified, written
            # again), then a CuPy plane at an integer index (its dimension dropped).
            tile = torch.arange(32 * 50 * 57, dtype=torch.float32, device="cuda").reshape(32, 50, 57)
            a[5:37, 20:70, 33:90] = tile
            want[5:37, 20:70, 33:90] = tile.cpu().numpy()
            plane = cp.full((70, 90), 7.5, dtype=cp.float32)
            a[38] = plane
            want[38] = 7.5
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want, err_msg=name)
            self.assertFalse(os.path.exists(os.path.join(path, "c", "0", "0", "0")), name)
            # The wrong dtype or shape on the device: refused before anything is written.
            with self.assertRaises((TypeError, ValueError, RuntimeError)):
                a[0:2] = cp.zeros((2, 70, 90), dtype=cp.float64)
            with self.assertRaises(ValueError):
                a[0:2] = cp.zeros((3, 70, 90), dtype=cp.float32)
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want, err_msg=name)

    def test_reads_from_many_threads_coalesce_and_match_zarr_python(self):
        # ZARRS_GPU_COALESCE_WINDOW_US (read when the array is opened): reads of one array made
        # from a thread pool at once are gathered into requests; each is its own key's data.
        import concurrent.futures

        for case in self.cases:
            if not case["name"].startswith(("v3_sharded", "v3_zstd", "v2_")):
                continue
            z = zarr.open_array(self.path(case), mode="r")
            want = np.asarray(z[...])
            if want.ndim == 0 or min(want.shape) == 0:
                continue
            # A window: the pool's threads start right after a read, so the first waits for the
            # others (threads woken together reach the array when the host schedules them).
            os.environ["ZARRS_GPU_COALESCE_WINDOW_US"] = "50000"
            try:
                a = zarrs_gpu.open(self.path(case))
            finally:
                del os.environ["ZARRS_GPU_COALESCE_WINDOW_US"]
            rng = np.random.default_rng(len(case["name"]) + 1)
            crop = [max(1, n // 3) for n in want.shape]
            boxes = []
            for _ in range(24):
                start = [int(rng.integers(0, n - c + 1)) for n, c in zip(want.shape, crop)]
                boxes.append(tuple(slice(s, s + c) for s, c in zip(start, crop)))
            with self.subTest(case=case["name"]):
                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    self.assertEqual(a[boxes[0]].report["coalesced_reads"], 1)  # alone, no wait
                    got = list(pool.map(lambda box: a[box], boxes))
                for box, x in zip(boxes, got):
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(x)), want[box])
                served = [x.report["coalesced_reads"] for x in got]
                self.assertTrue(all(1 <= n <= len(boxes) for n in served), served)
                # Sixteen threads within the window: they share requests.
                self.assertGreater(max(served), 1, served)

    def test_read_ahead_of_a_zarr_python_array_matches_it(self):
        with tempfile.TemporaryDirectory() as d:
            path, z, want = self.tiles_array(d)
            keys = [(slice(3, 30), slice(None), slice(5, 41)), (7, Ellipsis), (slice(-9, None),)]
            for array in (z, zarr.open_array(path, mode="r")):
                got = list(zarrs_gpu.read_ahead(array, keys, prefetch=2))
                self.assertEqual(len(got), len(keys))
                for key, (_, tile) in zip(keys, got):
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), np.asarray(z[key]))
            # Inside gpu_zarr_context() too.
            with zarrs_gpu.gpu_zarr_context():
                inside = zarr.open_array(path, mode="r")
                (_, tile), = zarrs_gpu.read_ahead(inside, keys[:1])
                np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), want[keys[0]])

    def test_read_async_matches_zarr_python(self):
        with tempfile.TemporaryDirectory() as d:
            path, z, want = self.tiles_array(d)
            a = zarrs_gpu.open(path)
            keys = [(slice(2, 30), slice(None), 3), None, "0:1, 0:1, 0:1"]
            pending = [a.read_async(k) for k in keys]
            expected = [want[2:30, :, 3], want, want[0:1, 0:1, 0:1]]
            for p, e in zip(pending, expected):
                x = p.result()
                self.assertTrue(p.done())
                self.assertIs(p.result(), x)
                np.testing.assert_array_equal(cp.asnumpy(cp.asarray(x)), e)
            self.assertIn("done=True", repr(pending[0]))

    def test_a_read_ahead_dropped_or_closed_midway(self):
        with tempfile.TemporaryDirectory() as d:
            path, _, want = self.tiles_array(d)
            a = zarrs_gpu.open(path)
            reads = zarrs_gpu.tiles(a, (4, 8, 8), prefetch=3)
            key, first = next(reads)
            del reads
            gc.collect()
            # The tile taken stays valid; the rest were dropped with the iterator.
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(first)), want[key])
            reads = zarrs_gpu.tiles(a, (4, 8, 8), order="random", prefetch=2)
            taken = [next(reads) for _ in range(3)]
            reads.close()
            self.assertEqual(list(reads), [])
            self.assertIn("ended", repr(reads))
            for key, tile in taken:
                np.testing.assert_array_equal(cp.asnumpy(cp.asarray(tile)), want[key])
            # Reads go on after it.
            np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a[3:5])), want[3:5])


    def test_dask_arrays_of_device_blocks_match_dask_from_zarr(self):
        # Needs dask[array] (a missing one is a failure here, as for the other dependencies).
        import dask
        import dask.array as da
        import zarr.codecs as zc

        import zarrs_gpu.dask as zd

        rng = np.random.default_rng(19)
        with tempfile.TemporaryDirectory() as d:
            arrays = {
                "v3_zstd": (rng.standard_normal((37, 23, 5)).astype("float32"),
                            dict(chunks=(8, 5, 2), compressors=zc.ZstdCodec(level=1))),
                "v3_sharded": (rng.integers(-1000, 1000, (43, 52)).astype("int16"), dict(chunks=(4, 5), shards=(8, 10))),
                "v2_blosc": (rng.integers(0, 60000, (19, 11)).astype("uint16"), dict(chunks=(4, 4), zarr_format=2)),
                "v3_gzip_f8": (rng.standard_normal((50,)), dict(chunks=(7,), compressors=zc.GzipCodec())),
                # Large enough for several default blocks of whole shards: 96 MiB at 32 MiB a block.
                "v3_large": (rng.standard_normal((96, 512, 512)).astype("float32"),
                             dict(chunks=(16, 64, 128), shards=(32, 128, 512), compressors=zc.ZstdCodec(level=1))),
            }
            for name, (data, options) in arrays.items():
                path = os.path.join(d, name + ".zarr")
                z = write_array(path, data, options)
                host = da.from_zarr(zarr.open_array(path, mode="r"))
                budget = 32 * 2**20 if name == "v3_large" else data.dtype.itemsize * math.prod(z.shards or z.chunks) * 3
                # Blocks that split chunks (7 a side; about 24 MiB for the large array) read right too.
                split = (40, 200, 300) if name == "v3_large" else (7,) * data.ndim
                for chunks, device in ((None, None), (None, 0), (split, None)):
                    with self.subTest(array=name, chunks=chunks, device=device):
                        x = zd.from_zarr(path, chunks=chunks, device=device, block_bytes=budget)
                        self.assertIsInstance(x._meta, cp.ndarray)
                        if chunks is None:
                            self.assertGreater(x.npartitions, 1)
                        with dask.config.set(scheduler="threads"):
                            got = x.compute()
                            self.assertIsInstance(got, cp.ndarray)
                            np.testing.assert_array_equal(cp.asnumpy(got), host.compute())
                            mean, top = dask.compute(x.mean(), x.max())
                            self.assertIsInstance(top, cp.ndarray)
                            rtol = 1e-5 if data.dtype.itemsize == 4 else 1e-12
                            np.testing.assert_allclose(float(mean), float(host.mean().compute()), rtol=rtol)
                            self.assertEqual(top.item(), host.max().compute().item())

    def test_xarray_backend_reads_to_the_device_and_matches_xarrays_zarr_engine(self):
        # Needs xarray and dask[array] (a missing one is a failure here, as for the other dependencies).
        import warnings

        import dask
        import dask.array as da
        import pandas as pd
        import xarray as xr

        from zarrs_gpu.xarray import ZarrsGpuBackendEntrypoint

        engine = "zarrs_gpu" if "zarrs_gpu" in xr.backends.list_engines() else ZarrsGpuBackendEntrypoint
        rng = np.random.default_rng(19)
        temp = rng.standard_normal((6, 50, 70)).astype("float32")
        temp[0, 0, :3] = np.nan
        packed = rng.uniform(-3, 3, (50, 70))
        packed[1, 2] = np.nan
        ds = xr.Dataset(
            {"temp": (("time", "y", "x"), temp, {"units": "K"}),
             "packed": (("y", "x"), packed),
             "counts": (("y", "x"), rng.integers(0, 100, (50, 70)).astype("int32"))},
            coords={"time": pd.date_range("2000-01-01", periods=6, freq="6h"), "y": np.arange(50.0),
                    "x": np.arange(70) * 10, "lat": (("y", "x"), rng.uniform(-90, 90, (50, 70)))},
            attrs={"title": "zarrs_gpu xarray test"})
        ds["packed"].encoding = {"dtype": "int16", "scale_factor": 0.001, "add_offset": 1.5, "_FillValue": -32768}
        ds["temp"].encoding = {"chunks": (2, 16, 32)}

        def host(x):
            return cp.asnumpy(x) if isinstance(x, cp.ndarray) else np.asarray(x)

        def assert_same(got, want):
            self.assertEqual(got.attrs, want.attrs)
            self.assertEqual(set(got.variables), set(want.variables))
            self.assertEqual(set(got.coords), set(want.coords))
            for name in want.variables:
                self.assertEqual(got[name].dims, want[name].dims, name)
                self.assertEqual(got[name].dtype, want[name].dtype, name)
                np.testing.assert_array_equal(host(got[name].data), want[name].values, err_msg=name)

        with tempfile.TemporaryDirectory() as d:
            for zarr_format in (2, 3):
                path = os.path.join(d, f"v{zarr_format}.zarr")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=True)
                    want = xr.open_dataset(path, engine="zarr").load()
                with self.subTest(zarr_format=zarr_format):
                    got = xr.open_dataset(path, engine=engine).load()
                    # Data variables are CuPy arrays (the packed one decoded on the device by
                    # zarrs_gpu.xarray.CFMaskScaleArray); coordinates are on the host.
                    self.assertIsInstance(got["temp"].data, cp.ndarray)
                    self.assertIsInstance(got["counts"].data, cp.ndarray)
                    self.assertIsInstance(got["packed"].data, cp.ndarray)
                    self.assertIsInstance(got["lat"].data, np.ndarray)
                    assert_same(got, want)
                    sub = xr.open_dataset(path, engine=engine)["temp"].isel(time=slice(1, 5, 2), x=slice(3, 40))
                    self.assertIsInstance(sub.data, cp.ndarray)
                    np.testing.assert_array_equal(host(sub.data), want["temp"].isel(time=slice(1, 5, 2), x=slice(3, 40)).values)
                    # xarray's own chunk manager would make every block numpy (which CuPy refuses).
                    import zarrs_gpu.xarray

                    chunked = zarrs_gpu.xarray.open_dataset(path, chunks={})
                    self.assertIsInstance(chunked["temp"].data, da.Array)
                    self.assertEqual(chunked["temp"].data.chunks, ((2, 2, 2), (16, 16, 16, 2), (32, 32, 6)))
                    with dask.config.set(scheduler="threads"):
                        computed = chunked.compute()
                        self.assertIsInstance(computed["temp"].data, cp.ndarray)
                        assert_same(computed, want)
                        mean = chunked["temp"].mean().compute()
                    np.testing.assert_allclose(float(host(mean.data)), float(want["temp"].mean()), rtol=1e-5)


def write_packed_int16(path, shape, chunks, seed=29):
    """A v3 group with one int16 variable packed as xarray's to_zarr packs it (scale_factor,
    add_offset, _FillValue attributes, dimension_names), written slab by slab with zarr-python;
    about a tenth of the values are the fill value. Returns the attributes."""
    import warnings

    import zarr.codecs as zc

    attrs = {"scale_factor": 0.002, "add_offset": -7.5, "_FillValue": -32768, "units": "m"}
    g = zarr.open_group(path, mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = g.create_array("packed", shape=shape, chunks=chunks, dtype="int16", fill_value=0,
                           dimension_names=["time", "y", "x"], compressors=zc.ZstdCodec(level=1))
    a.attrs.update(attrs)
    rng = np.random.default_rng(seed)
    for t in range(shape[0]):
        slab = rng.integers(-32767, 32768, shape[1:], dtype=np.int16)
        slab[rng.random(shape[1:], dtype=np.float32) < 0.1] = -32768
        a[t] = slab
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # v3 consolidated metadata's warning
        zarr.consolidate_metadata(path)
    return attrs


class XarrayCFDecodingGpuTests(unittest.TestCase):
    """zarrs_gpu.xarray's CF mask-and-scale decoding on the GPU (CFMaskScaleArray on CuPy):
    decoded data variables are CuPy arrays equal bit for bit to xarray's zarr engine's (host)
    values, with the same dtypes, attrs and encoding; and a GiB of packed int16 decoded on the
    device. Uses test_cpu.py's dataset (every kind of mask and scale, v2 and v3)."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, HERE)
        import xarray as xr
        from test_cpu import cf_test_dataset, write_cf_stores

        from zarrs_gpu.xarray import ZarrsGpuBackendEntrypoint

        cls.engine = "zarrs_gpu" if "zarrs_gpu" in xr.backends.list_engines() else ZarrsGpuBackendEntrypoint
        cls.dir = tempfile.TemporaryDirectory()
        # The times with NaT fill values are left out: xarray's own zarr engine (the reference)
        # overflows decoding them with the GPU host's numpy/pandas; they are host-decoded by
        # xarray's code in this engine too, and the CPU tests compare them.
        cls.ds = cf_test_dataset(seed=31, shape=(6, 130, 170)).drop_vars(["valid", "lead"])
        cls.stores = write_cf_stores(cls.dir.name, cls.ds)

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def open_both(self, fmt, **options):
        import warnings

        import xarray as xr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = xr.open_dataset(self.stores[fmt], engine="zarr", **options).load()
            import zarrs_gpu.xarray

            if "chunks" in options:  # Dask of CuPy blocks (xarray's own manager makes them numpy)
                options = dict(options, chunked_array_type=zarrs_gpu.xarray.DeviceDaskManager())
            got = xr.open_dataset(self.stores[fmt], engine=self.engine, **options)
        return got, want

    def assert_bits(self, got, want, what):
        """``got`` a CuPy array equal to numpy's ``want`` in dtype, shape and bytes."""
        self.assertIsInstance(got, cp.ndarray, what)
        got = cp.asnumpy(got)
        self.assertEqual(got.dtype, want.dtype, what)
        self.assertEqual(got.shape, want.shape, what)
        self.assertEqual(got.tobytes(), np.ascontiguousarray(want).tobytes(), what)

    def test_decoded_variables_are_cupy_arrays_equal_to_xarrays_zarr_engine(self):
        from test_cpu import CF_DEVICE_DECODED, STORAGE_ENCODING, mask_scale_array

        host_decoded = {"valid", "lead"}  # times and timedeltas: xarray's decoders, on the host
        for fmt in (2, 3):
            for options, decoded_here in (({}, CF_DEVICE_DECODED), (dict(mask_and_scale=False), set()),
                                          (dict(decode_cf=False), set()),
                                          (dict(mask_and_scale={"packed": False}), CF_DEVICE_DECODED - {"packed"})):
                with self.subTest(zarr_format=fmt, options=options):
                    got, want = self.open_both(fmt, **options)
                    for name in want.variables:
                        self.assertEqual(mask_scale_array(got[name].variable._data) is not None, name in decoded_here,
                                         name)
                        g, w = got[name].variable, want[name].variable
                        self.assertEqual(repr(sorted(g.attrs.items())), repr(sorted(w.attrs.items())), name)
                        ge = {k: v for k, v in g.encoding.items() if k not in STORAGE_ENCODING}
                        we = {k: v for k, v in w.encoding.items() if k not in STORAGE_ENCODING}
                        self.assertEqual(repr(sorted(ge.items())), repr(sorted(we.items())), name)
                    for name in got.data_vars:
                        data = got[name].data  # read (and decoded) now
                        if name in host_decoded and options.get("decode_cf", True):
                            np.testing.assert_array_equal(data, want[name].values)
                        else:
                            self.assert_bits(data, want[name].values, name)
                    loaded = got.load()
                    for name in loaded.data_vars:
                        if name not in host_decoded:
                            self.assertIsInstance(loaded[name].data, cp.ndarray, name)
                    # Coordinates are on the host (pandas indexes; lat decoded there by numpy).
                    # (Without CF decoding lat is a data variable: on the device.)
                    lat = loaded["lat"].data
                    np.testing.assert_array_equal(cp.asnumpy(lat) if isinstance(lat, cp.ndarray) else lat,
                                                  want["lat"].values)
            with self.subTest(zarr_format=fmt, what="subsets"):
                got, want = self.open_both(fmt)
                for key in (dict(time=slice(1, 5, 2), x=slice(150, 3, -4)), dict(time=-1, y=slice(None, None, -3)),
                            dict(y=[5, 100, 7]), dict(time=2, y=64, x=9)):
                    for name in ("packed", "u8", "f32", "mv", "multi"):
                        k = {d: v for d, v in key.items() if d in got[name].dims}
                        self.assert_bits(got[name].isel(k).data, want[name].isel(k).values, f"{name} {key}")

    def test_chunks_give_dask_arrays_of_cupy_blocks(self):
        import dask
        import dask.array as da

        for fmt in (2, 3):
            with self.subTest(zarr_format=fmt):
                got, want = self.open_both(fmt, chunks={})
                self.assertIsInstance(got["packed"].data, da.Array)
                with dask.config.set(scheduler="threads"):
                    computed = got.compute()
                    mean = float(got["packed"].mean().compute().data.item())
                for name in ("packed", "u8", "f32", "mv", "scaled", "i16", "multi"):
                    self.assert_bits(computed[name].data, want[name].values, name)
                np.testing.assert_allclose(mean, float(want["packed"].mean()), rtol=1e-12)

    def test_a_gibibyte_of_packed_int16_is_decoded_on_the_device(self):
        import warnings
        from unittest import mock

        import xarray as xr

        import zarrs_gpu.dask as zd
        from zarrs_gpu.xarray import CFMaskScaleArray, _ours

        shape = (8, 8192, 8192)  # 1 GiB of int16; 4 GiB decoded (float64)
        path = os.path.join(self.dir.name, "packed_1gib.zarr")
        write_packed_int16(path, shape, chunks=(1, 2048, 2048))
        read_types = []

        def recording(path, array, device, box):
            block = zd.read_on_device(path, array, device, box)
            read_types.append(type(block))
            return block

        ds = xr.open_dataset(path, engine=self.engine)
        lazy = ds["packed"].variable._data
        while not isinstance(lazy, CFMaskScaleArray):
            lazy = lazy.array  # xarray's cache and copy-on-write wrappers
        self.assertFalse(_ours(lazy).host)
        with mock.patch.object(zd, "reader", recording):
            data = ds["packed"].data
        # One read, a CuPy array, decoded into a CuPy float64 array: no step went through the
        # host (CuPy refuses to be made a numpy array implicitly, so any np.asarray would raise).
        self.assertEqual(read_types, [cp.ndarray])
        self.assertIsInstance(data, cp.ndarray)
        self.assertEqual(data.dtype, np.float64)
        self.assertEqual(data.shape, shape)
        nans = int(cp.isnan(data).sum())
        self.assertGreater(nans, 0.09 * data.size)
        self.assertLess(nans, 0.11 * data.size)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = xr.open_dataset(path, engine="zarr")["packed"].values
        for t in range(shape[0]):  # slab by slab: bit for bit
            self.assertTrue(np.array_equal(cp.asnumpy(data[t]).view(np.uint64), want[t].view(np.uint64)), t)
        del data, lazy, ds
        cp.get_default_memory_pool().free_all_blocks()


class TorchGpuTests(unittest.TestCase):
    """zarrs_gpu.torch on the GPU: dataset items and loader batches (CropLoader, DataLoader,
    DistributedSampler halves) equal zarr-python's crops element for element, and the DDP example
    trains with two ranks in separate processes."""

    EXAMPLE = os.path.join(HERE, "..", "examples", "ddp_train.py")

    @classmethod
    def setUpClass(cls):
        import warnings

        import zarr.codecs as zc

        cls.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(31)
        # Input: sharded zstd with partial edge shards and chunks, two shards never written.
        cls.image = rng.standard_normal((40, 70, 45)).astype("float32")
        cls.image[:16, :32, :32] = -3.5
        cls.image[16:32, 32:64, 32:45] = -3.5
        cls.image_path = os.path.join(cls.dir.name, "image.zarr")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            z = zarr.create_array(store=cls.image_path, shape=cls.image.shape, dtype="float32", chunks=(8, 16, 16),
                                  shards=(16, 32, 32), compressors=zc.ZstdCodec(level=3), fill_value=-3.5)
        for z0 in range(0, 40, 16):
            for y0 in range(0, 70, 32):
                for x0 in range(0, 45, 32):
                    if (z0, y0, x0) not in ((0, 0, 0), (16, 32, 32)):
                        box = (slice(z0, z0 + 16), slice(y0, y0 + 32), slice(x0, x0 + 32))
                        z[box] = cls.image[box]
        # Label: the same grid, uint8, gzip chunks, one chunk never written (fill value 9).
        cls.label = rng.integers(0, 4, (40, 70, 45)).astype("uint8")
        cls.label[10:20, 10:20, 10:20] = 9
        cls.label_path = os.path.join(cls.dir.name, "label.zarr")
        lz = zarr.create_array(store=cls.label_path, shape=cls.label.shape, dtype="uint8", chunks=(10, 10, 10),
                               compressors=zc.GzipCodec(level=5), fill_value=9)
        for z0 in range(0, 40, 10):
            for y0 in range(0, 70, 10):
                for x0 in range(0, 45, 10):
                    if (z0, y0, x0) != (10, 10, 10):
                        box = (slice(z0, z0 + 10), slice(y0, y0 + 10), slice(x0, x0 + 10))
                        lz[box] = cls.label[box]
        # Both as zarr-python reads them: what every crop is compared with.
        cls.image = np.asarray(zarr.open_array(cls.image_path, mode="r")[...])
        cls.label = np.asarray(zarr.open_array(cls.label_path, mode="r")[...])
        assert (cls.image[:16, :32, :32] == -3.5).all() and (cls.label[10:20, 10:20, 10:20] == 9).all()

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def crop(self, data, box):
        return data[(slice(None),) * (data.ndim - len(box)) + tuple(slice(a, b) for a, b in box)]

    def assert_batch(self, batch, indices, ds, data):
        self.assertIsInstance(batch, torch.Tensor)
        self.assertTrue(batch.is_cuda)
        np.testing.assert_array_equal(batch.cpu().numpy(), np.stack([self.crop(data, ds.plan[i]) for i in indices]))

    def test_dataset_items_match_zarr_python(self):
        import zarrs_gpu.torch as zt

        ds = zt.CropDataset([self.image_path, self.label_path], (9, 20, 17), crops=40, seed=3)
        edge = 0
        for i in range(len(ds)):
            x, y = ds[i]
            box = ds.plan[i]
            edge += any(b > (n // c) * c for (_, b), n, c in zip(box, (40, 70, 45), (8, 16, 16)))
            for t, data, dtype in ((x, self.image, torch.float32), (y, self.label, torch.uint8)):
                self.assertEqual((t.dtype, t.device), (dtype, torch.device("cuda", torch.cuda.current_device())))
                np.testing.assert_array_equal(t.cpu().numpy(), self.crop(data, box))
        self.assertGreater(edge, 5, "crops on partial edge chunks")
        self.assertEqual(ds.device, torch.cuda.current_device())
        # The grid's crops put together are the whole array.
        grid = zt.CropDataset(self.image_path, (16, 32, 20))
        whole = torch.full(self.image.shape, float("nan"), device="cuda")
        for i in range(len(grid)):
            whole[tuple(slice(a, b) for a, b in grid.plan[i])] = grid[i]
        np.testing.assert_array_equal(whole.cpu().numpy(), self.image)
        # The current device at the first read, or the one given.
        if torch.cuda.device_count() >= 2:
            with torch.cuda.device(1):
                other = zt.CropDataset(self.label_path, (4, 5, 6), crops=3)
                self.assertEqual(other[0].device, torch.device("cuda", 1))
            self.assertEqual(zt.CropDataset(self.label_path, (4, 5, 6), crops=3, device=1)[2].device.index, 1)
            np.testing.assert_array_equal(other[1].cpu().numpy(), self.crop(self.label, other.plan[1]))

    def test_loaders_batches_match_zarr_python(self):
        import zarrs_gpu.torch as zt

        ds = zt.CropDataset([self.image_path, self.label_path], (8, 24, 30), crops=30, seed=8)
        order = np.random.default_rng(2).permutation(30)[:22].tolist()
        side = torch.cuda.Stream()
        for prefetch in (0, 1, 2):
            with self.subTest(prefetch=prefetch):
                loader = zt.CropLoader(ds, 4, sampler=order, prefetch=prefetch, return_indices=True)
                seen = []
                # On a side stream of torch's, with work queued between batches: batches are
                # ready there (each crop complete when handed out; the stack on that stream).
                with torch.cuda.stream(side):
                    for indices, (x, y) in loader:
                        self.assertEqual(tuple(x.shape), (len(indices), 8, 24, 30))
                        busy = torch.randn(2048, 2048, device="cuda")
                        for _ in range(5):
                            busy = busy @ busy / 2048
                        total = (x.double().sum(), y.long().sum())
                        seen.append((indices, x, y, total))
                side.synchronize()
                self.assertEqual([i for indices, *_ in seen for i in indices], order)
                for indices, x, y, (sx, sy) in seen:
                    self.assert_batch(x, indices, ds, self.image)
                    self.assert_batch(y, indices, ds, self.label)
                    want = np.stack([self.crop(self.image, ds.plan[i]) for i in indices]).astype(np.float64).sum()
                    self.assertAlmostEqual(sx.item(), want, delta=1e-9 * np.abs(self.image).sum())
        # A pass left early, then a full one.
        first = next(iter(zt.CropLoader(ds, 3, prefetch=2)))
        self.assert_batch(first[0], [0, 1, 2], ds, self.image)
        # torch's own DataLoader, in the process (its batches through __getitems__).
        loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=order, num_workers=0)
        for k, (x, y) in enumerate(loader):
            indices = order[5 * k:5 * k + 5]
            self.assert_batch(x, indices, ds, self.image)
            self.assert_batch(y, indices, ds, self.label)
        self.assertEqual(k, len(order) // 5)
        # With zarrs_gpu.torch.collate: each batch one request per array, handed on as read.
        loader = torch.utils.data.DataLoader(ds, batch_size=5, sampler=order, num_workers=0, collate_fn=zt.collate)
        for k, (x, y) in enumerate(loader):
            indices = order[5 * k:5 * k + 5]
            self.assertEqual(tuple(x.shape), (len(indices), 8, 24, 30))
            self.assert_batch(x, indices, ds, self.image)
            self.assert_batch(y, indices, ds, self.label)
        x, y = ds.read_batch([3, 3, 29])
        self.assert_batch(x, [3, 3, 29], ds, self.image)
        self.assert_batch(y, [3, 3, 29], ds, self.label)
        # Worker processes are refused with a message saying what to use.
        workers = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=1, timeout=120)
        with self.assertRaisesRegex(RuntimeError, "num_workers=0"):
            next(iter(workers))

    def test_distributed_sampler_gives_each_rank_its_half(self):
        import zarrs_gpu.torch as zt

        ds = zt.CropDataset([self.image_path, self.label_path], (6, 10, 12), crops=24, seed=4)
        halves = {}
        for epoch in (0, 1):
            for rank in (0, 1):
                sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=7)
                loader = zt.CropLoader(ds, 5, sampler=sampler, return_indices=True)
                loader.set_epoch(epoch)
                read = []
                for indices, (x, y) in loader:
                    self.assert_batch(x, indices, ds, self.image)
                    self.assert_batch(y, indices, ds, self.label)
                    read.extend(indices)
                self.assertEqual(read, list(sampler))
                halves[epoch, rank] = read
            self.assertEqual(set(halves[epoch, 0]) & set(halves[epoch, 1]), set())
            self.assertEqual(sorted(halves[epoch, 0] + halves[epoch, 1]), list(range(24)))
        self.assertNotEqual(halves[0, 0], halves[1, 0], "set_epoch gave another order")

    def test_the_ddp_example_trains_two_ranks(self):
        import warnings

        import zarr.codecs as zc

        rng = np.random.default_rng(5)
        with tempfile.TemporaryDirectory() as d:
            # Input with a channel axis before the cropped ones; label uint8 of the same grid.
            image = rng.standard_normal((2, 24, 48, 40)).astype("float32")
            image_path = os.path.join(d, "image.zarr")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z = zarr.create_array(store=image_path, shape=image.shape, dtype="float32", chunks=(1, 8, 16, 16),
                                      shards=(2, 8, 32, 32), compressors=zc.ZstdCodec(level=1))
            z[...] = image
            label_path = os.path.join(d, "label.zarr")
            zarr.create_array(store=label_path, shape=(24, 48, 40), dtype="uint8", chunks=(8, 16, 16))[...] = \
                (image.sum(0) > 0).astype("uint8")
            report = os.path.join(d, "report")
            os.makedirs(report)
            # 16 crops over 2 ranks, 2 a batch: 4 steps an epoch, 8 steps are 2 epochs.
            run = subprocess.run([sys.executable, self.EXAMPLE, "--array", image_path, "--label", label_path,
                                  "--crop", "8,16,16", "--crops", "16", "--batch-size", "2", "--steps", "8",
                                  "--nprocs", "2", "--seed", "3", "--report", report],
                                 capture_output=True, text=True, timeout=600)
            self.assertEqual(run.returncode, 0, run.stdout + run.stderr)
            ranks = []
            for rank in (0, 1):
                with open(os.path.join(report, f"rank{rank}.json")) as f:
                    ranks.append(json.load(f))
            two = torch.cuda.device_count() >= 2
            for rank, r in enumerate(ranks):
                self.assertEqual((r["rank"], r["world_size"], r["dataset_len"]), (rank, 2, 16))
                self.assertEqual(r["backend"], "nccl" if two else "gloo")
                self.assertEqual(r["device"], rank if two else 0)
                self.assertEqual(r["tensor_device"], r["device"])
                self.assertEqual([e["epoch"] for e in r["epochs"]], [0, 1])
                for e in r["epochs"]:
                    self.assertEqual(e["read"], e["sampler"], "a rank reads exactly its sampler's crops")
                self.assertEqual(len(r["losses"]), 8)
                self.assertTrue(all(math.isfinite(v) for v in r["losses"]), r["losses"])
                # The crops read were those crops' elements (zarr-python's sums of them).
                from zarrs_gpu.torch import CropPlan

                plan = CropPlan((24, 48, 40), (8, 16, 16), 16, seed=3)
                for i, total in r["crop_sums"]:
                    want = self.crop(image, plan[i]).astype(np.float64).sum()
                    self.assertAlmostEqual(total, want, delta=1e-6 * (1 + abs(want)))
            for epoch in (0, 1):
                a, b = (set(r["epochs"][epoch]["read"]) for r in ranks)
                self.assertEqual(a & b, set(), f"epoch {epoch}: the ranks' crops are disjoint")
                self.assertEqual(a | b, set(range(16)), f"epoch {epoch}: together, every crop")
            self.assertNotEqual(ranks[0]["epochs"][0]["read"], ranks[0]["epochs"][1]["read"])
            # DDP's all-reduce kept the ranks' parameters identical.
            self.assertEqual(ranks[0]["parameters_sha256"], ranks[1]["parameters_sha256"],
                             (ranks[0]["parameters_sum"], ranks[1]["parameters_sum"]))
            # The example's demo arrays, when given none.
            demo = subprocess.run([sys.executable, self.EXAMPLE, "--steps", "4", "--nprocs", "2"],
                                  capture_output=True, text=True, timeout=600)
            self.assertEqual(demo.returncode, 0, demo.stdout + demo.stderr)
            self.assertIn("2 ranks", demo.stdout)
            self.assertIn("loss", demo.stdout)


class DistributedGpuTests(unittest.TestCase):
    """zarrs_gpu.dask on distributed: worker processes of zarrs_gpu.dask.local_cluster, one per
    GPU (two on GPU 0 where there is one), each seeing only its GPU and reading its blocks there;
    CuPy results of reductions sent between processes, equal to dask.array.from_zarr's on the
    host. Needs distributed (a missing one is a failure here, as for the other dependencies)."""

    def test_reductions_on_worker_processes_match_dask_from_zarr(self):
        import dask.array as da
        import zarr.codecs as zc
        from distributed import Client, get_task_stream

        import zarrs_gpu.dask as zd

        gpus = cp.cuda.runtime.getDeviceCount()
        devices = list(range(gpus)) if gpus > 1 else [0, 0]
        rng = np.random.default_rng(1919)
        arrays = {
            # Several default blocks of whole shards at 8 MiB a block (one shard each).
            "v3_sharded_f4": ((rng.standard_normal((64, 256, 512)) * 300).astype("float32"),
                              dict(chunks=(16, 64, 128), shards=(32, 128, 512), compressors=zc.ZstdCodec(level=1))),
            "v3_zstd_edges_f8": (rng.standard_normal((37, 53, 29)) * 300, dict(chunks=(8, 16, 7),
                                                                                compressors=zc.ZstdCodec(level=1))),
            "v2_blosc_i2": (rng.integers(-1000, 1000, (45, 67)).astype("int16"), dict(chunks=(4, 8), zarr_format=2)),
        }
        with tempfile.TemporaryDirectory() as d, \
                zd.local_cluster(devices=devices, dask_cuda=False, dashboard_address=None) as cluster, \
                Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(len(devices), timeout=120)

            def seen():
                import cupy

                import zarrs_gpu._cluster

                return (os.environ.get("CUDA_VISIBLE_DEVICES"), cupy.cuda.runtime.getDeviceCount(),
                        cupy.cuda.Device().id, zarrs_gpu._cluster._serialization_ready, os.getpid())

            state = list(client.run(seen).values())
            self.assertEqual(sorted(s[0] for s in state), sorted(zd.worker_devices(devices=devices)))
            self.assertEqual({s[1:4] for s in state}, {(1, 0, True)})  # one GPU each, as device 0; preloaded
            self.assertEqual(len({s[4] for s in state} | {os.getpid()}), len(devices) + 1)
            for name, (data, options) in arrays.items():
                path = os.path.join(d, name + ".zarr")
                z = write_array(path, data, options)
                unit = z.shards or z.chunks
                budget = 8 * 2**20 if name == "v3_sharded_f4" else data.dtype.itemsize * math.prod(unit) * 2
                with self.subTest(array=name):
                    x = zd.from_zarr(path, block_bytes=budget)
                    self.assertIsInstance(x._meta, cp.ndarray)
                    self.assertGreaterEqual(x.npartitions, 4)
                    host = da.from_zarr(zarr.open_array(path, mode="r"))
                    counts, _ = da.histogram(x, bins=32, range=(-1000, 1000))  # edges exact: width 62.5
                    # Float sums in float64 (the blocks add in another order than the host's).
                    sum_dtype = "f8" if data.dtype.kind == "f" else None
                    with get_task_stream(client) as stream:
                        mean, top, total, low, hist = client.compute(
                            [x.mean(dtype="f8"), x.max(), x.sum(dtype=sum_dtype), x.min(axis=0), counts], sync=True)
                    for value in (mean, top, total, low, hist):
                        self.assertIsInstance(value, cp.ndarray)
                    np.testing.assert_allclose(float(mean), float(host.mean(dtype="f8").compute(scheduler="threads")),
                                               rtol=1e-10)
                    self.assertEqual(top.item(), host.max().compute(scheduler="threads").item())
                    want_total = host.sum(dtype=sum_dtype).compute(scheduler="threads")
                    if sum_dtype:
                        np.testing.assert_allclose(float(total), float(want_total), rtol=1e-10)
                    else:
                        self.assertEqual(total.item(), want_total.item())
                    np.testing.assert_array_equal(cp.asnumpy(low), host.min(axis=0).compute(scheduler="threads"))
                    np.testing.assert_array_equal(cp.asnumpy(hist), np.histogram(data, bins=32, range=(-1000, 1000))[0])
                    readers = {t["worker"] for t in stream.data if "zarrs-gpu-from-zarr" in str(t["key"])}
                    self.assertEqual(len(readers), len(devices), stream.data[:4])
                    whole = client.compute(x, sync=True)
                    self.assertIsInstance(whole, cp.ndarray)
                    np.testing.assert_array_equal(cp.asnumpy(whole), data)
            # Partial results (CuPy arrays) went from worker to worker.
            fetched = client.run(lambda dask_worker: dask_worker.state.transfer_incoming_count_total)
            self.assertGreater(sum(fetched.values()), 0)
            # How they travelled: distributed's serializer (rmm or numba there) or pickled.
            self.assertEqual(len(set(client.run(zd.register_cupy_serialization).values())), 1)

    def test_local_cluster_by_default_has_one_worker_per_gpu(self):
        from distributed import Client

        import zarrs_gpu.dask as zd

        gpus = cp.cuda.runtime.getDeviceCount()
        with zd.local_cluster(dashboard_address=None) as cluster, Client(cluster, set_as_default=False) as client:
            client.wait_for_workers(gpus, timeout=120)
            seen = client.run(lambda: (os.environ.get("CUDA_VISIBLE_DEVICES", ""), __import__("cupy").cuda.Device().id))
            self.assertEqual(len(seen), gpus)
            # dask-cuda's workers see every GPU, their own first; this package's see only theirs.
            firsts = sorted(v[0].split(",")[0] for v in seen.values())
            self.assertEqual(firsts, zd.worker_devices())
            self.assertEqual({v[1] for v in seen.values()}, {0})


class RemoteGpuTests(unittest.TestCase):
    """Arrays zarr-python writes into an S3 bucket through obstore (s3s-fs on loopback), read to the
    device by URL: equal to zarr-python's reads through S3, whole and in boxes, sharded or not,
    edge and missing chunks included."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, HERE)
        import s3_server

        # Skipped, saying why, where s3s-fs is missing, unless ZARRS_GPU_REQUIRE_S3=1.
        cls.server = s3_server.start_or_skip()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def test_s3_reads_equal_zarr_python_reads_through_s3(self):
        import zarr.codecs as zc

        server = self.server
        rng = np.random.default_rng(8)
        cases = {
            "zstd.zarr": dict(shape=(70, 90, 33), chunks=(16, 32, 16), dtype="float32",
                              compressors=zc.ZstdCodec(level=3)),
            "sharded.zarr": dict(shape=(64, 100), chunks=(8, 10), shards=(32, 50), dtype="uint16",
                                 compressors=[zc.ZstdCodec(level=1), zc.Crc32cCodec()]),
            "gzip.zarr": dict(shape=(50, 61), chunks=(16, 16), dtype="int32", compressors=zc.GzipCodec(level=5),
                              fill_value=-7),
            "raw.zarr": dict(shape=(40, 40, 9), chunks=(16, 16, 4), dtype="float64", compressors=None),
        }
        for name, kwargs in cases.items():
            with self.subTest(name=name):
                z = zarr.create_array(server.zarr_store(name), **kwargs)
                values = rng.integers(0, 5000, kwargs["shape"]).astype(kwargs["dtype"])
                # Part of the array written: the rest is missing chunks (the fill value).
                box = tuple(slice(0, n - n // 3) for n in kwargs["shape"])
                z[box] = values[box]
                want = zarr.open_array(server.zarr_store(name, read_only=True), mode="r")
                a = zarrs_gpu.open(server.url(name), storage_options=server.storage_options())
                whole = a[...]
                np.testing.assert_array_equal(cp.asnumpy(cp.asarray(whole)), want[...])
                self.assertIn("remote", whole.report["io"])
                for _ in range(6):
                    key = []
                    for n in kwargs["shape"]:
                        start = int(rng.integers(0, n))
                        key.append(slice(start, int(rng.integers(start + 1, n + 1))))
                    key = tuple(key)
                    np.testing.assert_array_equal(cp.asnumpy(cp.asarray(a[key])), want[key], err_msg=str(key))

    def test_zarr_python_object_store_arrays_read_and_write_on_the_device_in_gpu_mode(self):
        """Inside gpu_zarr_context(), zarr-python arrays in an ObjectStore (obstore's S3Store, as
        zarr-python opens S3) are read and written by zarrs_gpu through the same bucket: equal to
        zarr-python's host reads, boxes and advanced selections, missing chunks included."""
        import zarr.codecs as zc

        from zarrs_gpu.pipeline import GpuCodecPipeline

        server = self.server
        rng = np.random.default_rng(31)
        kwargs = dict(shape=(45, 70, 19), chunks=(16, 32, 8), dtype="float32", compressors=zc.ZstdCodec(level=3),
                      fill_value=-1.0)
        z = zarr.create_array(server.zarr_store("gpu-mode.zarr"), **kwargs)
        values = rng.random(kwargs["shape"], dtype=np.float32)
        box = (slice(0, 30), slice(0, 50), slice(None))
        z[box] = values[box]
        host = zarr.open_array(server.zarr_store("gpu-mode.zarr", read_only=True), mode="r")
        for key in [(Ellipsis,), (slice(3, 44), slice(10, 70), slice(2, 19)), (7,)]:
            with self.subTest(key=key):
                want = np.asarray(host[key])
                before = GpuCodecPipeline.device_reads
                with zarrs_gpu.gpu_zarr_context():
                    got = zarr.open_array(server.zarr_store("gpu-mode.zarr", read_only=True), mode="r")[key]
                self.assertIsInstance(got, cp.ndarray)
                np.testing.assert_array_equal(cp.asnumpy(got), want)
                self.assertEqual(GpuCodecPipeline.device_reads, before + 1, "read by zarrs_gpu")
        points = (np.array([0, 44, 20, 3]), np.array([69, 0, 33, 50]), np.array([18, 0, 7, 9]))
        with zarrs_gpu.gpu_zarr_context():
            got = zarr.open_array(server.zarr_store("gpu-mode.zarr", read_only=True), mode="r").vindex[points]
        np.testing.assert_array_equal(cp.asnumpy(got), np.asarray(host.vindex[points]))
        # A device write into the bucket, read back by zarr-python on the host.
        tile = cp.asarray(rng.random((20, 25, 19), dtype=np.float32))
        want = np.asarray(host[...])
        want[20:40, 40:65] = cp.asnumpy(tile)
        before = GpuCodecPipeline.device_writes
        with zarrs_gpu.gpu_zarr_context():
            zarr.open_array(server.zarr_store("gpu-mode.zarr"), mode="r+")[20:40, 40:65] = tile
        self.assertEqual(GpuCodecPipeline.device_writes, before + 1, "written by zarrs_gpu")
        np.testing.assert_array_equal(np.asarray(
            zarr.open_array(server.zarr_store("gpu-mode.zarr", read_only=True), mode="r")[...]), want)


class StallingChunks:
    """A loopback HTTP server of a directory whose chunk requests (keys under ``/c/``) wait until
    ``release()`` (or 20 s): a remote array that opens at once and whose reads hang."""

    def __init__(self, root):
        import functools
        import http.server
        import threading

        try:
            from RangeHTTPServer import RangeRequestHandler as Base
        except ImportError:
            Base = http.server.SimpleHTTPRequestHandler
        released = self.released = threading.Event()

        class Handler(Base):
            def log_message(self, *args):
                pass

            def stall(self):
                if "/c/" in self.path:
                    released.wait(20)

            def do_GET(self):
                self.stall()
                super().do_GET()

            def do_HEAD(self):
                self.stall()
                super().do_HEAD()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=root))
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, name):
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def release(self):
        self.released.set()

    def close(self):
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class InterruptGpuTests(unittest.TestCase):
    """Waits for reads that hang (a remote store whose chunk requests stall): Ctrl-C, timeouts,
    and close() from another thread, none waiting for the read."""

    def setUp(self):
        import zarr.codecs as zc

        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)
        self.values = np.arange(64 * 64, dtype="float32").reshape(64, 64)
        write_array(os.path.join(self.dir.name, "a.zarr"), self.values,
                    dict(chunks=(16, 16), compressors=zc.ZstdCodec(level=1)))
        self.server = StallingChunks(self.dir.name)
        self.addCleanup(self.server.close)
        self.array = zarrs_gpu.open(self.server.url("a.zarr"))

    def interrupt_after(self, seconds):
        import _thread
        import threading

        timer = threading.Timer(seconds, _thread.interrupt_main)
        timer.start()
        self.addCleanup(timer.cancel)

    def test_ctrl_c_interrupts_a_hanging_read(self):
        import time

        for read in (lambda: self.array[...], lambda: self.array.read_many([(slice(0, 8),)]),
                     lambda: self.array.read_async().result(), lambda: next(self.array.read_ahead([...]))):
            with self.subTest(read=read):
                self.interrupt_after(0.3)
                start = time.monotonic()
                with self.assertRaises(KeyboardInterrupt):
                    read()
                self.assertLess(time.monotonic() - start, 1.3)
        # The reads left running end when the server answers; a new read is whole and equal.
        self.server.release()
        cp.testing.assert_array_equal(cp.asarray(self.array[...]), cp.asarray(self.values))

    def test_ctrl_c_stops_a_read_into_before_it_writes(self):
        import time

        out = cp.full((64, 64), -1, dtype="float32")
        self.interrupt_after(0.3)
        start = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            self.array.read_into(out)
        self.assertLess(time.monotonic() - start, 1.3)
        # The server answers now: the cancelled read stops before it places anything in `out`.
        self.server.release()
        time.sleep(1.0)
        cp.cuda.Device().synchronize()
        self.assertTrue(bool((out == -1).all()), "an interrupted read_into wrote its destination afterwards")
        self.array.read_into(out)
        cp.testing.assert_array_equal(out, cp.asarray(self.values))

    def test_a_pending_read_times_out_and_keeps_its_result(self):
        import time

        pending = self.array.read_async((slice(8, 40), slice(0, 64)))
        for _ in range(2):
            start = time.monotonic()
            with self.assertRaises(TimeoutError):
                pending.result(timeout=0.05)
            self.assertLess(time.monotonic() - start, 0.5)
        self.assertFalse(pending.done())
        self.server.release()
        got = pending.result(timeout=30)
        self.assertIs(pending.result(timeout=0), got)
        cp.testing.assert_array_equal(cp.asarray(got), cp.asarray(self.values[8:40]))

    def test_close_from_another_thread_does_not_wait_for_the_read(self):
        import threading
        import time

        reads = self.array.read_ahead([(slice(0, 16),), (slice(16, 32),)])
        ended = []

        def consume():
            try:
                ended.append(next(reads, "stopped"))
            except Exception as e:  # noqa: BLE001 (recorded for the assertion)
                ended.append(e)

        consumer = threading.Thread(target=consume)
        consumer.start()
        time.sleep(0.3)  # the consumer waits in __next__ on the hanging read
        start = time.monotonic()
        reads.close()
        self.assertLess(time.monotonic() - start, 0.2, "close() waited for the read in flight")
        consumer.join(2)
        self.assertFalse(consumer.is_alive(), "the waiting __next__ did not end after close()")
        self.assertEqual(ended, ["stopped"])
        self.assertIsNone(next(reads, None))
        # The abandoned read ends (and its array is dropped) once the server answers.
        self.server.release()
        cp.testing.assert_array_equal(cp.asarray(self.array[0:16]), cp.asarray(self.values[0:16]))

    def test_a_release_does_not_wait_for_other_streams(self):
        """Releasing a DLPack export (torch.from_dlpack, on torch's stream) waits for neither the
        device nor that stream on the host: a long kernel on another stream is still running."""
        import time

        self.server.release()
        x = self.array[...]
        t = torch.from_dlpack(x)
        del x
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):
            big = torch.ones((8192, 8192), device="cuda")
            for _ in range(20):
                big = big @ big / 8192
            done = torch.cuda.Event()
            done.record(other)
        start = time.monotonic()
        del t
        took = time.monotonic() - start
        self.assertFalse(done.query(), "the other stream's work ended before the release: make it longer")
        self.assertLess(took, 0.05, f"the release waited {took:.3f} s")
        other.synchronize()


if __name__ == "__main__":
    unittest.main()
