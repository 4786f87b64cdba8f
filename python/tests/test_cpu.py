"""zarrs_gpu on a machine without a GPU (what CI runs): arrays open and describe themselves,
bad indices and options are the right exceptions with the Rust messages, and a read says plainly
that there is no GPU. Needs zarr-python (to write the arrays).

    python -m unittest discover -s python/tests -p 'test_cpu.py'
"""
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import zarr
import zarr.codecs as zc

import zarrs_gpu


@contextlib.contextmanager
def without_cupy():
    """`import cupy` raises ImportError inside the block; cupy as it was after."""
    had, saved = "cupy" in sys.modules, sys.modules.get("cupy")
    sys.modules["cupy"] = None
    try:
        yield
    finally:
        if had:
            sys.modules["cupy"] = saved
        else:
            del sys.modules["cupy"]


def numpy_keys(shape, rng, n):
    """Random numpy-style basic indices of an array of `shape`: integers (in bounds), slices with
    bounds anywhere (past the ends, negative, reversed, equal), `...`; fewer items than dimensions
    too."""
    keys = []
    for _ in range(n):
        items = []
        for size in shape[: rng.integers(0, len(shape) + 1)]:
            kind = rng.integers(0, 3)
            if kind == 0 and size > 0:
                items.append(int(rng.integers(-size, size)))
            else:
                bound = lambda: None if rng.random() < 0.25 else int(rng.integers(-3 * size - 3, 3 * size + 3))
                items.append(slice(bound(), bound(), None if rng.random() < 0.8 else 1))
        if items and rng.random() < 0.3:
            items.insert(int(rng.integers(0, len(items) + 1)), Ellipsis)
        keys.append(tuple(items) if len(items) != 1 or rng.random() < 0.5 else items[0])
    return keys


class CpuTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        root = cls.dir.name
        cls.v3 = os.path.join(root, "v3.zarr")
        a = zarr.create_array(store=cls.v3, shape=(20, 30, 7), chunks=(8, 16, 7), dtype="float32",
                              compressors=zc.ZstdCodec(level=3), fill_value=-1.5)
        a[:] = np.arange(20 * 30 * 7, dtype="float32").reshape(20, 30, 7)
        cls.v2 = os.path.join(root, "v2.zarr")
        b = zarr.create_array(store=cls.v2, shape=(9, 5), chunks=(4, 4), dtype="uint16", zarr_format=2)
        b[:] = 7
        cls.group = os.path.join(root, "group.zarr")
        g = zarr.open_group(cls.group, mode="w")
        g.create_array("raw", shape=(4,), chunks=(2,), dtype="int64")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_arrays_describe_themselves(self):
        a = zarrs_gpu.open(self.v3)
        self.assertEqual(a.shape, (20, 30, 7))
        self.assertEqual(a.dtype, "float32")
        self.assertEqual(a.chunks, (8, 16, 7))
        self.assertEqual((a.ndim, len(a)), (3, 20))
        self.assertIn("float32", repr(a))
        b = zarrs_gpu.open(self.v2, "")
        self.assertEqual((b.shape, b.dtype, b.chunks), ((9, 5), "uint16", (4, 4)))
        # The node path takes the leading "/" or not.
        self.assertEqual(zarrs_gpu.open(self.group, "raw").shape, (4,))
        self.assertEqual(zarrs_gpu.open(self.group, "/raw").dtype, "int64")

    def test_host_values_are_written_as_numpy_assigns_and_read_back_by_zarr_python(self):
        path = os.path.join(self.dir.name, "write.zarr")
        z = zarr.create_array(store=path, shape=(11, 13, 6), chunks=(4, 5, 6), dtype="int32",
                              compressors=zc.ZstdCodec(level=3), fill_value=0)
        want = np.zeros((11, 13, 6), dtype="int32")
        a = zarrs_gpu.open(path, mode="r+")
        # Unaligned boxes, an integer index (its dimension dropped), a scalar broadcast, floats cast.
        value = np.arange(3 * 9 * 6).reshape(3, 9, 6)
        report = a.write((slice(2, 5), slice(1, 10)), value)
        want[2:5, 1:10] = value
        self.assertEqual(report["path"], "host")
        a[7] = np.full((13, 6), 5.9)
        want[7] = np.full((13, 6), 5.9)
        a[9:, :, 2] = -3
        want[9:, :, 2] = -3
        # numpy's rules exactly: leading dimensions of 1 dropped, a Python integer out of range refused.
        a[10, 0] = np.full((1, 6), 11)
        want[10, 0] = 11
        with self.assertRaises(OverflowError):
            a[0, 0, 0] = 2**40
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want)
        # A chunk written to hold the fill value alone is erased (zarrs' rule, zarr-python's too).
        a[:4, :5] = 3
        self.assertTrue(os.path.exists(os.path.join(path, "c", "0", "0", "0")))
        a[:4, :5] = 0
        want[:4, :5] = 0
        self.assertFalse(os.path.exists(os.path.join(path, "c", "0", "0", "0")))
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want)
        # A shape that does not broadcast, a read-only array, an unknown mode.
        with self.assertRaises(ValueError):
            a[0:2] = np.ones((3, 13, 6))
        with self.assertRaisesRegex(ValueError, 'mode="r\\+"'):
            zarrs_gpu.open(path)[0] = 1
        with self.assertRaisesRegex(ValueError, "mode"):
            zarrs_gpu.open(path, mode="w")
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], want)

    def test_bad_indices_are_index_errors_before_any_device_work(self):
        a = zarrs_gpu.open(self.v3)
        cases = [
            ((slice(0, 10, 2),), "steps are not supported"),
            ((20,), "index 20 is out of bounds for axis 0 with size 20"),
            ((-21,), "index -21 is out of bounds for axis 0 with size 20"),
            ((Ellipsis, 0, Ellipsis), "single ellipsis"),
            ((0, 0, 0, 0), "too many indices for array: array is 3-dimensional, but 4 were indexed"),
            (("x",), "only integers, slices"),
            ((True,), "booleans are not indices"),
        ]
        for key, message in cases:
            with self.subTest(key=key):
                with self.assertRaises(IndexError) as caught:
                    a[key]
                self.assertIn(message, str(caught.exception))
        # The string form is the command line's, with its messages.
        with self.assertRaises(IndexError) as caught:
            a.read("0:10:2")
        self.assertIn("steps are not supported", str(caught.exception))

    def test_read_into_wants_the_selections_shape(self):
        class Out:  # refused before its __dlpack__ is asked for
            shape = (20, 30, 6)

            def __dlpack__(self, **kwargs):
                raise AssertionError("not reached")

        a = zarrs_gpu.open(self.v3)
        for out, key in [(Out(), None), (Out(), (slice(0, 20), 0))]:
            with self.assertRaises(ValueError) as caught:
                a.read_into(out, key)
            self.assertIn("out has shape [20, 30, 6], the selection", str(caught.exception))

    def test_bad_paths_and_options(self):
        with self.assertRaises(FileNotFoundError):
            zarrs_gpu.open(os.path.join(self.dir.name, "missing.zarr"))
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.open(self.group)
        self.assertIn("is a group, not an array; its arrays: /raw", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.open(self.v3, backend="fast")
        self.assertIn("unknown I/O backend", str(caught.exception))
        with self.assertRaises(ValueError):
            zarrs_gpu.open(self.v3, decode_trust="always")

    def test_bad_environment_values_name_the_variable(self):
        # A fresh interpreter: the environment is read when a configuration is made.
        code = f"import zarrs_gpu; zarrs_gpu.open({self.v3!r})"
        env = dict(os.environ, ZARRS_GPU_DECODE_TRUST="bogus")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("ValueError", run.stderr)
        self.assertIn("ZARRS_GPU_DECODE_TRUST", run.stderr)

    def test_private_zarr_python_methods_are_replaced_only_for_the_versions_supported(self):
        from zarr.core.array import Array, AsyncArray

        from zarrs_gpu import _zarr_hooks, pipeline

        # The zarr-python these tests run with (the oldest supported) has all three replaced.
        self.assertTrue(_zarr_hooks.supported(zarr.__version__), zarr.__version__)
        for method in (AsyncArray._get_selection, AsyncArray._set_selection, Array.get_coordinate_selection):
            self.assertTrue(getattr(method, "_zarrs_gpu", False), method)
        names = ["AsyncArray._get_selection", "Array.get_coordinate_selection", "AsyncArray._set_selection"]
        self.assertEqual(_zarr_hooks.install(pipeline), names, "installed once, found installed again")
        for version in ("3.1.6", "3.4.2", "3.2.0rc1", "3.3.0.dev12"):
            self.assertTrue(_zarr_hooks.supported(version), version)
        # Another version: zarr-python's own methods stay (nothing is installed).
        for version in ("3.0.8", "3.5.0", "4.0.0", "2.18.3", "main"):
            self.assertFalse(_zarr_hooks.supported(version), version)
            self.assertEqual(_zarr_hooks.install(pipeline, version=version), [], version)

    def test_the_codec_pipeline_leaves_host_reads_to_zarr_python(self):
        from zarrs_gpu.pipeline import GpuCodecPipeline

        # Found by its configured path (the package's entry point), and on host buffers (no
        # enable_gpu) every read is zarr-python's own, with zarr-python's results.
        want = zarr.open_array(self.v3, mode="r")[2:17, 3:, 1]
        before = GpuCodecPipeline.device_reads
        with zarr.config.set({"codec_pipeline.path": "zarrs_gpu.pipeline.GpuCodecPipeline"}):
            z = zarr.open_array(self.v3, mode="r")
            self.assertIsInstance(z._async_array.codec_pipeline, GpuCodecPipeline)
            np.testing.assert_array_equal(z[2:17, 3:, 1], want)
            np.testing.assert_array_equal(zarr.open_array(self.v2, mode="r")[...], np.full((9, 5), 7, "uint16"))
            # Coordinate selections (whose result reshape the package wraps) too.
            host = zarr.open_array(self.v3, mode="r")
            points = (np.array([[1, 19], [0, 3]]), np.array([[2, 29], [-1, 4]]), np.array([[0, 6], [1, 1]]))
            np.testing.assert_array_equal(z.vindex[points], host[...][points])
            np.testing.assert_array_equal(z.get_coordinate_selection(points), host[...][points])
            np.testing.assert_array_equal(z.oindex[[3, 1], :, [0, 6]], host[...][[3, 1]][:, :, [0, 6]])
        self.assertEqual(GpuCodecPipeline.device_reads, before)

    def test_the_pipeline_hands_device_writes_of_a_box_to_zarrs_gpu_and_the_rest_to_zarr_python(self):
        from zarr.core.indexing import BasicIndexer

        from zarrs_gpu import pipeline
        from zarrs_gpu.pipeline import GpuCodecPipeline

        class DeviceValue:
            """What the plan looks at of a CuPy array or CUDA tensor (never written here)."""

            def __init__(self, shape, dtype="float32", device=(2, 0), contiguous=True):
                self.shape, self.dtype, self._device = shape, np.dtype(dtype), device
                self.flags = type("Flags", (), {"c_contiguous": contiguous})()

            def __dlpack_device__(self):
                return self._device

        path = os.path.join(self.dir.name, "device-writes.zarr")
        zarr.create_array(store=path, shape=(20, 30), chunks=(8, 8), dtype="float32", fill_value=0)
        with zarr.config.set({"codec_pipeline.path": "zarrs_gpu.pipeline.GpuCodecPipeline"}):
            z = zarr.open_array(path, mode="r+")
            a = z._async_array

            def plan(selection, value, array=a):
                return pipeline._write_plan(array, BasicIndexer(selection, z.shape, z.metadata.chunk_grid), value, None)

            got = plan((slice(3, 17), 5), DeviceValue((14,)))
            self.assertIsNotNone(got)
            gpu_array, key = got
            self.assertEqual(key, (slice(3, 17), 5))
            self.assertEqual(gpu_array.shape, (20, 30))
            # Host values, another dtype, shape or device kind, strided values, steps: zarr-python's.
            self.assertIsNone(plan((slice(3, 17), 5), np.zeros(14, "float32")))
            self.assertIsNone(plan((slice(3, 17), 5), DeviceValue((14,), "float64")))
            self.assertIsNone(plan((slice(3, 17), 5), DeviceValue((13,))))
            self.assertIsNone(plan((slice(3, 17), 5), DeviceValue((14,), device=(1, 0))))
            self.assertIsNone(plan((slice(3, 17), 5), DeviceValue((14,), contiguous=False)))
            self.assertIsNone(plan((slice(3, 17, 2), 5), DeviceValue((7,))))
            # A big-endian v2 array takes native values (zarrs stores them in its byte order).
            v2 = os.path.join(self.dir.name, "device-writes-v2.zarr")
            zarr.create_array(store=v2, shape=(6,), chunks=(4,), dtype=">f4", fill_value=0, zarr_format=2)
            big = zarr.open_array(v2, mode="r+")
            self.assertIsNotNone(pipeline._write_plan(
                big._async_array, BasicIndexer(slice(0, 6), big.shape, big.metadata.chunk_grid), DeviceValue((6,)), None))
            # An array opened read-only: zarr-python's (which refuses the write).
            ro = zarr.open_array(path, mode="r")
            self.assertIsNone(plan((slice(0, 20), 0), DeviceValue((20,)), array=ro._async_array))
            # Arrays that keep chunks of fill value: zarr-python's (zarrs erases them).
            keeps = z.with_config({"write_empty_chunks": True})
            self.assertIsNone(plan((slice(0, 20), 0), DeviceValue((20,)), array=keeps._async_array))
            # Host values are written by zarr-python, through the hook, as before.
            before = GpuCodecPipeline.device_writes
            z[2:9, 4:12] = np.arange(56, dtype="float32").reshape(7, 8)
            self.assertEqual(GpuCodecPipeline.device_writes, before)
        want = np.zeros((20, 30), "float32")
        want[2:9, 4:12] = np.arange(56, dtype="float32").reshape(7, 8)
        np.testing.assert_array_equal(zarr.open_array(path, mode="r")[...], want)

    def test_create_writes_what_zarr_python_and_zarrs_open_and_writes_land(self):
        import numcodecs

        root = os.path.join(self.dir.name, "created.zarr")
        rng = np.random.default_rng(7)
        cases = [
            ("/plain", dict(shape=(30, 41), chunks=(8, 16), dtype="float32", fill_value=1.5)),
            ("/a/b/sharded", dict(shape=(30, 41), chunks=(4, 8), shards=(8, 16), dtype="uint16",
                                  compressors=["zstd", "crc32c"], dimension_names=["y", "x"])),
            ("/gz", dict(shape=(5, 6, 7), chunks=(2, 3, 4), dtype="int8", compressors="gzip", fill_value=-3)),
            ("/bl", dict(shape=(33,), chunks=(10,), dtype="complex64", compressors=zc.BloscCodec(cname="lz4"))),
            ("/none", dict(shape=(9, 9), chunks=(9, 2), dtype="bool", compressors=None, fill_value=True)),
            ("/big", dict(shape=(9, 9), chunks=(4, 4), dtype=">i4", compressors="zlib")),
        ]
        for node, kwargs in cases:
            a = zarrs_gpu.create(root, node, **kwargs)
            z = zarr.open_array(root, path=node.strip("/"), mode="r")
            # v3 data types have no byte order (the bytes codec has it).
            native = np.dtype(kwargs["dtype"]).newbyteorder("=")
            self.assertEqual((z.shape, z.dtype.newbyteorder("="), z.chunks), (kwargs["shape"], native, kwargs["chunks"]),
                             node)
            self.assertEqual(a.shape, kwargs["shape"], node)
            # Unwritten: the fill value everywhere, as zarr-python reads it.
            np.testing.assert_array_equal(z[...], np.full(kwargs["shape"], kwargs.get("fill_value", 0), kwargs["dtype"]))
            values = rng.integers(0, 100, kwargs["shape"]).astype(kwargs["dtype"])
            a.write(Ellipsis, values)
            np.testing.assert_array_equal(zarr.open_array(root, path=node.strip("/"), mode="r")[...], values, err_msg=node)
        self.assertEqual(zarr.open_array(root, path="a/b/sharded").metadata.dimension_names, ("y", "x"))
        with open(os.path.join(root, "big", "zarr.json")) as f:
            self.assertEqual(json.load(f)["codecs"][0], {"name": "bytes", "configuration": {"endian": "big"}})
        self.assertIsInstance(zarr.open_group(root, path="a", mode="r"), zarr.Group)
        # v2, with zarr-python's default separator and a numcodecs compressor.
        v2 = zarrs_gpu.create(root, "/v2", shape=(12, 7), chunks=(5, 5), dtype=">f8", zarr_format=2,
                              compressors=numcodecs.Zstd(level=2), fill_value=float("nan"))
        z2 = zarr.open_array(root, path="v2", mode="r")
        self.assertEqual((z2.metadata.zarr_format, z2.dtype), (2, np.dtype(">f8")))
        self.assertTrue(np.isnan(z2[0, 0]))
        v2.write((slice(0, 12), slice(0, 7)), np.arange(84.0).reshape(12, 7))
        np.testing.assert_array_equal(zarr.open_array(root, path="v2", mode="r")[...], np.arange(84.0).reshape(12, 7))
        # An existing node: an error unless overwrite; bad arguments name themselves.
        with self.assertRaises(FileExistsError):
            zarrs_gpu.create(root, "/plain", shape=(3,), chunks=(3,), dtype="float32")
        again = zarrs_gpu.create(root, "/plain", shape=(3,), chunks=(3,), dtype="float32", overwrite=True)
        self.assertEqual(again.shape, (3,))
        with self.assertRaisesRegex(ValueError, "shards"):
            zarrs_gpu.create(root, "/bad", shape=(8,), chunks=(3,), shards=(8,), dtype="float32")
        with self.assertRaisesRegex(ValueError, "compressor"):
            zarrs_gpu.create(root, "/bad", shape=(8,), chunks=(4,), dtype="float32", compressors="lzma")
        with self.assertRaisesRegex(TypeError, "dtype"):
            zarrs_gpu.create(root, "/bad", shape=(8,), chunks=(4,), dtype="U3")
        self.assertFalse(os.path.exists(os.path.join(root, "bad", "zarr.json")))
        # A fill value the dtype cannot hold is refused, not wrapped.
        for dtype, fill in (("uint8", 300), ("int8", -129), ("int32", 1.5), ("uint16", -1), ("int64", 2**70),
                            ("float32", 1e40), ("float16", 70000.0), ("float32", 1 + 2j), ("int8", "x")):
            with self.assertRaisesRegex(ValueError, "fill_value"):
                zarrs_gpu.create(root, "/bad", shape=(8,), chunks=(4,), dtype=dtype, fill_value=fill)
        for fill in (float("nan"), float("-inf"), 1 + 0j):  # kept as they are
            zarrs_gpu.create(root, "/okfill", shape=(4,), chunks=(4,), dtype="float32", fill_value=fill, overwrite=True)
        with self.assertRaisesRegex(ValueError, "'..'"):
            zarrs_gpu.create(root, "/a/../../outside", shape=(4,), chunks=(4,), dtype="float32")
        # Metadata zarrs refuses leaves the node it would have replaced as it was.
        with self.assertRaises(Exception):
            zarrs_gpu.create(root, "/plain", shape=(3,), chunks=(3,), dtype="float32", overwrite=True,
                             compressors={"name": "no-such-codec", "configuration": {}})
        self.assertEqual(zarr.open_array(root, path="plain", mode="r").shape, (3,))
        # zarr-python's Blosc with typesize and shuffle unset: the element size and shuffle, as
        # zarr-python itself evolves them; set ones are kept.
        zarrs_gpu.create(root, "/bl4", shape=(8,), chunks=(4,), dtype="float32", compressors=zc.BloscCodec())
        zarrs_gpu.create(root, "/bl1", shape=(8,), chunks=(4,), dtype="uint8",
                         compressors=zc.BloscCodec(shuffle="noshuffle"))
        blosc = {}
        for node in ("bl4", "bl1"):
            with open(os.path.join(root, node, "zarr.json")) as f:
                blosc[node] = json.load(f)["codecs"][1]["configuration"]
        self.assertEqual((blosc["bl4"]["typesize"], blosc["bl4"]["shuffle"]), (4, "shuffle"))
        self.assertEqual((blosc["bl1"]["typesize"], blosc["bl1"]["shuffle"]), (1, "noshuffle"))

    def test_the_pipeline_opens_a_rewritten_array_again(self):
        from zarrs_gpu import pipeline

        # Kept between reads, but an array rewritten with another fill value and shape must not
        # be read with the old metadata (its missing chunks would take the old fill value).
        path = os.path.join(self.dir.name, "rewritten.zarr")
        zarr.create_array(store=path, shape=(10,), chunks=(4,), dtype="float32", fill_value=1.0)
        first = pipeline._open_array(path, "")
        self.assertIs(pipeline._open_array(path, ""), first)
        zarr.create_array(store=path, shape=(12,), chunks=(4,), dtype="float32", fill_value=2.0, overwrite=True)
        again = pipeline._open_array(path, "")
        self.assertIsNot(again, first)
        self.assertEqual(again.shape, (12,))
        self.assertIsNone(pipeline._open_array(path, "missing"))

    def test_nvcomp_is_looked_for_where_this_interpreter_finds_packages(self):
        # A fresh interpreter, no activated venv and no NVCOMP_LIBRARY_PATH (which is then the
        # only candidate): a wheel's library in a directory of its sys.path must be a candidate
        # (pip's site-packages is one there), and so must the interpreter's site-packages.
        with tempfile.TemporaryDirectory() as site:
            lib = os.path.join(site, "nvidia", "libnvcomp", "lib64")
            os.makedirs(lib)
            fake = os.path.join(lib, "libnvcomp.so.6")
            open(fake, "wb").close()
            # The package itself from where this process found it (a PYTHONPATH-only install, as
            # on the GPU host, is otherwise not importable there), after `site`.
            installed = os.path.dirname(os.path.dirname(os.path.abspath(zarrs_gpu.__file__)))
            code = ("import site, sys; sys.path.insert(0, sys.argv[1]); sys.path.append(sys.argv[2]); "
                    "import zarrs_gpu._zarrs_gpu as z; print(z._nvcomp_candidates()[0])")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("NVCOMP_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
            run = subprocess.run([sys.executable, "-c", code, site, installed], env=env, capture_output=True,
                                 text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout.strip(), fake)

    def test_indices_select_what_numpy_selects(self):
        # One rule for `a[key]`, `a.read(key)`, `a.read_into(out, key)` and the command line's
        # `--subset`: numpy's. Each key's box, read and reshaped, is numpy's `a[key]`.
        rng = np.random.default_rng(7)
        for shape in [(10,), (7, 5), (4, 0, 6), (3, 4, 5, 2), ()]:
            values = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
            for key in numpy_keys(shape, rng, 300) + [(), Ellipsis, (slice(3, 3),), (slice(0, 10**6),),
                                                      (slice(-5, None),), (slice(-10**30, 10**30),)]:
                if shape == () and key not in ((), Ellipsis):
                    continue
                with self.subTest(shape=shape, key=key):
                    try:
                        want = values[key]
                    except IndexError:
                        # An integer outside its dimension (where `...` moved it): refused alike.
                        with self.assertRaises(IndexError):
                            zarrs_gpu._zarrs_gpu._selection(key, list(shape))
                        continue
                    box, result = zarrs_gpu._zarrs_gpu._selection(key, list(shape))
                    self.assertEqual(tuple(result), want.shape)
                    got = values[tuple(slice(a, b) for a, b in box)].reshape(result)
                    np.testing.assert_array_equal(got, want)
        # numpy integers and 0-d integer arrays index as integers do.
        self.assertEqual(zarrs_gpu._zarrs_gpu._selection((np.int64(-1), np.array(2)), [5, 6]), ([(4, 5), (2, 3)], []))
        # The string form (the command line's) clamps the same; its integers keep their dimension.
        self.assertEqual(zarrs_gpu._zarrs_gpu._selection("0:1000, 3:3", [10, 5]), ([(0, 10), (3, 3)], [10, 0]))
        self.assertEqual(zarrs_gpu._zarrs_gpu._selection("-5:, 2", [10, 5]), ([(5, 10), (2, 3)], [5, 1]))

    def test_out_of_range_integers_and_bad_items_are_refused_as_numpy_does(self):
        shape = [10, 20]
        cases = [
            ((10,), IndexError, "index 10 is out of bounds for axis 0 with size 10"),
            ((0, -21), IndexError, "index -21 is out of bounds for axis 1 with size 20"),
            ((10**30,), IndexError, "out of bounds for axis 0 with size 10"),
            (np.int64(10), IndexError, "index 10 is out of bounds"),
            ("0,20", IndexError, "index 20 is out of bounds for axis 1 with size 20"),
            ((slice(0, 4.5),), TypeError, "slice indices must be integers"),
            ((slice(None, None, -1),), IndexError, "steps are not supported (step -1)"),
            ((slice(None, None, 0),), IndexError, "slice step cannot be zero"),
            ((0, 0, 0), IndexError, "too many indices for array: array is 2-dimensional, but 3 were indexed"),
            ((Ellipsis, Ellipsis), IndexError, "single ellipsis"),
            ((None,), IndexError, "only integers, slices"),
            ((1.0,), IndexError, "only integers, slices"),
        ]
        for key, error, message in cases:
            with self.subTest(key=key):
                with self.assertRaises(error) as caught:
                    zarrs_gpu._zarrs_gpu._selection(key, shape)
                self.assertIn(message, str(caught.exception))

    @unittest.skipUnless(os.environ.get("ZARRS_GPU_EXPECT_NO_GPU") == "1",
                         "set ZARRS_GPU_EXPECT_NO_GPU=1 on a machine without a GPU (CI does)")
    def test_clamped_and_empty_slices_go_on_to_the_device(self):
        # Accepted (not IndexErrors): refused here only for want of a GPU.
        a = zarrs_gpu.open(self.v3)
        reads = [lambda: a[0:1000], lambda: a[3:3], lambda: a[-5:], lambda: a.read("0:1000"),
                 lambda: a.read("3:3, :, :"), lambda: zarrs_gpu.read(self.v3, "/", "-100:100")]
        for read in reads:
            with self.assertRaises(RuntimeError) as caught:
                read()
            self.assertIn("no CUDA device available", str(caught.exception))

    def test_read_into_wants_device_memory(self):
        a = zarrs_gpu.open(self.v3)
        for out in (np.zeros((20, 30, 7), dtype="float32"), [0.0] * 20):
            with self.assertRaises(TypeError) as caught:
                a.read_into(out)
            message = str(caught.exception)
            self.assertIn("out must be a device array", message)
            self.assertIn("CuPy", message)
        self.assertNotIn("stream", message)

    def test_a_negative_device_is_a_value_error_naming_the_argument(self):
        for call in (lambda: zarrs_gpu.open(self.v3, device=-1), lambda: zarrs_gpu.read(self.v3, device=-1)):
            with self.assertRaises(ValueError) as caught:
                call()
            self.assertIn("device=-1", str(caught.exception))

    def tall_array(self, name):
        """An uncompressed float32 array of shape [2^63, 64] (metadata only), opened."""
        path = os.path.join(self.dir.name, name)
        os.makedirs(path, exist_ok=True)
        meta = {"zarr_format": 3, "node_type": "array", "shape": [2**63, 64], "data_type": "float32",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1024, 64]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
                "fill_value": 0.0, "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}]}
        with open(os.path.join(path, "zarr.json"), "w") as f:
            json.dump(meta, f)
        return zarrs_gpu.open(path)

    def test_len_of_an_array_too_long_for_python_says_why(self):
        a = self.tall_array("tall.zarr")
        self.assertEqual(a.shape[0], 2**63)
        with self.assertRaises(OverflowError) as caught:
            len(a)
        self.assertIn("2^63", str(caught.exception))
        self.assertIn(".shape[0]", str(caught.exception))

    def test_chunks_and_shards_are_zarr_pythons(self):
        from zarr.codecs import ShardingCodec, TransposeCodec

        root = os.path.join(self.dir.name, "shards")
        arrays = {
            "plain": dict(shape=(20, 30), chunks=(4, 5)),
            "v2": dict(shape=(20, 30), chunks=(4, 5), zarr_format=2),
            "sharded": dict(shape=(20, 30), chunks=(4, 5), shards=(8, 10)),
            # Nested: the outermost shard's inner chunks (themselves shards).
            "nested": dict(shape=(32, 32), chunks=(16, 16), compressors=None,
                           serializer=ShardingCodec(chunk_shape=(8, 8), codecs=[ShardingCodec(chunk_shape=(4, 4))])),
            # A codec beside sharding: zarr-python's chunks are the grid's.
            "beside": dict(shape=(32, 32), chunks=(16, 16), filters=[TransposeCodec(order=(1, 0))],
                           serializer=ShardingCodec(chunk_shape=(8, 8))),
        }
        import warnings

        for name, options in arrays.items():
            with self.subTest(array=name):
                path = os.path.join(root, name + ".zarr")
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    z = zarr.create_array(store=path, dtype="int32", **options)
                a = zarrs_gpu.open(path)
                self.assertEqual((a.chunks, a.shards), (z.chunks, z.shards))
        sharded = zarrs_gpu.open(os.path.join(root, "sharded.zarr"))
        self.assertEqual((sharded.chunks, sharded.shards, sharded.regular_chunks), ((4, 5), (8, 10), (8, 10)))

    def test_the_stub_and_py_typed_are_installed_and_complete(self):
        import ast
        import importlib.resources

        package = importlib.resources.files("zarrs_gpu")
        self.assertTrue(package.joinpath("py.typed").is_file())
        stub = package.joinpath("_zarrs_gpu.pyi")
        self.assertTrue(stub.is_file())
        tree = ast.parse(stub.read_text())
        names, members = set(), {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            if isinstance(node, ast.ClassDef):
                members[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            if isinstance(node, (ast.AnnAssign, ast.Assign)):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        module = zarrs_gpu._zarrs_gpu
        public = {n for n in dir(module) if not n.startswith("_")} | {"__version__"}
        self.assertEqual(public - names, set(), "public names of the module missing from the stub")
        for cls in (module.Array, module.DeviceArray):
            defined = {n for n in vars(cls) if not n.startswith("_") or n in ("__getitem__", "__setitem__", "__len__", "__dlpack__",
                                                                             "__dlpack_device__",
                                                                             "__cuda_array_interface__")}
            self.assertEqual(defined - members[cls.__name__], set(), f"{cls.__name__}: missing from the stub")
        # And every annotated function in the stub exists.
        for cls in (module.Array, module.DeviceArray):
            for name in members[cls.__name__]:
                self.assertTrue(hasattr(cls, name), f"{cls.__name__}.{name} is in the stub only")
        # Signatures too, where mypy is installed (stubtest compares them with the module's).
        try:
            import mypy  # noqa: F401
        except ImportError:
            return
        run = subprocess.run([sys.executable, "-m", "mypy.stubtest", "zarrs_gpu._zarrs_gpu"], capture_output=True,
                             text=True, cwd=self.dir.name)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)

    def test_gpu_zarr_context_without_cupy_says_cupy_is_needed(self):
        with without_cupy():
            with self.assertRaises(ImportError) as caught:
                with zarrs_gpu.gpu_zarr_context():
                    zarr.open_array(self.v3, mode="r")[0:2]
            self.assertIn("needs CuPy", str(caught.exception))

    def test_the_pipeline_sees_a_same_size_rewrite_within_one_tick(self):
        from zarrs_gpu import pipeline

        # zarr-python and zarrs rewrite metadata in place: same inode; same size here, and a
        # modification time the clock's tick may leave equal.
        path = os.path.join(self.dir.name, "racy.zarr")
        zarr.create_array(store=path, shape=(10,), chunks=(4,), dtype="float32", fill_value=1.0)
        meta = os.path.join(path, "zarr.json")
        first = pipeline._open_array(path, "")
        self.assertEqual(first.shape, (10,))
        self.assertIs(pipeline._open_array(path, ""), first, "kept while unchanged")
        before = os.stat(meta)
        with open(meta, "r+b") as f:
            original = f.read()
            text = original.replace(b"[\n    10\n  ]", b"[\n    12\n  ]").replace(b"[10]", b"[12]")
            self.assertNotEqual(text, original)
            f.seek(0)
            f.write(text)
            f.truncate()
        os.utime(meta, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.stat(meta)
        self.assertEqual((after.st_ino, after.st_size, after.st_mtime_ns),
                         (before.st_ino, before.st_size, before.st_mtime_ns))
        again = pipeline._open_array(path, "")
        self.assertEqual(again.shape, (12,))
        # A stamp long past its modification is trusted (no reading of the file at each read).
        old = before.st_mtime_ns - 10 * 10**9
        os.utime(meta, ns=(old, old))
        kept = pipeline._open_array(path, "")
        self.assertIs(pipeline._open_array(path, ""), kept)

    def test_vindex_and_oindex_plans_gather_what_zarr_python_selects(self):
        # The device route's plan (boxes and gathers), run here with numpy on the host: equal to
        # zarr-python's own vindex / oindex results, with one box or chunk by chunk.
        from zarr.core.indexing import CoordinateIndexer, MaskIndexer, OrthogonalIndexer

        from zarrs_gpu import pipeline

        z = zarr.open_array(self.v3, mode="r")
        grid = pipeline._indexer_chunk_grid(z)  # what zarr-python's own selections pass
        host = z[...]
        rng = np.random.default_rng(3)
        mask = rng.random(z.shape) < 0.05
        rows = np.array([19, 0, 7, 7, -1, 3])
        coordinate_cases = [
            (rows, np.array([0, 29, 5, 5, 12, -30]), np.array([6, 0, 1, 2, 3, -7])),
            (np.array([[1, 2], [3, 4]]), np.array([[5, 6], [7, 8]]), np.array([[0, 1], [2, 3]])),
            (np.array([4]), np.array([9]), np.array([6])),
            (np.array([], dtype=np.int64),) * 3,
        ]
        orthogonal_cases = [
            (rows, slice(2, 20, 3), np.array([True, False, True, False, False, False, True])),
            (np.array([5, 1, 1]), 4, slice(None)),
            (slice(None), np.array([29, 0]), -1),
            (np.array([], dtype=np.int64), slice(None), slice(None)),
        ]

        def run(indexer):
            pieces = pipeline._advanced_pieces(indexer, host.dtype.itemsize)
            self.assertIsNotNone(pieces)
            read = lambda lo, hi: host[tuple(slice(a, b) for a, b in zip(lo, hi))]
            return pipeline._assemble(indexer, pieces, host.dtype, read, np), len(pieces)

        for split in (False, True):
            saved = pipeline._BOX_WASTE, pipeline._BOX_BYTES
            if split:
                pipeline._BOX_WASTE, pipeline._BOX_BYTES = 1, 0
            try:
                for sel in coordinate_cases:
                    with self.subTest(split=split, coordinates=sel):
                        indexer = CoordinateIndexer(sel, z.shape, grid)
                        got, count = run(indexer)
                        np.testing.assert_array_equal(got.reshape(indexer.sel_shape), z.vindex[sel])
                with self.subTest(split=split, mask=True):
                    got, count = run(MaskIndexer(mask, z.shape, grid))
                    np.testing.assert_array_equal(got, z.vindex[mask])
                    self.assertEqual(count > 1, split)
                for sel in orthogonal_cases:
                    with self.subTest(split=split, orthogonal=sel):
                        got, count = run(OrthogonalIndexer(sel, z.shape, grid))
                        np.testing.assert_array_equal(got, z.oindex[sel])
            finally:
                pipeline._BOX_WASTE, pipeline._BOX_BYTES = saved
        # Basic selections are not this route's.
        self.assertIsNone(pipeline._advanced_pieces(
            OrthogonalIndexer((slice(0, 3),), z.shape, grid), 4))

    def test_unknown_zarr_python_internals_decline_the_device_route(self):
        # An indexer whose chunks are told neither as zarr-python 3.4 (`dim_grids`) nor as 3.1
        # (`chunk_shape`): chunk-by-chunk plans are declined (zarr-python reads it), one-box plans
        # need no chunks.
        import types

        from zarr.core.indexing import CoordinateIndexer, OrthogonalIndexer

        from zarrs_gpu import pipeline
        from zarrs_gpu.pipeline import GpuCodecPipeline

        z = zarr.open_array(self.v3, mode="r")
        grid = pipeline._indexer_chunk_grid(z)
        points = CoordinateIndexer((np.array([1, 19]), np.array([2, 29]), np.array([0, 6])), z.shape, grid)
        rows = OrthogonalIndexer((np.array([5, 1]), slice(None), 3), z.shape, grid)
        bare_points = types.SimpleNamespace(selection=points.selection, sel_sort=points.sel_sort)
        bare_rows = types.SimpleNamespace(dim_indexers=rows.dim_indexers, shape=rows.shape)
        self.assertIsNotNone(pipeline._point_pieces(bare_points, 4))
        self.assertIsNotNone(pipeline._orthogonal_pieces(bare_rows, 4))
        saved = pipeline._BOX_WASTE, pipeline._BOX_BYTES
        pipeline._BOX_WASTE, pipeline._BOX_BYTES = 1, 0
        try:
            self.assertIsNone(pipeline._point_pieces(bare_points, 4))
            self.assertIsNone(pipeline._orthogonal_pieces(bare_rows, 4))
            self.assertIsNotNone(pipeline._point_pieces(points, 4))
            self.assertIsNotNone(pipeline._orthogonal_pieces(rows, 4))
        finally:
            pipeline._BOX_WASTE, pipeline._BOX_BYTES = saved
        # A chunk grid the indexers refuse: the wrapped coordinate selection is zarr-python's own.
        sel = (np.array([[1, 19], [0, 3]]), np.array([[2, 29], [-1, 4]]), np.array([[0, 6], [1, 1]]))
        want = z[...][sel]
        with zarr.config.set({"codec_pipeline.path": "zarrs_gpu.pipeline.GpuCodecPipeline"}):
            z = zarr.open_array(self.v3, mode="r")
            self.assertIsInstance(z._async_array.codec_pipeline, GpuCodecPipeline)
            found = pipeline._indexer_chunk_grid
            pipeline._indexer_chunk_grid = lambda array: object()
            try:
                np.testing.assert_array_equal(z.get_coordinate_selection(sel), want)
            finally:
                pipeline._indexer_chunk_grid = found

    @unittest.skipUnless(os.environ.get("ZARRS_GPU_EXPECT_NO_GPU") == "1",
                         "set ZARRS_GPU_EXPECT_NO_GPU=1 on a machine without a GPU (CI does)")
    def test_reads_without_a_gpu_are_runtime_errors(self):
        for read in (lambda: zarrs_gpu.read(self.v3), lambda: zarrs_gpu.open(self.v2)[0:4]):
            with self.assertRaises(RuntimeError) as caught:
                read()
            self.assertIn("no CUDA device available", str(caught.exception))

    def test_tiles_and_read_ahead_refuse_bad_arguments_at_call_time(self):
        a = zarrs_gpu.open(self.v3)  # (20, 30, 7)
        value_errors = [
            (lambda: zarrs_gpu.tiles(a, (8, 0, 7)), "tile_shape=[8, 0, 7]: every tile extent is 1 or more"),
            (lambda: zarrs_gpu.tiles(a, (8, -1, 7)), "every tile extent is 1 or more"),
            (lambda: zarrs_gpu.tiles(a, (8, 8)), "the tile shape [8, 8] has 2 dimensions, the array's shape "
                                                 "[20, 30, 7] has 3"),
            (lambda: zarrs_gpu.tiles(a, (8, 8, 8), order="F"), 'order="F": the tile orders are "C" and "random"'),
            (lambda: zarrs_gpu.tiles(a, (8, 8, 8), prefetch=0), "prefetch=0"),
            (lambda: zarrs_gpu.tiles(a, (8, 8, 8), order="random", seed=-1), "seed=-1"),
            (lambda: a.read_ahead([(0,)], prefetch=-2), "prefetch=-2"),
        ]
        for call, message in value_errors:
            with self.assertRaises(ValueError) as caught:
                call()
            self.assertIn(message, str(caught.exception))
        type_errors = [
            lambda: zarrs_gpu.tiles(a, "888"),
            lambda: zarrs_gpu.tiles(zarr.open_array(self.v3, mode="r"), (8, 8, 8)),
            lambda: a.read_ahead(5),
            lambda: a.read_ahead("0:4"),
        ]
        for call in type_errors:
            with self.assertRaises(TypeError):
                call()
        # Keys follow `a[key]`'s rule, each checked now; the error names the key's position.
        with self.assertRaises(IndexError) as caught:
            a.read_ahead([(slice(0, 4),), (20,)])
        self.assertIn("keys[1]: index 20 is out of bounds for axis 0 with size 20", str(caught.exception))
        with self.assertRaises(IndexError) as caught:
            a.read_ahead([slice(0, 10, 2)])
        self.assertIn("keys[0]: dimension 0: steps are not supported", str(caught.exception))
        # read_many checks every key, and stack=True one shape, before any read (here: no GPU).
        with self.assertRaises(IndexError) as caught:
            a.read_many([(slice(0, 4),), (slice(0, 4), 40)])
        self.assertIn("keys[1]: index 40 is out of bounds for axis 1 with size 30", str(caught.exception))
        with self.assertRaisesRegex(TypeError, "not one string key"):
            a.read_many("0:4")
        with self.assertRaisesRegex(ValueError, r"keys\[0\] selects \[4, 30, 7\], keys\[1\] \[5, 30, 7\]"):
            a.read_many([slice(0, 4), slice(0, 5)], stack=True)
        with self.assertRaisesRegex(ValueError, "at least one key"):
            a.read_many([], stack=True)
        with self.assertRaises(IndexError) as caught:
            a.read_async((0, 0, 0, 0))
        self.assertIn("too many indices", str(caught.exception))

    def test_tile_grids_too_large_to_list_are_value_errors(self):
        a = self.tall_array("huge.zarr")
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.tiles(a, (1, 1))
        self.assertIn("more than 2^64", str(caught.exception))
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.tiles(a, (2**20, 2**70))
        self.assertIn("their list does not fit in memory", str(caught.exception))

    def test_read_ahead_takes_zarrs_gpu_and_local_zarr_python_arrays(self):
        keys = [(slice(0, 4),), (slice(4, 9), 2)]
        # A zarr-python array in a local store: read by zarrs_gpu; other stores are refused at once.
        for array in (zarrs_gpu.open(self.v3), zarr.open_array(self.v3, mode="r")):
            with self.subTest(array=type(array).__name__):
                it = zarrs_gpu.read_ahead(array, keys, prefetch=1, device=0)
                self.assertIsInstance(it, zarrs_gpu.ReadAhead)
                if os.environ.get("ZARRS_GPU_EXPECT_NO_GPU"):
                    with self.assertRaises(RuntimeError):
                        next(it)
                it.close()
        memory = zarr.create_array(zarr.storage.MemoryStore(), shape=(4,), chunks=(2,), dtype="f4")
        for bad in (memory, np.zeros(3), "path"):
            with self.assertRaises(TypeError) as caught:
                zarrs_gpu.read_ahead(bad, keys)
            self.assertIn("local store", str(caught.exception))
        with self.assertRaises(ValueError):
            zarrs_gpu.read_ahead(zarr.open_array(self.v3, mode="r"), keys, prefetch=0, device=0)

    def test_tiles_of_an_empty_array_read_nothing(self):
        path = os.path.join(self.dir.name, "empty.zarr")
        zarr.create_array(store=path, shape=(0, 5), chunks=(4, 5), dtype="int16")
        reads = zarrs_gpu.tiles(zarrs_gpu.open(path), (4, 4))
        self.assertIs(iter(reads), reads)
        self.assertEqual(list(reads), [])
        self.assertIn("reads=0", repr(reads))

    @unittest.skipUnless(os.environ.get("ZARRS_GPU_EXPECT_NO_GPU") == "1",
                         "set ZARRS_GPU_EXPECT_NO_GPU=1 on a machine without a GPU (CI does)")
    def test_reads_ahead_without_a_gpu_raise_when_iterated(self):
        a = zarrs_gpu.open(self.v3)
        cases = [
            (zarrs_gpu.tiles(a, (8, 16, 7)), "reading [0:8, 0:16, 0:7]: no CUDA device available"),
            (zarrs_gpu.tiles(a, (7, 7, 7), order="random", seed=5, prefetch=1), "no CUDA device available"),
            (a.read_ahead([(slice(2, 4), 3), "0:2, 0:2, 0:2"]), "reading [2:4, 3:4, 0:7]: no CUDA device available"),
            # No queue of 2^62 slots: no more than there are reads.
            (zarrs_gpu.tiles(a, (20, 30, 7), prefetch=2**62), "reading [0:20, 0:30, 0:7]: no CUDA device available"),
        ]
        for reads, message in cases:
            with self.assertRaises(RuntimeError) as caught:
                next(reads)
            self.assertIn(message, str(caught.exception))
            # The error ended the iteration.
            self.assertEqual(list(reads), [])
        reads = zarrs_gpu.tiles(a, (4, 4, 4))
        reads.close()
        self.assertEqual(list(reads), [])
        pending = a.read_async((slice(0, 4),))
        for _ in range(2):  # the same error on every call
            with self.assertRaises(RuntimeError) as caught:
                pending.result()
            self.assertIn("reading [0:4, 0:30, 0:7]: no CUDA device available", str(caught.exception))
        self.assertTrue(pending.done())


def run_python(code, *args):
    """``code`` run by this interpreter in a new process (modules set to None in sys.modules there
    are missing): its completed process."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)


class ArrayLikeZarrPythonTests(unittest.TestCase):
    """zarrs_gpu.Array's metadata beside zarr-python's for the arrays zarr-python writes (opening
    needs no GPU): dtype, size, nbytes, attrs, fill_value; and the package's namespace."""

    #: (zarr format, dtype, fill value) written; None: zarr-python's default (v2: null).
    CASES = [
        (fmt, dtype, fill)
        for fmt in (2, 3)
        for dtype, fill in [
            ("bool", True), ("int8", -7), ("int16", None), ("int32", -(2**31)), ("int64", 2**62 + 3),
            ("uint8", 255), ("uint16", 5), (">u2", 513), ("uint32", 2**32 - 1), ("uint64", 2**64 - 1),
            ("float16", float("-inf")), ("float32", -1.5), ("float32", float("nan")), (">f4", 0.25),
            ("float64", -0.0), ("float64", None), ("complex64", 1 - 2j), ("complex128", complex(float("nan"), 3)),
        ]
    ]

    ATTRIBUTES = {"units": "m/s", "scale": 0.5, "count": 2**53 + 1, "flags": [True, False, None],
                  "nested": {"a": [1, [2.5, "x"]], "empty": {}}, "name": "Ω ü"}

    @classmethod
    def setUpClass(cls):
        import warnings

        cls.dir = tempfile.TemporaryDirectory()
        cls.arrays = []
        for n, (fmt, dtype, fill) in enumerate(cls.CASES):
            path = os.path.join(cls.dir.name, f"a{n}.zarr")
            options = {} if fill is None else {"fill_value": fill}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z = zarr.create_array(store=path, shape=(5, 3, 2), chunks=(2, 3, 2), dtype=dtype, zarr_format=fmt,
                                      attributes=cls.ATTRIBUTES if n % 2 == 0 else {}, **options)
            cls.arrays.append((fmt, dtype, fill, path, z))

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def test_metadata_is_zarr_pythons(self):
        for fmt, dtype, fill, path, z in self.arrays:
            with self.subTest(zarr_format=fmt, dtype=dtype, fill_value=fill):
                a = zarrs_gpu.open(path)
                # numpy's dtype, in the byte order reads return (zarr-python keeps a big-endian one).
                self.assertIsInstance(a.dtype, np.dtype)
                self.assertEqual(a.dtype, z.dtype.newbyteorder("="))
                self.assertEqual((a.size, a.nbytes), (z.size, z.nbytes))
                self.assertIsInstance(a.attrs, dict)
                self.assertEqual(a.attrs, dict(z.attrs))
                if z.fill_value is None:  # v2's null
                    self.assertIsNone(a.fill_value)
                else:
                    self.assertIs(type(a.fill_value), type(z.fill_value))
                    # Bit for bit: NaN, -0.0 and the extremes of 64-bit integers too.
                    self.assertEqual(np.asarray(a.fill_value).tobytes(), np.asarray(z.fill_value).tobytes())
        self.assertEqual(zarrs_gpu.open(self.arrays[0][3]).attrs, self.ATTRIBUTES)

    def test_attrs_are_a_new_dict_each_time(self):
        a = zarrs_gpu.open(self.arrays[0][3])
        attrs = a.attrs
        attrs["units"] = "changed"
        attrs["nested"]["a"].append(3)
        self.assertEqual(a.attrs, self.ATTRIBUTES)

    def test_sizes_past_two_to_the_64_and_empty_arrays(self):
        root = self.dir.name
        for name, shape, dtype in [("huge", (2**40, 2**40, 3), "float64"), ("empty", (0, 7), "int16"),
                                   ("scalar", (), "uint32")]:
            with self.subTest(array=name):
                path = os.path.join(root, name + ".zarr")
                chunks = tuple(max(1, min(s, 1024)) for s in shape)
                z = zarr.create_array(store=path, shape=shape, chunks=chunks, dtype=dtype)
                a = zarrs_gpu.open(path)
                self.assertEqual((a.size, a.nbytes), (math.prod(shape), math.prod(shape) * np.dtype(dtype).itemsize))
                if name != "huge":  # zarr-python's numpy product wraps around there (0)
                    self.assertEqual((a.size, a.nbytes), (z.size, z.nbytes))

    def test_bfloat16_is_ml_dtypes_else_its_name(self):
        # zarr-python 3.1 writes no bfloat16: a float32 array's metadata relabelled (zarrs reads it).
        path = os.path.join(self.dir.name, "bf16.zarr")
        zarr.create_array(store=path, shape=(4,), chunks=(2,), dtype="float32", fill_value=0.0)
        with open(os.path.join(path, "zarr.json")) as f:
            meta = json.load(f)
        meta["data_type"], meta["fill_value"] = "bfloat16", -2.5
        with open(os.path.join(path, "zarr.json"), "w") as f:
            json.dump(meta, f)
        code = ("import sys\n"
                "if sys.argv[2] == 'without': sys.modules['ml_dtypes'] = None\n"
                "import zarrs_gpu\n"
                "a = zarrs_gpu.open(sys.argv[1])\n"
                "print(isinstance(a.dtype, str), a.dtype, type(a.fill_value).__name__, a.fill_value, a.nbytes)\n")
        without = run_python(code, path, "without")
        self.assertEqual(without.returncode, 0, without.stderr)
        self.assertEqual(without.stdout.split(), ["True", "bfloat16", "float", "-2.5", "8"])
        try:
            import ml_dtypes
        except ImportError:
            return
        self.assertEqual(zarrs_gpu.open(path).dtype, np.dtype(ml_dtypes.bfloat16))
        with_ml = run_python(code, path, "with")
        self.assertEqual(with_ml.returncode, 0, with_ml.stderr)
        self.assertEqual(with_ml.stdout.split(), ["False", "bfloat16", "bfloat16", "-2.5", "8"])

    def test_dtype_without_numpy_says_numpy_is_needed(self):
        code = ("import sys; sys.modules['numpy'] = None\n"
                "import zarrs_gpu\n"
                "a = zarrs_gpu.open(sys.argv[1])\n"
                "print(a.shape, a.size, a.nbytes, a.attrs['units'])\n"
                "for what in ('dtype', 'fill_value'):\n"
                "    try:\n"
                "        getattr(a, what)\n"
                "    except ModuleNotFoundError as e:\n"
                "        print(type(e).__name__, e.name, e)\n")
        run = run_python(code, self.arrays[0][3])
        self.assertEqual(run.returncode, 0, run.stderr)
        lines = run.stdout.splitlines()
        self.assertEqual(lines[0], "(5, 3, 2) 30 30 m/s")
        for line, what in zip(lines[1:], ("dtype", "fill_value"), strict=True):
            self.assertTrue(line.startswith(f"ModuleNotFoundError numpy zarrs_gpu.Array.{what} needs numpy "
                                            "(pip install numpy)"), line)

    def test_dir_lists_the_public_api_only(self):
        import types

        # Every module of the package imported, as a user's program may have.
        for name in ("pipeline", "dask", "torch"):
            __import__(f"zarrs_gpu.{name}")
        extra = set()
        for name in dir(zarrs_gpu):
            value = getattr(zarrs_gpu, name)
            submodule = isinstance(value, types.ModuleType) and value.__name__ == f"zarrs_gpu.{name}"
            if not (submodule or name in zarrs_gpu.__all__):
                extra.add(name)
        # No private names either (`_Any`, `_create`, `_zarrs_gpu` were listed); the private
        # modules stay importable.
        dunder = lambda n: n.startswith("__") and n.endswith("__")
        self.assertEqual({n for n in extra if not dunder(n)}, set(), "dir(zarrs_gpu) beyond its API")
        self.assertEqual([n for n in dir(zarrs_gpu) if n.startswith("_") and not dunder(n)], [])
        self.assertIn("__version__", dir(zarrs_gpu))
        self.assertEqual(sorted(dir(zarrs_gpu)), dir(zarrs_gpu))
        self.assertIn("pipeline", dir(zarrs_gpu))
        for name in zarrs_gpu.__all__:
            self.assertTrue(hasattr(zarrs_gpu, name), name)
        self.assertTrue(callable(zarrs_gpu._zarrs_gpu._selection))
        import importlib

        self.assertIs(importlib.import_module("zarrs_gpu._create").create, zarrs_gpu.create)

    def test_the_modules_share_helpers_not_each_other(self):
        # zarrs_gpu.torch needs nothing of zarrs_gpu.dask (its helpers are the package's own).
        run = run_python("import sys, zarrs_gpu.torch\nprint('zarrs_gpu.dask' in sys.modules)")
        self.assertEqual((run.returncode, run.stdout.strip()), (0, "False"), run.stderr)
        import zarrs_gpu.dask as zd
        import zarrs_gpu._cluster as cluster

        # The cluster's public names are still zarrs_gpu.dask's, and workers preload zarrs_gpu.dask,
        # whose dask_setup distributed looks up by that name.
        for name in ("dask_setup", "local_cluster", "register_cupy_serialization", "worker_devices"):
            self.assertIs(getattr(zd, name), getattr(cluster, name), name)
            self.assertIn(name, zd.__all__)
        self.assertEqual(cluster.PRELOAD, "zarrs_gpu.dask")
        self.assertIs(__import__(cluster.PRELOAD, fromlist=["dask_setup"]).dask_setup, cluster.dask_setup)

    def test_missing_optional_dependencies_say_which_extra_installs_them(self):
        v3 = self.arrays[-1][3]
        cases = [
            # (modules missing, what runs, the module named, the extra)
            (["numpy"], "import zarrs_gpu.xarray", "numpy", "xarray"),
            (["xarray"], "import zarrs_gpu.xarray", "xarray", "xarray"),
            (["dask"], "import zarrs_gpu.dask as zd; zd.from_zarr(sys.argv[1])", "dask", "dask"),
            (["distributed"], "import zarrs_gpu.dask as zd; zd.local_cluster(devices=[0])", "distributed",
             "distributed"),
            (["torch"], "import zarrs_gpu.torch as zt; zt.CropDataset(sys.argv[1], (2, 2))[0]", "torch", "torch"),
        ]
        for missing, code, name, extra in cases:
            with self.subTest(missing=missing, code=code):
                run = run_python(f"import sys; sys.modules.update(dict.fromkeys({missing!r}))\n"
                                 "try:\n"
                                 + "".join(f"    {line}\n" for line in code.split("; ")) +
                                 "except ModuleNotFoundError as e:\n"
                                 "    print(e.name); print(e)\n", v3)
                self.assertEqual(run.returncode, 0, run.stderr)
                lines = run.stdout.splitlines()
                # The name Python gave (a submodule's, "dask.array", where the package is None).
                self.assertEqual(lines[0].partition(".")[0], name, run.stdout)
                self.assertIn(f"pip install 'zarrs-gpu[{extra}]'", lines[1])
                self.assertIn(f"needs {name}", lines[1])


try:
    import dask.array  # noqa: F401

    HAVE_DASK = True
except ImportError:
    HAVE_DASK = False


def host_reader(path, array, device, box):
    """zarrs_gpu.dask's reader replaced for tests without a GPU: zarr-python on the host."""
    z = zarr.open_array(os.path.join(path, array.strip("/")), mode="r")
    return z[tuple(slice(start, stop) for start, stop in box)]


def host_meta(dtype, ndim):
    return np.empty((0,) * ndim, dtype=dtype)


def covered(shape, boxes):
    """How many times the boxes cover each element of an array of `shape`."""
    count = np.zeros(shape, dtype=np.int64)
    for box in boxes:
        count[tuple(slice(start, stop) for start, stop in box)] += 1
    return count


class RecordedHostReads:
    """For the dask and xarray test classes: host reads (zarr-python) in place of the GPU's,
    each read's (array, box) recorded in self.reads, and the class's temporary directory removed
    at the end."""

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def host(self):
        """Reads on the host (zarr-python), recording (array, box) of every read."""
        from unittest import mock

        import zarrs_gpu.dask as zd

        self.reads = []

        def record(path, array, device, box):
            self.reads.append((array, box))
            return host_reader(path, array, device, box)

        return mock.patch.multiple(zd, reader=record, make_meta=host_meta)

    @property
    def boxes(self):
        """The boxes read, in order."""
        return [box for _, box in self.reads]


@unittest.skipUnless(HAVE_DASK, "dask[array] is not installed (pip install 'dask[array]')")
class DaskCpuTests(RecordedHostReads, unittest.TestCase):
    """zarrs_gpu.dask without a GPU: the blocks it plans, the graph it builds, and (with the reader
    replaced by zarr-python on the host, under dask's threaded scheduler) the values."""

    @classmethod
    def setUpClass(cls):
        import warnings

        cls.dir = tempfile.TemporaryDirectory()
        root = cls.dir.name
        rng = np.random.default_rng(19)
        cls.arrays = {}

        def make(name, data, **options):
            path = os.path.join(root, name + ".zarr")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z = zarr.create_array(store=path, shape=data.shape, dtype=data.dtype, **options)
                z[...] = data
            cls.arrays[name] = (path, data)

        # Partial edge chunks on every axis.
        make("v3_zstd", rng.standard_normal((37, 23, 5)), chunks=(8, 5, 2), compressors=zc.ZstdCodec(level=1))
        # Sharded, partial edge shards, and a fill value where a shard was never written.
        sharded = rng.integers(-1000, 1000, (43, 52)).astype("int16")
        make("v3_sharded", sharded, chunks=(4, 5), shards=(8, 10))
        make("v2", rng.integers(0, 60000, (19, 11)).astype("uint16"), chunks=(4, 4), zarr_format=2)
        make("v2_f4", rng.standard_normal((50,)).astype("float32"), chunks=(7,), zarr_format=2,
             compressors=None)
        sparse = os.path.join(root, "v3_missing.zarr")
        z = zarr.create_array(store=sparse, shape=(12, 9), chunks=(4, 4), dtype="float32", fill_value=2.5)
        z[0:4, 0:4] = 1
        want = np.full((12, 9), 2.5, "float32")
        want[0:4, 0:4] = 1
        cls.arrays["v3_missing"] = (sparse, want)
        cls.group = os.path.join(root, "group.zarr")
        g = zarr.open_group(cls.group, mode="w")
        g.create_array("inner", shape=(10, 6), chunks=(3, 6), dtype="int32")[...] = np.arange(60).reshape(10, 6)

    def test_to_zarr_writes_aligned_blocks_and_refuses_misaligned_ones(self):
        import dask.array as da

        import zarrs_gpu.dask

        rng = np.random.default_rng(23)
        data = rng.integers(-500, 500, (37, 23, 6)).astype("int32")
        for name, options in (("plain", {}), ("sharded", {"shards": (16, 10, 6)})):
            path = os.path.join(self.dir.name, f"to_zarr_{name}.zarr")
            zarr.create_array(store=path, shape=data.shape, dtype="int32", chunks=(8, 5, 6),
                              compressors=zc.ZstdCodec(level=1), fill_value=0, **options)
            unit = (16, 10, 6) if name == "sharded" else (8, 5, 6)
            x = da.from_array(data, chunks=unit)
            zarrs_gpu.dask.to_zarr(x, path)
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data, err_msg=name)
            # Blocks that split a chunk (or shard): refused before anything is written.
            with self.assertRaisesRegex(ValueError, "axis 0"):
                zarrs_gpu.dask.to_zarr(da.from_array(data * 0, chunks=(unit[0] + 1, unit[1], 6)), path)
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data, err_msg=name)
            # compute=False: nothing written until computed.
            writes = zarrs_gpu.dask.to_zarr(da.from_array(data + 1, chunks=unit), path, compute=False)
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data, err_msg=name)
            writes.compute()
            np.testing.assert_array_equal(zarr.open_array(path, mode="r")[:], data + 1, err_msg=name)
        with self.assertRaisesRegex(ValueError, "shape"):
            zarrs_gpu.dask.to_zarr(da.zeros((3, 3), chunks=3), path)

    def test_the_plan_tiles_the_array_in_whole_chunks_within_the_budget(self):
        from zarrs_gpu.dask import _boxes, plan_chunks

        rng = np.random.default_rng(7)
        for _ in range(300):
            ndim = int(rng.integers(1, 5))
            shape = tuple(int(rng.integers(0, 40)) for _ in range(ndim))
            unit = tuple(int(rng.integers(1, 12)) for _ in range(ndim))
            itemsize = int(rng.choice([1, 2, 4, 8]))
            budget = int(rng.integers(1, 4 * math.prod(unit) * itemsize + 2)) * int(rng.choice([1, 8]))
            with self.subTest(shape=shape, unit=unit, itemsize=itemsize, budget=budget):
                chunks = plan_chunks(shape, unit, itemsize, budget)
                self.assertEqual(tuple(sum(c) for c in chunks), shape)
                boxes = [box for _, box in _boxes(chunks)]
                if all(shape):
                    np.testing.assert_array_equal(covered(shape, boxes), np.ones(shape, np.int64))
                for sizes, u in zip(chunks, unit):
                    # Every boundary is a chunk boundary; only the last block is partial.
                    self.assertTrue(all(s % u == 0 for s in sizes[:-1]), (sizes, u))
                    self.assertTrue(all(s > 0 for s in sizes) or sizes == (0,))
                one_chunk = math.prod(min(u, max(s, 1)) for u, s in zip(unit, shape)) * itemsize
                block = math.prod(max(c) for c in chunks) * itemsize
                self.assertLessEqual(block, max(budget, one_chunk))

    def test_the_plan_fills_the_last_axes_first_and_evens_out_blocks(self):
        from zarrs_gpu.dask import BLOCK_BYTES, plan_chunks

        # 1 MiB chunks of a (1000, 2048, 2048) float32 volume: rows of whole planes' width.
        chunks = plan_chunks((1000, 2048, 2048), (64, 64, 64), 4)
        self.assertEqual((chunks[0][0], chunks[1][0], chunks[2][0]), (64, 1024, 2048))
        self.assertEqual(chunks[1], (1024, 1024))
        self.assertEqual(64 * 1024 * 2048 * 4, BLOCK_BYTES)
        # 33 chunks at up to 32 a block: 17 and 16 chunks.
        self.assertEqual(plan_chunks((33,), (1,), 1, 32), ((17, 16),))
        # A chunk larger than the budget is a block of its own; the whole array when it fits.
        self.assertEqual(plan_chunks((10, 10), (5, 5), 8, 1), ((5, 5), (5, 5)))
        self.assertEqual(plan_chunks((10, 10), (3, 3), 8, 10**6), ((10,), (10,)))
        self.assertEqual(plan_chunks((), (), 8), ())
        with self.assertRaises(ValueError):
            plan_chunks((10,), (3, 3), 4)

    def test_values_equal_dask_from_zarr_under_the_threaded_scheduler(self):
        import dask
        import dask.array as da

        import zarrs_gpu.dask as zd

        for name, (path, data) in self.arrays.items():
            z = zarr.open_array(path, mode="r")
            unit = z.shards or z.chunks
            itemsize = data.dtype.itemsize
            # Several grid chunks to a block, and several blocks.
            for budget in (itemsize * math.prod(unit) * 3, zd.BLOCK_BYTES):
                with self.subTest(array=name, budget=budget), self.host():
                    x = zd.from_zarr(path, block_bytes=budget)
                    self.assertEqual((x.shape, x.dtype), (data.shape, data.dtype))
                    self.assertIsInstance(x._meta, np.ndarray)
                    for sizes, u in zip(x.chunks, unit):
                        self.assertTrue(all(s % u == 0 for s in sizes[:-1]), (x.chunks, unit))
                    host = da.from_zarr(z)
                    with dask.config.set(scheduler="threads"):
                        np.testing.assert_array_equal(x.compute(), host.compute())
                        np.testing.assert_array_equal(x.compute(), data)
                        if data.dtype.kind == "f":
                            # Block sums add in another order: float32 rounds differently.
                            rtol = 1e-5 if itemsize == 4 else 1e-12
                            np.testing.assert_allclose(x.mean().compute(), host.mean().compute(), rtol=rtol)
                        self.assertEqual(x.max().compute(), host.max().compute())
                        key = (slice(3, None), Ellipsis, slice(-2, None)) if data.ndim > 1 else slice(3, -2)
                        np.testing.assert_array_equal(x[key].compute(), data[key])
                    # One read per block, and the blocks tile the array once.
                    self.reads.clear()
                    x.compute(scheduler="threads")
                    self.assertEqual(len(self.boxes), x.npartitions)
                    np.testing.assert_array_equal(covered(data.shape, self.boxes), np.ones(data.shape, np.int64))

    def test_chunks_overrides_give_the_same_values(self):
        import zarrs_gpu.dask as zd

        path, data = self.arrays["v3_sharded"]
        cases = {
            (7, 11): ((7,) * 6 + (1,), (11,) * 4 + (8,)),
            -1: ((43,), (52,)),
            ((20, 23), (52,)): ((20, 23), (52,)),
            (16, -1): ((16, 16, 11), (52,)),
            "auto": None,
        }
        for chunks, want in cases.items():
            with self.subTest(chunks=chunks), self.host():
                x = zd.from_zarr(path, chunks=chunks)
                if want is not None:
                    self.assertEqual(x.chunks, want)
                np.testing.assert_array_equal(x.compute(scheduler="threads"), data)
                np.testing.assert_array_equal(covered(data.shape, self.boxes), np.ones(data.shape, np.int64))
        with self.host(), self.assertRaises(ValueError) as caught:
            zd.from_zarr(path, chunks=((20, 20), (52,)))  # do not add up to the shape
        self.assertIn(path, str(caught.exception))

    def test_arrays_in_groups_and_relative_paths(self):
        import zarrs_gpu.dask as zd

        with self.host():
            x = zd.from_zarr(self.group, "/inner")
            np.testing.assert_array_equal(x.compute(scheduler="threads"), np.arange(60).reshape(10, 6))
            cwd = os.getcwd()
            os.chdir(self.dir.name)
            try:
                y = zd.from_zarr("group.zarr", "inner")
            finally:
                os.chdir(cwd)
            # The path is made absolute when the graph is built: tasks run wherever.
            np.testing.assert_array_equal(y.compute(scheduler="threads"), np.arange(60).reshape(10, 6))

    def test_the_graph_holds_plain_values_and_pickles(self):
        import pickle

        import dask

        import zarrs_gpu.dask as zd

        path, data = self.arrays["v3_sharded"]
        with self.host():
            x = zd.from_zarr(path, block_bytes=2 * 8 * 10 * 2, device=1)
        blob = pickle.dumps(x.dask)
        self.assertNotIn(b"_zarrs_gpu", blob)  # no Array, no handle of the compiled module
        graph = pickle.loads(blob)
        # The task arguments, where dask keeps them as tuples: path, array, device and box.
        tasks = [v for v in dict(graph).values() if isinstance(v, tuple)]
        self.assertEqual(len(tasks), x.npartitions)
        for task in tasks:
            self.assertEqual(task[1:4], (path, "/", 1))
            self.assertTrue(all(isinstance(a, int) and isinstance(b, int) for a, b in task[4]))
        # The unpickled graph runs (the reader is looked up when each task runs); so does the
        # whole array through cloudpickle (what distributed sends), where it is installed.
        import dask.array as da

        arrays = [da.Array(graph, x.name, x.chunks, meta=host_meta(data.dtype, 2))]
        try:
            import cloudpickle

            arrays.append(cloudpickle.loads(cloudpickle.dumps(x)))
        except ImportError:
            pass
        for y in arrays:
            with self.host():
                np.testing.assert_array_equal(y.compute(scheduler="threads"), data)
            self.assertEqual(len(self.boxes), x.npartitions)

    def test_the_device_given_reaches_every_task(self):
        from unittest import mock

        import zarrs_gpu.dask as zd

        path, data = self.arrays["v2"]
        seen = []

        def record(path, array, device, box):
            seen.append(device)
            return host_reader(path, array, device, box)

        for device in (None, 0, 3):
            seen.clear()
            with mock.patch.multiple(zd, reader=record, make_meta=host_meta):
                zd.from_zarr(path, chunks=(5, 5), device=device).compute(scheduler="threads")
            self.assertEqual(set(seen), {device})
        for bad in (-1, "0", True, 1.0):
            with self.subTest(device=bad), self.host(), self.assertRaises(ValueError) as caught:
                zd.from_zarr(path, device=bad)
            self.assertIn("device", str(caught.exception))

    def test_reads_of_one_device_are_limited_by_zarrs_gpu_dask_reads(self):
        import threading
        import time
        from unittest import mock

        import dask
        import dask.array as da

        import zarrs_gpu.dask as zd

        path, data = self.arrays["v2"]
        state = {"now": {}, "most": {}}
        lock = threading.Lock()

        def record(path, array, device, box):
            with lock:
                state["now"][device] = state["now"].get(device, 0) + 1
                state["most"][device] = max(state["most"].get(device, 0), state["now"][device])
            time.sleep(0.02)  # long enough for eight threads to pile up
            with lock:
                state["now"][device] -= 1
            return host_reader(path, array, device, box)

        def run(env, devices):
            state["most"].clear()
            with mock.patch.dict(os.environ, env), mock.patch.multiple(zd, reader=record, make_meta=host_meta), \
                    mock.patch.object(zd, "_gates", {}), dask.config.set(scheduler="threads", num_workers=8):
                parts = [zd.from_zarr(path, chunks=(5, 3), device=d) for d in devices]
                got = da.stack(parts).compute()
            for part in got:
                np.testing.assert_array_equal(part, data)
            return dict(state["most"])

        self.assertGreater(run({}, [0])[0], 1)  # unset: no limit, 16 blocks on 8 threads overlap
        self.assertEqual(run({"ZARRS_GPU_DASK_READS": "1"}, [0]), {0: 1})  # one read at a time
        self.assertEqual(run({"ZARRS_GPU_DASK_READS": "1"}, [0, 1]), {0: 1, 1: 1})  # a gate per device
        self.assertEqual(run({"ZARRS_GPU_DASK_READS": "3"}, [0])[0], 3)
        for bad in ("0", "two", "-1"):
            with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, "ZARRS_GPU_DASK_READS"):
                run({"ZARRS_GPU_DASK_READS": bad}, [0])

    def test_errors_name_the_path(self):
        import zarrs_gpu.dask as zd

        missing = os.path.join(self.dir.name, "missing.zarr")
        with self.host():
            with self.assertRaises(FileNotFoundError) as caught:
                zd.from_zarr(missing)
            self.assertIn(missing, str(caught.exception))
            with self.assertRaises(ValueError) as caught:
                zd.from_zarr(self.group)
            self.assertIn(self.group, str(caught.exception))
            self.assertIn("is a group, not an array", str(caught.exception))
            with self.assertRaises(TypeError):
                zd.from_zarr(self.group, 3)
        # A failed read names the store, the array and the block's box, with the reader's type.
        from unittest import mock

        def failing(path, array, device, box):
            raise OSError("disk on fire")

        path, _ = self.arrays["v2"]
        with mock.patch.multiple(zd, reader=failing, make_meta=host_meta):
            x = zd.from_zarr(path, chunks=(10, 11))
            with self.assertRaises(OSError) as caught:
                x.compute(scheduler="threads")
        message = str(caught.exception)
        self.assertIn(path, message)
        self.assertIn("disk on fire", message)
        self.assertRegex(message, r"reading \[(0:10|10:19), 0:11\] of array '/'")
        # An OSError with an errno keeps it, and its file name, under the added context.
        import errno

        def missing_file(path, array, device, box):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/c/0/0")

        with mock.patch.multiple(zd, reader=missing_file, make_meta=host_meta):
            with self.assertRaises(FileNotFoundError) as lost:
                zd.from_zarr(path, chunks=(10, 11)).compute(scheduler="threads")
        self.assertEqual((lost.exception.errno, lost.exception.filename), (errno.ENOENT, "/data/c/0/0"))
        self.assertIn("zarrs_gpu.dask: reading", lost.exception.strerror)
        # A reader that returns the wrong shape is caught too.
        with mock.patch.multiple(zd, reader=lambda *a: np.zeros((1, 1), "uint16"), make_meta=host_meta):
            with self.assertRaises(ValueError) as caught:
                zd.from_zarr(path).compute(scheduler="threads")
        self.assertIn("gave shape (1, 1), not (19, 11)", str(caught.exception))

    def test_the_workers_cache_keys_on_path_array_and_device(self):
        import zarrs_gpu.dask as zd

        path, _ = self.arrays["v2"]
        a = zd._open(path, "/", 0)
        self.assertIs(zd._open(path, "/", 0), a)
        self.assertIsNot(zd._open(path, "/", 1), a)
        self.assertEqual(a.shape, (19, 11))

    def test_an_array_rewritten_in_place_is_opened_again(self):
        import warnings

        import zarrs_gpu.dask as zd

        # Same shape, same item size, another data type and fill value: reading it with the old
        # metadata would give wrong values of the right shape.
        path = os.path.join(self.dir.name, "rewritten.zarr")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            zarr.create_array(store=path, shape=(12, 5), chunks=(4, 5), dtype="int32", fill_value=7, zarr_format=2)
            first = zd._open(path, "/", 0)
            self.assertEqual((first.dtype, first.shape), ("int32", (12, 5)))
            self.assertIs(zd._open(path, "/", 0), first)
            zarr.create_array(store=path, shape=(12, 5), chunks=(4, 5), dtype="float32", fill_value=0.5,
                              zarr_format=2, overwrite=True)
        again = zd._open(path, "/", 0)
        self.assertIsNot(again, first)
        self.assertEqual((again.dtype, again.shape), ("float32", (12, 5)))
        self.assertIs(zd._open(path, "/", 0), again)
        with self.assertRaises(FileNotFoundError):  # the error zarrs_gpu.open gives, not None
            zd._open(os.path.join(self.dir.name, "absent.zarr"), "/", 0)

    def test_without_cupy_the_meta_and_the_reader_say_cupy_is_needed(self):
        import zarrs_gpu.dask as zd

        path, _ = self.arrays["v2"]
        with without_cupy():
            with self.assertRaises(ImportError) as caught:
                zd.from_zarr(path)
            self.assertIn("needs CuPy", str(caught.exception))
            with self.assertRaises(ImportError) as caught:
                zd.read_on_device(path, "/", None, ((0, 1), (0, 1)))
            self.assertIn("needs CuPy", str(caught.exception))

    def test_the_package_imports_without_dask(self):
        code = ("import sys; sys.modules['dask'] = None\n"
                "import zarrs_gpu, zarrs_gpu.dask\n"
                "try:\n"
                "    zarrs_gpu.dask.from_zarr('x.zarr')\n"
                "except ImportError as e:\n"
                "    print('ImportError', e)\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ImportError", run.stdout)


try:
    import xarray  # noqa: F401

    HAVE_XARRAY = True
except ImportError:
    HAVE_XARRAY = False


def xarray_engine():
    """engine="zarrs_gpu" where the package is installed (its entry point registered, as in CI),
    else the backend class itself (a checkout on PYTHONPATH)."""
    import xarray as xr

    if "zarrs_gpu" in xr.backends.list_engines():
        return "zarrs_gpu"
    from zarrs_gpu.xarray import ZarrsGpuBackendEntrypoint

    return ZarrsGpuBackendEntrypoint


def xarray_test_dataset():
    """What the xarray tests write with xarray's own to_zarr: a time coordinate, 1-D coordinates,
    a 2-D coordinate named by `coordinates`, 3-D float32 with NaNs (a NaN _FillValue), int16
    packing (scale_factor, add_offset, _FillValue), plain int32, and attributes."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(19)
    temp = rng.standard_normal((6, 5, 7)).astype("float32")
    temp[0, 0, :3] = np.nan
    packed = rng.uniform(-3, 3, (5, 7))
    packed[1, 2] = np.nan
    ds = xr.Dataset(
        {
            "temp": (("time", "y", "x"), temp, {"units": "K", "long_name": "air temperature"}),
            "packed": (("y", "x"), packed, {"long_name": "packed"}),
            "counts": (("y", "x"), rng.integers(0, 100, (5, 7)).astype("int32"), {"flag": 1}),
        },
        coords={
            "time": pd.date_range("2000-01-01", periods=6, freq="6h"),
            "y": np.linspace(40.0, 44.0, 5),
            "x": np.arange(7) * 10,
            "lat": (("y", "x"), rng.uniform(-90, 90, (5, 7)), {"units": "degrees_north"}),
        },
        attrs={"title": "zarrs_gpu xarray test", "version": 3, "levels": [1, 2, 3]},
    )
    ds["packed"].encoding = {"dtype": "int16", "scale_factor": 0.001, "add_offset": 1.5, "_FillValue": -32768}
    ds["temp"].encoding = {"chunks": (2, 3, 7)}
    ds["counts"].encoding = {"chunks": (2, 4)}
    return ds


@unittest.skipUnless(HAVE_XARRAY and HAVE_DASK, "xarray (and dask[array]) are not installed")
class XarrayCpuTests(RecordedHostReads, unittest.TestCase):
    """zarrs_gpu.xarray without a GPU: datasets written by xarray's to_zarr (v2 and v3,
    consolidated or not, in a group), opened with engine="zarrs_gpu" with the reads replaced by
    zarr-python on the host (zarrs_gpu.dask.reader), against xarray's own zarr engine."""

    @classmethod
    def setUpClass(cls):
        import warnings

        cls.dir = tempfile.TemporaryDirectory()
        cls.ds = xarray_test_dataset()
        cls.stores = {}
        for name, options in {
            "v2": dict(zarr_format=2, consolidated=True),
            "v3": dict(zarr_format=3, consolidated=True),
            "v3_plain": dict(zarr_format=3, consolidated=False),
            "v2_plain": dict(zarr_format=2, consolidated=False),
            "v3_group": dict(zarr_format=3, consolidated=True, group="inner/g"),
        }.items():
            path = os.path.join(cls.dir.name, name + ".zarr")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cls.ds.to_zarr(path, mode="w", **options)
            cls.stores[name] = (path, options.get("group"))
        cls.engine = xarray_engine()

    def reference(self, name, **options):
        import warnings

        import xarray as xr

        path, group = self.stores[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # v3 consolidated metadata's warning
            return xr.open_dataset(path, engine="zarr", group=group, **options)

    def test_v3_fill_value_kept_in_the_encoding_as_xarray_2026_07_keeps_it(self):
        """xarray 2026.07 and later keep a v3 array's fill_value in the encoding (so its writes
        keep it); the engine follows the installed xarray."""
        from unittest import mock

        import xarray as xr
        import zarr

        path, _ = self.stores["v3_plain"]
        fill = zarr.open_array(path, path="temp", mode="r").fill_value
        for version, kept in (("2025.12.0", False), ("2026.7.0", True), ("2027.1.0", True)):
            with self.subTest(version=version), self.host(), mock.patch.object(xr, "__version__", version):
                got = xr.open_dataset(path, engine=self.engine)
                self.assertEqual("fill_value" in got["temp"].encoding, kept)
                if kept:
                    self.assertEqual(repr(got["temp"].encoding["fill_value"]), repr(fill))
        with self.host(), mock.patch.object(xr, "__version__", "2026.7.0"):
            path, _ = self.stores["v2_plain"]  # v2: the fill value is _FillValue, never encoding
            self.assertNotIn("fill_value", xr.open_dataset(path, engine=self.engine)["temp"].encoding)

    def test_datasets_equal_xarrays_zarr_engine(self):
        import xarray as xr

        for name, (path, group) in self.stores.items():
            for options in ({}, dict(mask_and_scale=False), dict(decode_times=False), dict(decode_cf=False)):
                with self.subTest(store=name, options=options), self.host():
                    want = self.reference(name, **options)
                    got = xr.open_dataset(path, engine=self.engine, group=group, **options)
                    xr.testing.assert_identical(got, want)
                    self.assertEqual(got.attrs, want.attrs)
                    for v in got.variables:
                        self.assertEqual(got[v].encoding.get("dtype"), want[v].encoding.get("dtype"), v)
                    if options.get("decode_cf", True):
                        self.assertEqual(set(got.coords), {"time", "y", "x", "lat"})
                        self.assertEqual(set(got.data_vars), {"temp", "packed", "counts"})
                    loaded = got.load()
                    xr.testing.assert_identical(loaded, want.load())
                    if options == {}:
                        # The decoded values: NaNs kept, int16 packing undone, times as datetimes.
                        xr.testing.assert_allclose(loaded, self.ds, atol=1e-3)
                        self.assertEqual(loaded["packed"].dtype, np.float64)
                        self.assertTrue(np.isnan(loaded["packed"].values[1, 2]))
                        self.assertEqual(loaded["time"].dtype.kind, "M")
                    # Every array read was this store's.
                    self.assertTrue(all(a.startswith("/" + (group or "").strip("/")) for a, _ in self.reads))

    def test_reads_stay_on_the_device_unless_xarray_decodes_them(self):
        from zarrs_gpu.xarray import CFMaskScaleArray, ZarrsGpuBackendEntrypoint, _ours

        for name, (path, group) in self.stores.items():
            with self.subTest(store=name), self.host():
                ds = ZarrsGpuBackendEntrypoint().open_dataset(path, group=group)
                # Data variables that decoding leaves alone (NaN fill value, plain int32) read
                # straight from zarrs_gpu (CuPy on a GPU), the packed one through
                # CFMaskScaleArray (decoded on the device); every coordinate is copied to the
                # host, where xarray decodes it and builds its indexes.
                self.assertFalse(_ours(ds["temp"].variable._data).host)
                self.assertFalse(_ours(ds["counts"].variable._data).host)
                self.assertIsInstance(ds["packed"].variable._data, CFMaskScaleArray)
                self.assertFalse(_ours(ds["packed"].variable._data).host)
                self.assertTrue(_ours(ds["lat"].variable._data).host)
                raw = ZarrsGpuBackendEntrypoint().open_dataset(path, group=group, mask_and_scale=False)
                self.assertFalse(_ours(raw["packed"].variable._data).host)

    def test_chunks_give_dask_arrays_of_the_same_values(self):
        import warnings

        import dask.array as da
        import xarray as xr

        import zarrs_gpu.xarray

        path, _ = self.stores["v3"]
        want = self.reference("v3").load()
        for chunks, temp_chunks in (({}, ((2, 2, 2), (3, 2), (7,))), ({"time": 3, "x": -1}, ((3, 3), (3, 2), (7,))),
                                    ("auto", None)):
            for how in ("xarray", "device manager"):
                with self.subTest(chunks=chunks, how=how), self.host(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # chunks that split the stored ones
                    if how == "xarray":  # xarray's own chunk manager: blocks made numpy by np.asarray
                        got = xr.open_dataset(path, engine=self.engine, chunks=chunks)
                    else:  # DeviceDaskManager's path for data variables, host reads standing in
                        got = zarrs_gpu.xarray.open_dataset(path, chunks=chunks)
                        self.assertIsInstance(got["temp"].data._meta, np.ndarray)  # make_meta's, here numpy
                        # Its blocks come through _DeviceBlocks, whose reads are not np.asarray'd.
                        for v, device in (("temp", True), ("packed", True), ("counts", True), ("lat", False)):
                            graph = dict(got[v].data.__dask_graph__())
                            self.assertEqual(any("_DeviceBlocks" in repr(t) for t in graph.values()), device, v)
                    for v in ("temp", "packed", "counts"):
                        self.assertIsInstance(got[v].data, da.Array, v)
                    if temp_chunks is not None:
                        self.assertEqual(got["temp"].data.chunks, temp_chunks)
                    self.reads.clear()
                    with __import__("dask").config.set(scheduler="threads"):
                        computed = got.compute()
                    xr.testing.assert_identical(computed, want)
                    temp_reads = [box for a, box in self.reads if a == "/temp"]
                    self.assertEqual(len(temp_reads), got["temp"].data.npartitions)
                    np.testing.assert_array_equal(covered((6, 5, 7), temp_reads), np.ones((6, 5, 7), np.int64))

    def test_indexing_reads_one_box(self):
        import xarray as xr

        path, _ = self.stores["v2"]
        want = self.reference("v2")
        with self.host():
            got = xr.open_dataset(path, engine=self.engine)
            keys = [dict(time=slice(1, 5, 2), y=slice(3, 0, -1), x=3), dict(time=-1), dict(x=slice(5, 1, -2)),
                    dict(time=slice(4, 4)), dict(y=[3, 0, 1]), dict(time=[0, 5], x=slice(0, 7, 3))]
            for key in keys:
                with self.subTest(key=key):
                    self.reads.clear()
                    xr.testing.assert_identical(got["temp"].isel(key).load(), want["temp"].isel(key).load())
                    # One read of temp (its coordinate lat is read whole, with it).
                    self.assertEqual([a for a, _ in self.reads if a != "/lat"], ["/temp"])
            # A slice reversed down to 0, which xarray 2025.12 hands backends as stop -1 (its zarr
            # engine fails on it: an IndexError in its decomposition, or an empty coordinate).
            np.testing.assert_array_equal(got["counts"].variable[::-1, 1:6:2].values,
                                          want["counts"].values[::-1, 1:6:2])
            np.testing.assert_array_equal(got["lat"].variable[::-2].values, want["lat"].values[::-2])
        # The box and the numpy key the backend takes a basic key's elements with.
        from zarrs_gpu.xarray import _box_and_rest

        rng = np.random.default_rng(5)
        shape = (9, 1, 6)
        data = np.arange(math.prod(shape)).reshape(shape)
        for _ in range(500):
            key = tuple(int(rng.integers(-s, s)) if rng.random() < 0.2 else
                        slice(*(None if rng.random() < 0.2 else int(rng.integers(-2 * s - 2, 2 * s + 2))
                                for _ in range(2)), None if rng.random() < 0.3 else int(rng.choice([-3, -2, -1, 1, 2, 4])))
                        for s in shape)
            with self.subTest(key=key):
                box, rest = _box_and_rest(key, shape)
                self.assertTrue(all(0 <= a <= b <= s for (a, b), s in zip(box, shape)))
                read = data[tuple(slice(a, b) for a, b in box)]
                np.testing.assert_array_equal(read[rest], data[key])

    def test_errors_name_the_path(self):
        import warnings

        import xarray as xr

        missing = os.path.join(self.dir.name, "missing.zarr")
        with self.host():
            with self.assertRaises(FileNotFoundError) as caught:
                xr.open_dataset(missing, engine=self.engine)
            self.assertIn(missing, str(caught.exception))
            path, _ = self.stores["v3_group"]
            with self.assertRaises(FileNotFoundError) as caught:
                xr.open_dataset(path, engine=self.engine, group="nowhere")
            self.assertIn(path, str(caught.exception))
            self.assertIn("nowhere", str(caught.exception))
            # A v2 array without _ARRAY_DIMENSIONS: xarray cannot name its dimensions.
            bare = os.path.join(self.dir.name, "bare.zarr")
            g = zarr.open_group(bare, mode="w", zarr_format=2)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                g.create_array("a", shape=(3,), chunks=(3,), dtype="int8")
            with self.assertRaises(KeyError) as caught:
                xr.open_dataset(bare, engine=self.engine)
            self.assertIn(bare, str(caught.exception))
            self.assertIn("_ARRAY_DIMENSIONS", str(caught.exception))
            with self.assertRaises(TypeError):
                xr.open_dataset(zarr.storage.MemoryStore(), engine=self.engine)
            with self.assertRaises(ValueError) as caught:
                xr.open_dataset(path, engine=self.engine, device=-1)
            self.assertIn("device", str(caught.exception))
        # A failed read names the store, the array and the box.
        from unittest import mock

        import zarrs_gpu.dask as zd

        def failing(path, array, device, box):
            if array == "/counts":
                raise OSError("disk on fire")
            return host_reader(path, array, device, box)

        path, _ = self.stores["v3"]
        with mock.patch.multiple(zd, reader=failing):
            got = xr.open_dataset(path, engine=self.engine, decode_times=False)
            with self.assertRaises(OSError) as caught:
                got["counts"][1:3].load()
        message = str(caught.exception)
        self.assertIn(path, message)
        self.assertIn("disk on fire", message)
        self.assertIn("reading [1:3, 0:7] of array '/counts'", message)

    def test_the_device_given_reaches_every_read(self):
        from unittest import mock

        import xarray as xr

        import zarrs_gpu.dask as zd

        seen = []

        def record(path, array, device, box):
            seen.append(device)
            return host_reader(path, array, device, box)

        path, _ = self.stores["v3"]
        for device in (None, 2):
            seen.clear()
            with mock.patch.multiple(zd, reader=record):
                xr.open_dataset(path, engine=self.engine, device=device).load()
            self.assertEqual(set(seen), {device})

    def test_the_backend_is_registered_and_only_used_when_asked_for(self):
        import importlib.metadata

        import xarray as xr

        from zarrs_gpu.xarray import ZarrsGpuBackendEntrypoint

        pyproject = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pyproject.toml")
        with open(pyproject) as f:
            text = f.read()
        self.assertIn('[project.entry-points."xarray.backends"]\nzarrs_gpu = "zarrs_gpu.xarray:ZarrsGpuBackendEntrypoint"',
                      text)
        try:
            importlib.metadata.distribution("zarrs-gpu")
            installed = True
        except importlib.metadata.PackageNotFoundError:
            installed = False
        if installed:  # CI: pip installed ./python
            self.assertIs(type(xr.backends.list_engines()["zarrs_gpu"]), ZarrsGpuBackendEntrypoint)
        path, _ = self.stores["v3"]
        self.assertFalse(ZarrsGpuBackendEntrypoint().guess_can_open(path))

    def test_the_package_imports_without_xarray(self):
        code = ("import sys; sys.modules['xarray'] = None\n"
                "import zarrs_gpu, zarrs_gpu.dask\n"
                "try:\n"
                "    import zarrs_gpu.xarray\n"
                "except ImportError as e:\n"
                "    print('ImportError', e)\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ImportError", run.stdout)


def write_cf_stores(directory, ds):
    """``ds`` written by xarray's to_zarr as v2 and v3 (consolidated) in ``directory``: {2: path, 3: path}."""
    import warnings

    stores = {}
    for fmt in (2, 3):
        path = os.path.join(directory, f"cf_v{fmt}.zarr")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds.to_zarr(path, mode="w", zarr_format=fmt, consolidated=True)
        stores[fmt] = path
    return stores


def cf_test_dataset(seed=23, shape=(6, 13, 17)):
    """A dataset whose variables xarray's CF decoding transforms in every way mask-and-scale
    can, written with to_zarr: int16 packing (scale_factor, add_offset, _FillValue), uint8
    stored as int8 with _Unsigned, float32 with a non-NaN _FillValue (and NaNs), int32 with
    missing_value only, int16 with scale_factor only, int16 with _FillValue only, several fill
    values (missing_value list and _FillValue), a packed 2-D coordinate; and what it leaves to
    the host: a time coordinate, integer times and timedeltas with fill values, plain floats."""
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(seed)
    t, y, x = shape
    nan_at = rng.random(shape) < 0.05
    packed = rng.uniform(-300, 300, shape)
    packed[nan_at] = np.nan
    u8 = rng.integers(0, 255, (y, x)).astype("float32")  # 255 is the fill value (-1 as int8)
    u8[rng.random((y, x)) < 0.1] = np.nan
    f32 = rng.standard_normal(shape).astype("float32")
    f32[nan_at] = np.nan
    mv = rng.integers(-100000, 100000, (y, x)).astype("float64")
    mv[rng.random((y, x)) < 0.1] = np.nan
    multi = rng.integers(-4, 30, (y, x)).astype("int32")  # -1, -2 (missing_value) and -3 masked
    valid = pd.date_range("2001-01-01", periods=y, freq="D").values.copy()
    valid[1] = np.datetime64("NaT")
    lead = (np.arange(y) * np.timedelta64(3, "h")).astype("timedelta64[ns]")
    lead[2] = np.timedelta64("NaT")
    ds = xr.Dataset(
        {
            "packed": (("time", "y", "x"), packed, {"long_name": "packed", "units": "m"}),
            "u8": (("y", "x"), u8, {"long_name": "unsigned"}),
            "f32": (("time", "y", "x"), f32, {"units": "K"}),
            "mv": (("y", "x"), mv),
            "scaled": (("y", "x"), rng.integers(-20000, 20000, (y, x)) * 0.25),
            "i16": (("time", "y", "x"), np.where(nan_at, np.nan, rng.integers(-500, 500, shape)).astype("float32")),
            "multi": (("y", "x"), multi, {"missing_value": [-1, -2]}),
            "plain": (("time", "y", "x"), rng.standard_normal(shape)),
            "valid": (("y",), valid),
            "lead": (("y",), lead),
        },
        coords={
            "time": pd.date_range("2000-01-01", periods=t, freq="6h"),
            "y": np.linspace(-60.0, 60.0, y),
            "x": np.arange(x) * 7,
            "lat": (("y", "x"), rng.uniform(-90, 90, (y, x)), {"units": "degrees_north"}),
        },
        attrs={"title": "zarrs_gpu CF decoding test"},
    )
    ds["packed"].encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 10.0, "_FillValue": -32767,
                             "chunks": (2, 5, 9)}
    ds["u8"].encoding = {"dtype": "int8", "_Unsigned": "true", "_FillValue": -1}
    ds["f32"].encoding = {"_FillValue": np.float32(-9999.0), "chunks": (3, 13, 8)}
    ds["mv"].encoding = {"dtype": "int32", "missing_value": -999}
    ds["scaled"].encoding = {"dtype": "int16", "scale_factor": 0.25}
    ds["i16"].encoding = {"dtype": "int16", "_FillValue": -32768}
    ds["multi"].encoding = {"_FillValue": -3}
    ds["valid"].encoding = {"dtype": "int32", "_FillValue": -999, "units": "days since 2001-01-01"}
    ds["lead"].encoding = {"dtype": "int32", "_FillValue": -1, "units": "hours"}
    ds["lat"].encoding = {"dtype": "int16", "scale_factor": 0.003, "add_offset": 0.0, "_FillValue": -32768}
    return ds


#: The variables of cf_test_dataset that zarrs_gpu.xarray decodes itself (CFMaskScaleArray).
CF_DEVICE_DECODED = {"packed", "u8", "f32", "mv", "scaled", "i16", "multi", "lat"}
#: Encoding keys that say how a store keeps the array (the engines differ there), not CF decoding.
STORAGE_ENCODING = {"compressors", "compressor", "filters", "serializer", "shards", "source"}


def mask_scale_array(data):
    """The CFMaskScaleArray under a variable's data (xarray's caching and copy-on-write
    wrappers taken off), else None."""
    from zarrs_gpu.xarray import CFMaskScaleArray

    while not isinstance(data, CFMaskScaleArray):
        if not hasattr(data, "array"):
            return None
        data = data.array
    return data


def same_bits(testcase, got, want, what):
    """Equal dtypes and equal bytes (NaN payloads and signed zeros too)."""
    got, want = np.asarray(got), np.asarray(want)
    testcase.assertEqual(got.dtype, want.dtype, what)
    testcase.assertEqual(got.shape, want.shape, what)
    testcase.assertEqual(got.tobytes(), want.tobytes(), what)


@unittest.skipUnless(HAVE_XARRAY and HAVE_DASK, "xarray (and dask[array]) are not installed")
class XarrayCFDecodingCpuTests(RecordedHostReads, unittest.TestCase):
    """zarrs_gpu.xarray's own CF mask-and-scale decoding (CFMaskScaleArray, computed with the
    data's array module: CuPy on a GPU, numpy here with zarr-python's host reads in place of the
    GPU's) against xarray's zarr engine: values bit for bit, dtypes, attrs and encoding, for every
    decoding option, lazily indexed, and under Dask."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory()
        cls.ds = cf_test_dataset()
        cls.stores = write_cf_stores(cls.dir.name, cls.ds)
        cls.engine = xarray_engine()

    def open_both(self, fmt, **options):
        import warnings

        import xarray as xr

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # multiple fill values, decode_timedelta's FutureWarning
            want = xr.open_dataset(self.stores[fmt], engine="zarr", **options)
            got = xr.open_dataset(self.stores[fmt], engine=self.engine, **options)
        return got, want

    def assert_same_dataset(self, got, want, decoded_here):
        import xarray as xr

        # Which variables this module decodes, before anything is read (xarray's cache then
        # holds the values in place of the lazy arrays).
        for name in want.variables:
            self.assertEqual(mask_scale_array(got[name].variable._data) is not None, name in decoded_here, name)
        self.assertEqual(list(got.variables), list(want.variables))
        for name in want.variables:
            g, w = got[name].variable, want[name].variable
            self.assertEqual(g.dtype, w.dtype, name)
            # assertEqual's == says NaN != NaN: compare the reprs (types and values).
            self.assertEqual(repr(sorted(g.attrs.items())), repr(sorted(w.attrs.items())), name)
            ge = {k: v for k, v in g.encoding.items() if k not in STORAGE_ENCODING}
            we = {k: v for k, v in w.encoding.items() if k not in STORAGE_ENCODING}
            self.assertEqual(repr(sorted(ge.items())), repr(sorted(we.items())), name)
        xr.testing.assert_identical(got, want)
        loaded, expected = got.load(), want.load()
        for name in want.variables:
            same_bits(self, loaded[name].values, expected[name].values, name)

    def test_datasets_equal_xarrays_zarr_engine_for_every_option(self):
        with_times = CF_DEVICE_DECODED
        cases = [
            ({}, with_times),
            (dict(decode_times=False), with_times),
            (dict(mask_and_scale=False), set()),
            (dict(decode_cf=False), set()),
            (dict(mask_and_scale={"packed": False, "lat": False}), with_times - {"packed", "lat"}),
            (dict(drop_variables=["packed", "valid"]), with_times - {"packed"}),
            (dict(decode_coords=False), with_times),
            (dict(decode_timedelta=True, use_cftime=False), with_times),
            (dict(decode_times={"valid": False}), with_times),
        ]
        for fmt in (2, 3):
            for options, decoded_here in cases:
                with self.subTest(zarr_format=fmt, options=options), self.host():
                    got, want = self.open_both(fmt, **options)
                    self.assert_same_dataset(got, want, decoded_here)
                    if options == {}:
                        # Real decoding happened: NaNs where the data had them, packing undone.
                        np.testing.assert_allclose(got["packed"].values, self.ds["packed"].values, atol=0.006)
                        self.assertEqual(got["packed"].dtype, np.float64)
                        self.assertEqual(got["u8"].dtype, np.float32)
                        self.assertEqual(got["i16"].dtype, np.float32)
                        self.assertEqual(got["mv"].dtype, np.float64)
                        np.testing.assert_array_equal(got["u8"].values, self.ds["u8"].values)
                        np.testing.assert_array_equal(np.isnan(got["f32"].values), np.isnan(self.ds["f32"].values))
                        np.testing.assert_array_equal(np.isnan(got["multi"].values),
                                                      np.isin(self.ds["multi"].values, [-1, -2, -3]))
                        self.assertTrue(np.isnan(got["multi"].values).any())
                        self.assertEqual(got["valid"].dtype.kind, "M")
                        self.assertEqual(got["lead"].dtype.kind, "m")

    def test_decoded_variables_read_through_the_device_path(self):
        from zarrs_gpu.xarray import ZarrsGpuBackendEntrypoint, _ours

        for fmt in (2, 3):
            with self.subTest(zarr_format=fmt), self.host():
                ds = ZarrsGpuBackendEntrypoint().open_dataset(self.stores[fmt])
                for name in CF_DEVICE_DECODED:
                    data = ds.variables[name]._data
                    self.assertIs(mask_scale_array(data), data, name)
                    # Data variables read to the device (host False), coordinates to the host.
                    self.assertEqual(_ours(data).host, name == "lat", name)
                for name in ("valid", "lead", "time", "plain"):
                    self.assertIsNone(mask_scale_array(ds.variables[name]._data), name)
                # The steps xarray's coders chose, read back from their functions.
                steps = ds.variables["packed"]._data.steps
                self.assertEqual([s[0] for s in steps], ["mask", "scale"])
                self.assertEqual(steps[1][1:], (0.01, 10.0, np.dtype("float64")))
                self.assertEqual([s[0] for s in ds.variables["u8"]._data.steps], ["cast", "mask"])
                self.assertEqual(ds.variables["u8"]._data.steps[0][1], np.dtype("uint8"))
                # Values computed by this module, not by xarray: the decoding of what was read.
                self.reads.clear()
                computed = ds.variables["packed"]._data.get_duck_array()
                self.assertEqual([a for a, _ in self.reads], ["/packed"])
                self.assertIsInstance(computed, np.ndarray)
                self.assertEqual(computed.dtype, np.float64)
                # It pickles (Dask's distributed workers get it in their tasks), reads and all.
                import pickle

                from xarray.core.indexing import BasicIndexer

                key = BasicIndexer((slice(1, 3), slice(4, 9), slice(None)))
                again = pickle.loads(pickle.dumps(ds.variables["packed"]._data[key]))
                same_bits(self, again.get_duck_array(), computed[1:3, 4:9], "unpickled")

    def test_indexing_reads_only_the_box(self):
        for fmt in (2, 3):
            with self.host():
                got, want = self.open_both(fmt)
                # In memory: xarray's zarr engine fails on slices reversed down to 0 (see
                # XarrayCpuTests.test_indexing_reads_one_box), this engine does not.
                want = want.load()
                keys = [dict(time=slice(0, 2), y=slice(3, 8), x=slice(1, 4)), dict(time=-1, x=slice(16, 2, -3)),
                        dict(time=slice(5, 0, -2), y=0), dict(y=slice(None, None, -1)), dict(x=[4, 0, 9]),
                        dict(time=slice(3, 3)), dict(time=2, y=4, x=5), dict(x=slice(None, None, -5))]
                for key in keys:
                    for name in ("packed", "f32", "i16"):
                        with self.subTest(zarr_format=fmt, key=key, variable=name):
                            self.reads.clear()
                            g = got[name].isel(key)
                            w = want[name].isel(key)
                            self.assertEqual(self.reads, [])  # lazy until asked for
                            self.assertIsNotNone(mask_scale_array(g.variable._data))
                            same_bits(self, g.values, w.values, name)
                            self.assertEqual(len(self.reads), 1)
                            (array, box), = self.reads
                            self.assertEqual(array, "/" + name)
                            # The box read is the smallest one holding the key's elements.
                            full = self.ds[name].shape
                            want_box = []
                            for dim, size in zip(("time", "y", "x"), full):
                                idx = np.arange(size)[key.get(dim, slice(None))]
                                idx = np.atleast_1d(idx)
                                want_box.append((int(idx.min()), int(idx.max()) + 1) if idx.size else None)
                            if all(b is not None for b in want_box):
                                self.assertEqual(box, tuple(want_box))
                # Indexing in steps composes: a subset of a subset, a transpose, vectorized keys.
                import xarray as xr

                # (Not a transpose of a slice reversed down to 0: xarray 2025.12 makes that an
                # empty vectorized key, for every engine; its zarr engine then gives empty data.)
                self.reads.clear()
                sub = got["packed"][1:5, 11:0:-2][:, 1:, 3:15:4].transpose("x", "time", "y")
                same_bits(self, sub.values, want["packed"][1:5, 11:0:-2][:, 1:, 3:15:4].transpose("x", "time", "y").values,
                          "packed subset")
                self.assertEqual(len(self.reads), 1)
                pick = dict(y=xr.DataArray([0, 5, 12], dims="p"), x=xr.DataArray([16, 1, 1], dims="p"))
                same_bits(self, got["mv"].isel(pick).values, want["mv"].isel(pick).values, "vectorized")

    def test_chunks_give_dask_arrays_of_the_same_values(self):
        import warnings

        import dask
        import dask.array as da

        for fmt in (2, 3):
            for chunks in ({}, {"time": 1, "x": 5}):
                with self.subTest(zarr_format=fmt, chunks=chunks), self.host(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    got, want = self.open_both(fmt, chunks=chunks)
                    self.assertIsInstance(got["packed"].data, da.Array)
                    self.assertEqual(got["packed"].data.chunks, want["packed"].data.chunks)
                    self.assertEqual(got["packed"].data.dtype, np.float64)
                    self.reads.clear()
                    with dask.config.set(scheduler="threads"):
                        computed = got.compute()
                    packed_reads = [box for a, box in self.reads if a == "/packed"]
                    self.assertEqual(len(packed_reads), got["packed"].data.npartitions)
                    np.testing.assert_array_equal(covered(self.ds["packed"].shape, packed_reads),
                                                  np.ones(self.ds["packed"].shape, np.int64))
                    expected = want.compute()
                    for name in want.variables:
                        same_bits(self, computed[name].values, expected[name].values, name)

    def test_xarrays_warnings_are_given_once(self):
        import warnings

        import xarray as xr

        for fmt in (2, 3):
            with self.subTest(zarr_format=fmt), self.host(), warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                xr.open_dataset(self.stores[fmt], engine=self.engine, drop_variables=["lead"])
            multiple = [str(w.message) for w in caught if "multiple fill values" in str(w.message)]
            # xarray's own: once for missing_value, once for missing_value with _FillValue.
            self.assertEqual(len(multiple), 2, multiple)
            self.assertTrue(all("'multi'" in m for m in multiple))

    def test_steps_give_xarrays_values_bit_for_bit(self):
        """The three decoding functions of xarray against CFMaskScaleArray's steps on random data
        of every kind its coders meet, through the coders themselves (so the steps are those
        xarray picks: float32 arithmetic for float32 packing, float64 comparisons, ...)."""
        import warnings

        import xarray as xr
        from xarray.coding.variables import CFMaskCoder, CFScaleOffsetCoder
        from xarray.core import indexing

        from zarrs_gpu.xarray import _apply_steps, _steps_of

        rng = np.random.default_rng(11)
        f32_fill = np.float32(0.1)
        cases = [
            ("int16", dict(scale_factor=0.01, add_offset=10.0, _FillValue=np.int16(-32767))),
            ("int16", dict(scale_factor=np.float32(0.1), add_offset=np.float32(3.3), _FillValue=np.int16(7))),
            ("int8", dict(scale_factor=np.float32(0.37), add_offset=np.float32(-1.1))),
            ("int32", dict(scale_factor=np.float32(0.001), add_offset=np.float32(5.5))),
            ("int32", dict(scale_factor=1e-3, add_offset=np.float32(2.0), missing_value=np.int32(11))),
            ("int16", dict(scale_factor=0.25)),
            ("int16", dict(add_offset=100.5)),
            ("uint16", dict(scale_factor=np.float64(0.002), _FillValue=np.uint16(65535))),
            ("int8", dict(_Unsigned="true", _FillValue=np.int8(-1))),
            ("int8", dict(_Unsigned="true", scale_factor=0.5, add_offset=1.0, _FillValue=np.int8(-128))),
            ("uint16", dict(_Unsigned="false", _FillValue=np.uint16(65535))),
            ("int32", dict(_Unsigned="true")),
            ("float32", dict(_FillValue=-9999.0)),
            ("float32", dict(_FillValue=f32_fill)),  # compared in float32: equal elements masked
            ("float32", dict(_FillValue=0.1)),  # a float64 fill: float32 0.1 differs, kept
            ("float32", dict(missing_value=[1.5, 2.5], _FillValue=np.float32(-1.0))),
            ("float16", dict(_FillValue=np.float16(3.0))),
            ("float64", dict(_FillValue=1e20, scale_factor=2.0)),
            ("int64", dict(_FillValue=np.int64(2**53 + 1))),  # compared after the cast to float64
            ("uint32", dict(missing_value=np.uint32(4000000000))),
            ("int32", dict(missing_value=-999)),
            ("int16", dict(_FillValue=np.int16(3), missing_value=np.int16(4))),
        ]
        for dtype, attrs in cases:
            dtype = np.dtype(dtype)
            with self.subTest(dtype=str(dtype), attrs=attrs):
                if dtype.kind == "f":
                    raw = (rng.standard_normal((40, 30)) * 10).astype(dtype)
                    raw[rng.random(raw.shape) < 0.1] = np.nan
                    raw[rng.random(raw.shape) < 0.1] = np.float32(0.1)
                else:
                    info = np.iinfo(dtype)
                    lo, hi = max(int(info.min), -(2**62)), min(int(info.max), 2**62)
                    raw = rng.integers(lo, hi, (40, 30), endpoint=True).astype(dtype)
                    raw[rng.random(raw.shape) < 0.05] = np.array(info.max).astype(dtype)
                    raw[rng.random(raw.shape) < 0.05] = np.array(info.min).astype(dtype)
                    raw[rng.random(raw.shape) < 0.1] = np.array(rng.integers(0, 12)).astype(dtype)
                # Every fill value occurs in the data (the cast as the coders read it).
                for key in ("_FillValue", "missing_value"):
                    if key in attrs:
                        for fv in np.ravel(attrs[key]):
                            raw.flat[rng.integers(0, raw.size, 20)] = np.array(fv).astype(dtype)
                if dtype == np.dtype("int64"):
                    raw.flat[:5] = 2**53  # equals 2**53 + 1 once both are float64
                source = indexing.LazilyIndexedArray(indexing.NumpyIndexingAdapter(raw))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    var = xr.Variable(("a", "b"), source, dict(attrs))
                    decoded = CFScaleOffsetCoder().decode(CFMaskCoder().decode(var, name="v"), name="v")
                steps = _steps_of(decoded._data, source)
                self.assertIsNotNone(steps)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    want = decoded._data.get_duck_array()  # xarray's functions
                got = _apply_steps(raw, steps)
                same_bits(self, got, want, f"{dtype} {attrs}")
                # Indexed first, then decoded (what a lazy read does).
                same_bits(self, _apply_steps(raw[3:17:2, 29:1:-3], steps), want[3:17:2, 29:1:-3], "subset")
                same_bits(self, _apply_steps(raw[5, 6], steps), want[5, 6], "one element")
                if "_FillValue" in attrs or "missing_value" in attrs:
                    masked = np.isnan(want).sum() - (np.isnan(raw).sum() if dtype.kind == "f" else 0)
                    if attrs.get("_FillValue") == 0.1 and type(attrs["_FillValue"]) is float:
                        self.assertEqual(masked, 0)  # float32 0.1 is not float64 0.1
                    else:
                        self.assertGreater(masked, 0)

    def test_big_endian_v2_arrays(self):
        import warnings

        import xarray as xr

        path = os.path.join(self.dir.name, "big_endian.zarr")
        g = zarr.open_group(path, mode="w", zarr_format=2)
        rng = np.random.default_rng(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            packed = g.create_array("packed", shape=(7, 9), chunks=(3, 4), dtype=">i2", fill_value=-32767,
                                    attributes={"_ARRAY_DIMENSIONS": ["y", "x"], "scale_factor": 0.5,
                                                "add_offset": 1.0})
            floats = g.create_array("floats", shape=(7, 9), chunks=(3, 4), dtype=">f4", fill_value=-9.0,
                                    attributes={"_ARRAY_DIMENSIONS": ["y", "x"]})
        packed[:] = rng.integers(-32767, 32767, (7, 9)).astype(">i2")
        packed[0, :3] = -32767
        floats[:] = rng.standard_normal((7, 9)).astype(">f4")
        floats[2, 2:5] = -9.0
        with self.host():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = xr.open_dataset(path, engine="zarr").load()
            got = xr.open_dataset(path, engine=self.engine)
            for name in ("packed", "floats"):
                data = mask_scale_array(got[name].variable._data)
                self.assertIsNotNone(data, name)
                # Native throughout (CuPy has no other byte order), and no EndianCoder after it.
                self.assertIs(got[name].variable._data.array.array, data, name)
                self.assertTrue(all(step[-1].isnative for step in data.steps), name)
                self.assertEqual(got[name].encoding["dtype"], want[name].encoding["dtype"], name)
                self.assertEqual(got[name].encoding["dtype"].str, want[name].encoding["dtype"].str, name)
                same_bits(self, got[name].values, want[name].values, name)
            self.assertEqual(int(np.isnan(want["floats"].values).sum()), 3)
            self.assertEqual(int(np.isnan(want["packed"].values).sum()), 3)

    def test_a_variable_xarray_cannot_decode_fails_as_with_its_zarr_engine(self):
        import warnings

        import xarray as xr

        path = os.path.join(self.dir.name, "conflict.zarr")
        g = zarr.open_group(path, mode="w", zarr_format=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a = g.create_array("v", shape=(4,), chunks=(4,), dtype="int16", dimension_names=["i"])
        a[:] = np.arange(4, dtype="int16")
        # A scale_factor that is a string: xarray's scale coder fails; so must this engine.
        a.attrs.update({"scale_factor": "ten", "_FillValue": 3})
        with self.host():
            with self.assertRaises(Exception) as zarr_engine:
                xr.open_dataset(path, engine="zarr").load()
            lazy = xr.open_dataset(path, engine=self.engine)
            self.assertIsNone(mask_scale_array(lazy["v"].variable._data))  # left to xarray
            with self.assertRaises(type(zarr_engine.exception)) as caught:
                lazy.load()
        self.assertEqual(str(caught.exception), str(zarr_engine.exception))



class HostReadAhead:
    """zarrs_gpu.ReadAhead on the host: reads each key when asked for it, yields (key, array)."""

    def __init__(self, array, keys):
        self.array, self.keys, self.closed = array, list(keys), False

    def __iter__(self):
        return self

    def __next__(self):
        if self.closed or not self.keys:
            raise StopIteration
        key = self.keys.pop(0)
        return key, self.array[key]

    def close(self):
        self.closed = True


class HostPending:
    def __init__(self, array, key):
        self.value = np.asarray(array.z[key])

    def result(self):
        return self.value


class HostCropArray:
    """The reads zarrs_gpu.torch asks of a zarrs_gpu.Array, by zarr-python on the host, each one
    logged: ("get", key), ("ahead", keys, prefetch), ("async", key)."""

    def __init__(self, path, array, device, log, fail_at=None):
        self.z = zarr.open_array(os.path.join(path, array.strip("/")), mode="r")
        self.path, self.device, self.log, self.fail_at, self.aheads = path, device, log, fail_at, []

    def __getitem__(self, key):
        if self.fail_at is not None and key[-1].start == self.fail_at:
            raise RuntimeError("no chunk here")
        self.log.append(("get", key))
        return np.asarray(self.z[key])

    def read_ahead(self, keys, prefetch):
        keys = list(keys)
        self.log.append(("ahead", keys, prefetch))
        self.aheads.append(HostReadAhead(self, keys))
        return self.aheads[-1]

    def read_async(self, key):
        self.log.append(("async", key))
        return HostPending(self, key)

    def read_many(self, keys, stack=False):
        keys = list(keys)
        if self.fail_at is not None and any(key[-1].start == self.fail_at for key in keys):
            raise RuntimeError("no chunk here")
        self.log.append(("many", keys, stack))
        reads = [np.asarray(self.z[key]) for key in keys]
        return np.stack(reads) if stack else reads


class HostTorchBackend:
    """zarrs_gpu.torch.backend for tests without a GPU or torch: zarr-python reads, numpy 'tensors'."""

    def __init__(self, device=3, worker=False, fail_at=None):
        self.device, self.worker, self.fail_at = device, worker, fail_at
        self.log, self.opened, self.arrays = [], [], []

    def current_device(self):
        return self.device

    def open(self, path, array, device):
        self.opened.append((path, array, device))
        self.arrays.append(HostCropArray(path, array, device, self.log, self.fail_at))
        return self.arrays[-1]

    def as_tensor(self, x):
        return np.asarray(x)

    def in_worker(self):
        return self.worker

    def default_collate(self, samples):
        self.log.append(("default_collate", len(samples)))
        if isinstance(samples[0], tuple):
            return tuple(np.stack(column) for column in zip(*samples))
        return np.stack(samples)


class CountingSampler:
    """A sampler whose order depends on its epoch (as DistributedSampler's), counting passes."""

    def __init__(self, n, take):
        self.n, self.take, self.epoch, self.passes = n, take, 0, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        self.passes += 1
        order = np.random.default_rng(self.epoch).permutation(self.n)[: self.take]
        return iter(order.tolist())

    def __len__(self):
        return self.take


class TorchCpuTests(unittest.TestCase):
    """zarrs_gpu.torch without a GPU or torch: the crop plans (random, grid, given starts), and the
    dataset and loader with the backend replaced by zarr-python reads and numpy arrays, against
    zarr-python's crops."""

    @classmethod
    def setUpClass(cls):
        import warnings

        cls.dir = tempfile.TemporaryDirectory()
        root = cls.dir.name
        rng = np.random.default_rng(23)
        # An input with a channel axis, partial edge chunks on every axis, zstd.
        cls.image = rng.standard_normal((2, 37, 41, 29)).astype("float32")
        cls.image_path = os.path.join(root, "image.zarr")
        z = zarr.create_array(store=cls.image_path, shape=cls.image.shape, chunks=(1, 8, 16, 7), dtype="float32",
                              compressors=zc.ZstdCodec(level=1))
        z[...] = cls.image
        # A label of the same grid in a group, another dtype, sharded, a shard never written (fill value).
        cls.group = os.path.join(root, "group.zarr")
        g = zarr.open_group(cls.group, mode="w")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            label = g.create_array("label", shape=(37, 41, 29), chunks=(5, 5, 5), shards=(10, 10, 10), dtype="uint8",
                                   fill_value=255)
        cls.label = rng.integers(0, 5, (37, 41, 29)).astype("uint8")
        cls.label[:10, :10, :10] = 255
        label[10:, :, :] = cls.label[10:]
        label[:10, 10:, :] = cls.label[:10, 10:]
        label[:10, :10, 10:] = cls.label[:10, :10, 10:]
        cls.label_path = os.path.join(cls.group, "label")
        cls.other = os.path.join(root, "other.zarr")
        zarr.create_array(store=cls.other, shape=(37, 40, 29), chunks=(8, 8, 8), dtype="int16")

    @classmethod
    def tearDownClass(cls):
        cls.dir.cleanup()

    def backend(self, **options):
        from unittest import mock

        import zarrs_gpu.torch as zt

        self.host = HostTorchBackend(**options)
        return mock.patch.object(zt, "backend", self.host)

    def crop(self, data, box):
        lead = (slice(None),) * (data.ndim - len(box))
        return data[lead + tuple(slice(a, b) for a, b in box)]

    def test_the_loader_drops_reads_off_the_training_thread(self):
        # Freeing a DLPack-shared read waits for the whole device: never on the training thread.
        # Batches are views of their request's read, which the loader lets go of once it is two
        # requests past it (the caller has dropped those batches by then, as a training loop does).
        import threading

        import zarrs_gpu.torch as zt

        dropped_on = []

        class Owner:
            def __del__(self):
                dropped_on.append(threading.current_thread().name)

        class View:
            """A tensor: slices share their owner, as torch's views share the DLPack capsule."""

            def __init__(self, a, owner):
                self.a, self.owner = a, owner

            def __getitem__(self, key):
                return View(self.a[key], self.owner)

            def __array__(self, dtype=None, copy=None):
                return self.a

        with self.backend():
            self.host.as_tensor = lambda x: View(np.asarray(x), Owner())
            ds = zt.CropDataset(self.label_path, (4, 4, 4), crops=10)
            for prefetch in (0, 1, 2):
                with self.subTest(prefetch=prefetch):
                    dropped_on.clear()
                    got = []
                    for batch in zt.CropLoader(ds, 3, prefetch=prefetch):
                        got.append(np.array(batch))  # a copy: the loop drops the batch itself
                    zt._releaser.drained()
                    requests = -(-4 // max(prefetch, 1))
                    self.assertEqual(dropped_on, ["zarrs_gpu.torch releaser"] * (requests - 1))
                    # The last batch is still the loop's: its read goes with it, where it is dropped.
                    del batch
                    self.assertEqual(dropped_on[-1], threading.current_thread().name)
                    got = np.concatenate(got)
                    for i in range(10):
                        np.testing.assert_array_equal(got[i], self.crop(self.label, ds.plan[i]))

    # ---- crop plans
    def test_random_crops_are_in_bounds_reproducible_and_the_benchmarks_tiles(self):
        from zarrs_gpu.torch import CropPlan

        rng = np.random.default_rng(5)
        for _ in range(200):
            ndim = int(rng.integers(1, 5))
            shape = tuple(int(n) for n in rng.integers(1, 60, ndim))
            crop = tuple(int(rng.integers(1, n + 1)) for n in shape)
            count, seed = int(rng.integers(1, 40)), int(rng.integers(0, 2**63))
            plan = CropPlan(shape, crop, count, seed=seed)
            boxes = list(plan)
            self.assertEqual(len(plan), count)
            for box in boxes:
                self.assertEqual(tuple(b - a for a, b in box), crop)
                self.assertTrue(all(0 <= a and b <= n for (a, b), n in zip(box, shape)), (box, shape))
            # A function of its arguments: made again (another process), the same crops.
            self.assertEqual(boxes, list(CropPlan(list(shape), list(crop), count, seed=seed)))
            self.assertEqual(plan[-1], boxes[-1])
            if math.prod(n - c + 1 for n, c in zip(shape, crop)) > 10**4 and count > 5:
                self.assertNotEqual(boxes, list(CropPlan(shape, crop, count, seed=seed + 1)))
        # Every start of a small range is drawn, the last included.
        starts = {CropPlan((10, 3), (4, 3), 400, seed=1).start(i)[0] for i in range(400)}
        self.assertEqual(starts, set(range(7)))
        # The random tiles benches/bench.rs and benches/tiles.py read for seed 17 (an 8 GiB array).
        plan = CropPlan((512, 2048, 2048), (64, 256, 256), 3, seed=17)
        self.assertEqual([plan.start(i) for i in range(3)], [(225, 701, 588), (100, 30, 146), (14, 1171, 45)])
        # Crop i does not depend on how many crops there are.
        self.assertEqual(list(CropPlan((50, 50), (7, 9), 30, seed=4))[:10], list(CropPlan((50, 50), (7, 9), 10, seed=4)))

    def test_the_grid_covers_the_array_as_stated(self):
        from zarrs_gpu.torch import CropPlan

        rng = np.random.default_rng(6)
        for _ in range(200):
            ndim = int(rng.integers(1, 4))
            shape = tuple(int(n) for n in rng.integers(1, 30, ndim))
            crop = tuple(int(rng.integers(1, n + 1)) for n in shape)
            stride = tuple(int(rng.integers(1, c + 1)) for c in crop)
            for options in ({}, {"stride": stride}):
                plan = CropPlan(shape, crop, "grid", **options)
                boxes = list(plan)
                self.assertEqual(len(boxes), len(set(boxes)))
                self.assertEqual(boxes, sorted(boxes), "C order")
                count = covered(shape, boxes)
                # Every element in some crop, every crop whole and within the array.
                self.assertTrue((count >= 1).all(), (shape, crop, options))
                for box in boxes:
                    self.assertEqual(tuple(b - a for a, b in box), crop)
                    self.assertTrue(all(b <= n for (_, b), n in zip(box, shape)))
                if not options:
                    # The tiling's crops meet only where the last one was shifted back to the edge.
                    want = np.ones(shape, dtype=np.int64)
                    for axis, (n, c) in enumerate(zip(shape, crop)):
                        if n % c:
                            index = [slice(None)] * ndim
                            index[axis] = slice(n - c, n - n % c)
                            want[tuple(index)] *= 2
                    np.testing.assert_array_equal(count, want)
            # edge="drop": whole tiles only, the remainder left out.
            drop = list(CropPlan(shape, crop, edge="drop"))
            self.assertEqual(len(drop), math.prod(n // c for n, c in zip(shape, crop)))
            whole = np.zeros(shape, dtype=np.int64)
            whole[tuple(slice(0, n - n % c) for n, c in zip(shape, crop))] = 1
            np.testing.assert_array_equal(covered(shape, drop), whole)
        # A stride larger than the crop leaves gaps, the last crop still at the edge.
        self.assertEqual(list(CropPlan((10,), (2,), stride=(4,))), [((0, 2),), ((4, 6),), ((8, 10),)])
        self.assertEqual(list(CropPlan((11,), (2,), stride=(4,))), [((0, 2),), ((4, 6),), ((8, 10),), ((9, 11),)])
        self.assertEqual(CropPlan((11,), (2,), stride=(4,), edge="drop")[-1], ((8, 10),))
        self.assertEqual(list(CropPlan((6, 4), (3, 4))), [((0, 3), (0, 4)), ((3, 6), (0, 4))])

    def test_given_starts_and_bad_arguments(self):
        from zarrs_gpu.torch import CropPlan, batches, shuffled

        plan = CropPlan((20, 30), (5, 6), [(0, 0), (15, 24), np.array([3, 4])])
        self.assertEqual(list(plan), [((0, 5), (0, 6)), ((15, 20), (24, 30)), ((3, 8), (4, 10))])
        cases = [
            (((20, 30), (21, 6)), {}, ValueError, "larger than the array's extent (20, 30) on axis 0 (21 > 20)"),
            (((20, 30), (5,)), {}, ValueError, "has 1 axes"),
            (((20, 30), (5, 0)), {}, ValueError, "of 1 or more"),
            (((20, 30), (5, 2.5)), {}, TypeError, "must hold integers"),
            (((20, 30), "56"), {}, TypeError, "sequence of integers"),
            (((20, 30), (5, 6)), {"crops": 0}, ValueError, "1 or more"),
            (((20, 30), (5, 6)), {"crops": -3}, ValueError, "1 or more"),
            (((20, 30), (5, 6)), {"crops": True}, TypeError, "crops must be"),
            (((20, 30), (5, 6)), {"crops": "random"}, ValueError, "crops must be"),
            (((20, 30), (5, 6)), {"crops": 4.0}, TypeError, "crops must be"),
            (((20, 30), (5, 6)), {"crops": 4, "stride": (1, 1)}, ValueError, "stride and edge are for crops='grid'"),
            (((20, 30), (5, 6)), {"edge": "clip"}, ValueError, "edge must be"),
            (((20, 30), (5, 6)), {"stride": (1,)}, ValueError, "stride (1,) has 1 axes"),
            (((20, 30), (5, 6)), {"seed": 1.5}, TypeError, "seed must be an int"),
            (((20, 30), (5, 6)), {"crops": [(16, 0)]}, ValueError, "crops[0]: a crop of (5, 6) at (16, 0)"),
            (((20, 30), (5, 6)), {"crops": [(0, 0), (-1, 0)]}, ValueError, "crops[1]"),
            (((20, 30), (5, 6)), {"crops": [(0, 0, 0)]}, ValueError, "crops[0]"),
            (((20, 30), (5, 6)), {"crops": ["ab"]}, TypeError, "crops[0] must be a start"),
            (((20, 30), (5, 6)), {"crops": []}, ValueError, "empty list"),
        ]
        for args, options, error, text in cases:
            with self.subTest(args=args, options=options):
                with self.assertRaises(error) as caught:
                    CropPlan(*args, **options)
                self.assertIn(text, str(caught.exception))
        with self.assertRaisesRegex(IndexError, "crop 3 is out of range for 3 crops"):
            plan[3]
        with self.assertRaisesRegex(IndexError, "crop -4"):
            plan[-4]
        # Batches as BatchSampler makes them; the shuffled order a permutation fixed by seed + epoch.
        self.assertEqual(batches(list(range(7)), 3), [[0, 1, 2], [3, 4, 5], [6]])
        self.assertEqual(batches(list(range(7)), 3, drop_last=True), [[0, 1, 2], [3, 4, 5]])
        self.assertEqual(batches([], 2), [])
        for bad in (0, -1, True, 2.0):
            with self.assertRaisesRegex(ValueError, "batch_size"):
                batches([1], bad)
        for n in (0, 1, 2, 50):
            self.assertEqual(sorted(shuffled(n, 3, 1)), list(range(n)))
        self.assertEqual(shuffled(50, 3, 1), shuffled(50, 3, 1))
        self.assertEqual(shuffled(50, 3, 1), shuffled(50, 4, 0))
        self.assertNotEqual(shuffled(50, 3, 1), shuffled(50, 3, 2))
        self.assertNotEqual(shuffled(50, 3, 1), list(range(50)))

    # ---- the dataset
    def test_dataset_items_equal_zarr_pythons_crops(self):
        import zarrs_gpu.torch as zt

        with self.backend():
            ds = zt.CropDataset([self.image_path, self.label_path], (9, 10, 11), crops=25, seed=5)
            self.assertEqual(len(ds), 25)
            self.assertEqual((ds.shapes, ds.dtypes), ([(2, 37, 41, 29), (37, 41, 29)], ["float32", "uint8"]))
            self.assertIsNone(ds.device)  # not opened yet
            self.assertEqual(self.host.opened, [])
            for i in list(range(25)) + [-1]:
                x, y = ds[i]
                box = ds.plan[i]
                self.assertEqual(x.shape, (2, 9, 10, 11))
                np.testing.assert_array_equal(x, self.crop(self.image, box))
                np.testing.assert_array_equal(y, self.crop(self.label, box))
            self.assertEqual(ds.device, 3)  # the backend's current device, taken at the first read
            self.assertEqual([d for _, _, d in self.host.opened], [3, 3])  # opened once each
            # Crops that meet the never-written shard read its fill value.
            ds = zt.CropDataset(self.label_path, (6, 6, 6), crops=[(0, 0, 0), (8, 8, 8)])
            first = ds[0]
            self.assertIsInstance(first, np.ndarray)  # one array given: items are not tuples
            self.assertTrue((first == 255).all())
            np.testing.assert_array_equal(ds[1], self.label[8:14, 8:14, 8:14])
            # A grid, zarr-python arrays as the arrays, a device given.
            image = zarr.open_array(self.image_path, mode="r")
            label = zarr.open_group(self.group, mode="r")["label"]
            ds = zt.CropDataset((image, label), (20, 41, 15), device="cuda:1")
            self.assertEqual(len(ds), 2 * 1 * 2)
            seen = np.zeros(self.label.shape, dtype=bool)
            for i in range(len(ds)):
                x, y = ds[i]
                np.testing.assert_array_equal(x, self.crop(self.image, ds.plan[i]))
                np.testing.assert_array_equal(y, self.crop(self.label, ds.plan[i]))
                seen[tuple(slice(a, b) for a, b in ds.plan[i])] = True
            self.assertTrue(seen.all())
            self.assertEqual(self.host.opened[-1], (self.group, "/label", 1))
            # A batch (DataLoader's __getitems__): one request per array, stacked; its items views
            # of it, and collate hands the batch on as read.
            self.host.log.clear()
            items = ds.__getitems__([3, 0, 3])
            self.assertEqual(self.host.log, [("many", [ds.keys(i)[n] for i in (3, 0, 3)], True) for n in (0, 1)])
            for i, (x, y) in zip([3, 0, 3], items):
                np.testing.assert_array_equal(x, self.crop(self.image, ds.plan[i]))
                np.testing.assert_array_equal(y, self.crop(self.label, ds.plan[i]))
            x, y = zt.collate(items)
            self.assertEqual(x.shape, (3, 2, 20, 41, 15))
            self.assertTrue(np.shares_memory(x, items[0][0]), "the batch as read, not a copy")
            np.testing.assert_array_equal(y, np.stack([self.crop(self.label, ds.plan[i]) for i in (3, 0, 3)]))
            self.assertNotIn("default_collate", [entry[0] for entry in self.host.log])
            # Anything else goes to torch's default collate.
            plain = zt.collate([ds[0], ds[1]])
            self.assertEqual(self.host.log[-1], ("default_collate", 2))
            np.testing.assert_array_equal(plain[1], np.stack([self.crop(self.label, ds.plan[i]) for i in (0, 1)]))
            self.assertEqual(ds.__getitems__([]), [])
            with self.assertRaisesRegex(IndexError, "crop 9 is out of range"):
                ds.read_batch([0, 9])

    def test_errors_name_the_arrays_and_crops(self):
        import zarrs_gpu.torch as zt

        with self.assertRaises(ValueError) as caught:
            zt.CropDataset([self.label_path, self.other], (4, 4, 4))
        text = str(caught.exception)
        self.assertIn("arrays[1]", text)
        self.assertIn("other.zarr", text)
        self.assertIn("(37, 40, 29)", text)
        self.assertIn("(37, 41, 29)", text)
        with self.assertRaisesRegex(ValueError, r"on axis 0 \(38 > 37\)"):
            zt.CropDataset([self.image_path, self.label_path], (38, 4, 4))
        with self.assertRaisesRegex(ValueError, "crop_shape .* has 4 axes, arrays\\[1\\]"):
            zt.CropDataset([self.image_path, self.label_path], (2, 4, 4, 4))
        with self.assertRaisesRegex(ValueError, "arrays is empty"):
            zt.CropDataset([], (4,))
        with self.assertRaisesRegex(TypeError, "arrays\\[0\\]: expected a path, a zarrs_gpu.Array or a zarr-python"):
            zt.CropDataset([np.zeros((5, 5))], (4,))
        missing = os.path.join(self.dir.name, "nothing.zarr")
        with self.assertRaises(Exception) as caught:
            zt.CropDataset(missing, (4,))
        self.assertIn("arrays[0]", str(caught.exception))
        self.assertIn("nothing.zarr", str(caught.exception))
        for device, error in (("cpu", ValueError), (-1, ValueError), ("cuda:x", ValueError), (True, TypeError)):
            with self.subTest(device=device), self.assertRaises(error):
                zt.CropDataset(self.label_path, (4, 4, 4), device=device)
        self.assertEqual(zt.CropDataset(self.label_path, (4, 4, 4), device="cuda").device, None)
        # A read that fails names the array and the crop.
        with self.backend(fail_at=8):
            ds = zt.CropDataset([self.image_path, self.label_path], (6, 6, 6), crops=[(0, 0, 0), (1, 2, 8)])
            np.testing.assert_array_equal(ds[0][1], self.label[:6, :6, :6])
            with self.assertRaises(RuntimeError) as caught:
                ds[1]
            text = str(caught.exception)
            for part in ("crop 1 [1:7, 2:8, 8:14]", "arrays[0]", "image.zarr", "no chunk here"):
                self.assertIn(part, text)
        # In a DataLoader worker process: refused, saying what to use, before any read, even
        # with the arrays opened by the parent before it forked.
        with self.backend(worker=True):
            for opened in (False, True):
                ds = zt.CropDataset(self.label_path, (4, 4, 4))
                if opened:
                    self.host.worker = False
                    ds[0]
                    self.host.worker = True
                self.host.log.clear()
                with self.assertRaisesRegex(RuntimeError, "num_workers=0"):
                    ds[1]
                with self.assertRaisesRegex(RuntimeError, "num_workers=0"):
                    ds.__getitems__([1, 2])
                self.assertEqual(self.host.log, [])

    def test_the_dataset_pickles_and_reopens_where_it_is_read(self):
        import pickle

        import zarrs_gpu
        import zarrs_gpu.torch as zt

        with self.backend(device=2):
            ds = zt.CropDataset([self.image_path, self.label_path], (5, 5, 5), crops=7, seed=9)
            ds[0]
            self.assertEqual(ds.device, 2)
            copy = pickle.loads(pickle.dumps(ds))
            # The copy opens its arrays again, on its process's current device.
            self.assertIsNone(copy.device)
            self.assertTrue(all(s.opened is None for s in copy._sources))
            self.assertEqual(copy.plan, ds.plan)
            self.host.device = 5
            np.testing.assert_array_equal(copy[4][0], ds[4][0])
            self.assertEqual(copy.device, 5)
            fixed = pickle.loads(pickle.dumps(zt.CropDataset(self.label_path, (5, 5, 5), device=1)))
            fixed[0]
            self.assertEqual(fixed.device, 1)
        # An open zarrs_gpu.Array is used as it is, but does not pickle.
        ds = zt.CropDataset([zarrs_gpu.open(self.image_path), self.label_path], (5, 5, 5))
        self.assertEqual(ds.shapes[0], (2, 37, 41, 29))
        with self.assertRaisesRegex(TypeError, "give its path instead"):
            pickle.dumps(ds)
        # A given Array's GPU is the dataset's: paths are opened there, and another is an error.
        self.assertEqual(zarrs_gpu.open(self.image_path, device=2).device, 2)
        on_2 = zt.CropDataset([zarrs_gpu.open(self.image_path, device=2), self.label_path], (5, 5, 5))
        self.assertEqual(on_2.device, 2)
        self.assertEqual(zt.CropDataset(zarrs_gpu.open(self.label_path, device=2), (5, 5, 5), device="cuda:2").device, 2)
        with self.assertRaisesRegex(ValueError, r"device=0, but arrays\[0\] .* was opened for GPU 2"):
            zt.CropDataset(zarrs_gpu.open(self.label_path, device=2), (5, 5, 5), device=0)
        with self.assertRaisesRegex(ValueError, r"arrays\[1\] .* reads to GPU 1 and arrays\[0\] .* to GPU 2"):
            zt.CropDataset([zarrs_gpu.open(self.image_path, device=2), zarrs_gpu.open(self.label_path, device=1)],
                           (5, 5, 5))

    # ---- the loader
    def test_loader_batches_equal_zarr_pythons_crops(self):
        import zarrs_gpu.torch as zt

        with self.backend():
            ds = zt.CropDataset([self.image_path, self.label_path], (7, 8, 9), crops=23, seed=2)
            order = [5, 0, 22, 7, 7, 13, 1, 9, 2, 20]
            for prefetch in (0, 1, 2, 5):
                for drop_last in (False, True):
                    with self.subTest(prefetch=prefetch, drop_last=drop_last):
                        loader = zt.CropLoader(ds, 4, sampler=order, prefetch=prefetch, drop_last=drop_last,
                                               return_indices=True)
                        self.assertEqual(len(loader), 2 if drop_last else 3)
                        self.host.log.clear()
                        got = list(loader)
                        want = zt.batches(order, 4, drop_last)
                        self.assertEqual([indices for indices, _ in got], want)
                        for indices, (x, y) in got:
                            self.assertEqual(x.shape, (len(indices), 2, 7, 8, 9))
                            np.testing.assert_array_equal(x, np.stack([self.crop(self.image, ds.plan[i]) for i in indices]))
                            np.testing.assert_array_equal(y, np.stack([self.crop(self.label, ds.plan[i]) for i in indices]))
                        # One request per array for every `prefetch` batches (one each without).
                        span = max(prefetch, 1)
                        requests = [want[k:k + span] for k in range(0, len(want), span)]
                        expected = [("many", [ds.keys(i)[n] for g in r for i in g], True)
                                    for r in requests for n in (0, 1)]
                        self.assertEqual(self.host.log, expected)
            # One array: batches are arrays, not tuples.
            single = zt.CropDataset(self.label_path, (3, 4, 5), crops=6, seed=1)
            batches_of = list(zt.CropLoader(single, 4))
            self.assertEqual([b.shape for b in batches_of], [(4, 3, 4, 5), (2, 3, 4, 5)])
            np.testing.assert_array_equal(np.concatenate(batches_of), np.stack([self.crop(self.label, b) for b in single.plan]))

    def test_loader_orders_each_pass_from_the_sampler_or_the_epoch(self):
        import zarrs_gpu.torch as zt

        with self.backend():
            ds = zt.CropDataset(self.label_path, (4, 4, 4), crops=30, seed=1)
            sampler = CountingSampler(30, 12)
            loader = zt.CropLoader(ds, 5, sampler=sampler, return_indices=True)
            for epoch in range(3):
                loader.set_epoch(epoch)
                self.assertEqual(sampler.epoch, epoch)
                got = [i for indices, _ in loader for i in indices]
                self.assertEqual(got, list(sampler))
                self.assertEqual(got, np.random.default_rng(epoch).permutation(30)[:12].tolist())
            self.assertEqual(sampler.passes, 3 + 3)  # the loader iterated it afresh on every pass
            # Without a sampler: in order, or shuffled by seed and epoch.
            plain = zt.CropLoader(ds, 7, return_indices=True)
            self.assertEqual([i for indices, _ in plain for i in indices], list(range(30)))
            shuffled = zt.CropLoader(ds, 7, shuffle=True, seed=4, return_indices=True)
            first = [i for indices, _ in shuffled for i in indices]
            self.assertEqual(first, zt.shuffled(30, 4, 0))
            self.assertEqual(first, [i for indices, _ in shuffled for i in indices])
            shuffled.set_epoch(1)
            self.assertEqual([i for indices, _ in shuffled for i in indices], zt.shuffled(30, 4, 1))
            # Left early: the pass reads nothing more; the batches taken stay as they were.
            it = iter(zt.CropLoader(ds, 2, prefetch=3))
            taken = next(it)
            it.close()
            self.host.log.clear()
            self.assertEqual(list(it), [])
            self.assertEqual(self.host.log, [])
            np.testing.assert_array_equal(taken, np.stack([self.crop(self.label, ds.plan[i]) for i in (0, 1)]))

    def test_loader_refuses_bad_arguments_at_once(self):
        import zarrs_gpu.torch as zt

        with self.backend():
            ds = zt.CropDataset(self.label_path, (4, 4, 4), crops=10)
            cases = [
                ((ds, 0), {}, ValueError, "batch_size"),
                ((ds, 2), {"prefetch": -1}, ValueError, "prefetch"),
                ((ds, 2), {"prefetch": 1.5}, ValueError, "prefetch"),
                ((ds, 2), {"sampler": [1], "shuffle": True}, ValueError, "exclude each other"),
                ((ds, 2), {"sampler": 3}, TypeError, "iterable of dataset indices"),
                ((ds, 2), {"sampler": iter([1, 2])}, TypeError, "afresh on every pass"),
                ((ds, 2), {"sampler": (i for i in range(3))}, TypeError, "afresh on every pass"),
                (([1, 2], 2), {}, TypeError, "CropDataset"),
            ]
            for args, options, error, text in cases:
                with self.subTest(options=options), self.assertRaisesRegex(error, text):
                    zt.CropLoader(*args, **options)
            with self.assertRaisesRegex(IndexError, "item 2 is 10, out of range for a dataset of 10 crops"):
                iter(zt.CropLoader(ds, 2, sampler=[0, 1, 10]))
            with self.assertRaisesRegex(TypeError, "item 0 is 'a'"):
                iter(zt.CropLoader(ds, 2, sampler=["a"]))
            self.assertEqual(self.host.log, [], "nothing read for a bad sampler")

    def test_the_package_imports_without_torch(self):
        code = ("import sys; sys.modules['torch'] = None\n"
                "import zarrs_gpu, zarrs_gpu.torch as zt\n"
                f"ds = zt.CropDataset({self.label_path!r}, (4, 4, 4), crops=3)\n"
                "print(len(ds), ds.plan[0])\n"
                "try:\n"
                "    ds[0]\n"
                "except ImportError as e:\n"
                "    print('ImportError', e)\n")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ImportError", run.stdout)
        self.assertTrue(run.stdout.startswith("3 ("), run.stdout)



try:
    import distributed  # noqa: F401

    HAVE_DISTRIBUTED = True
except ImportError:
    HAVE_DISTRIBUTED = False

#: In a worker process of DistributedCpuTests: (box, device) of every read there.
_WORKER_READS = []


def _recording_host_reader(path, array, device, box):
    _WORKER_READS.append((box, device))
    return host_reader(path, array, device, box)


def _worker_reads(dask_worker):
    """Run on a worker: its CUDA_VISIBLE_DEVICES, its process id, whether zarrs_gpu.dask's preload
    ran, and the reads since the last call."""
    import zarrs_gpu._cluster as cluster

    reads = list(_WORKER_READS)
    _WORKER_READS.clear()
    return {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid(), "reads": reads,
            "reader_threads": os.environ.get("ZARRS_GDS_NTHREADS"),
            "preloaded": cluster._serialization_ready, "fetched": dask_worker.state.transfer_incoming_count_total}


if HAVE_DISTRIBUTED:
    from distributed.diagnostics.plugin import WorkerPlugin

    class HostReads(WorkerPlugin):
        """zarrs_gpu.dask's reader replaced by zarr-python on the host in every worker, those that
        a restart starts too (distributed runs a registered plugin's setup on each)."""

        name = "zarrs-gpu-host-reads"

        def setup(self, worker):
            import zarrs_gpu.dask as zd

            zd.reader = _recording_host_reader


@unittest.skipUnless(HAVE_DASK and HAVE_DISTRIBUTED, "dask[array] and distributed are not installed")
class DistributedCpuTests(unittest.TestCase):
    """zarrs_gpu.dask on distributed without a GPU: local_cluster's worker processes (two, one
    thread each, each with its own CUDA_VISIBLE_DEVICES), the reads replaced by zarr-python's
    on the host in every worker; reductions against dask.array.from_zarr."""

    @classmethod
    def setUpClass(cls):
        import warnings

        from distributed import Client

        import zarrs_gpu.dask as zd

        cls.dir = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(1919)
        cls.arrays = {}

        def make(name, data, **options):
            path = os.path.join(cls.dir.name, name + ".zarr")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                z = zarr.create_array(store=path, shape=data.shape, dtype=data.dtype, **options)
                z[...] = data
            cls.arrays[name] = (path, data)

        make("v3_zstd_f8", rng.standard_normal((29, 17, 6)) * 100, chunks=(4, 5, 6), compressors=zc.ZstdCodec(level=1))
        sharded = rng.integers(-30000, 30000, (41, 33)).astype("int16")
        sharded[32:, 30:] = 0  # a shard never written: the fill value
        path = os.path.join(cls.dir.name, "v3_sharded_i2.zarr")
        z = zarr.create_array(store=path, shape=sharded.shape, dtype="int16", chunks=(4, 3), shards=(8, 6))
        z[:32] = sharded[:32]
        z[32:, :30] = sharded[32:, :30]
        cls.arrays["v3_sharded_i2"] = (path, sharded)
        make("v2_u2", rng.integers(0, 65535, (23, 19)).astype("uint16"), chunks=(3, 4), zarr_format=2)
        cls.devices = zd.worker_devices(devices=[0, 1])
        cls.cluster = zd.local_cluster(devices=[0, 1], dask_cuda=False, threads_per_worker=1,
                                       dashboard_address=None, memory_limit="1GiB")
        cls.client = Client(cls.cluster, set_as_default=False)
        cls.client.wait_for_workers(2, timeout=60)
        cls.client.register_plugin(HostReads())

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()
        cls.dir.cleanup()

    def worker_state(self):
        return list(self.client.run(_worker_reads).values())

    def from_zarr(self, path, **options):
        """zarrs_gpu.dask.from_zarr with numpy meta (built here, in the client)."""
        from unittest import mock

        import zarrs_gpu.dask as zd

        with mock.patch.object(zd, "make_meta", host_meta):
            return zd.from_zarr(path, **options)

    def test_the_workers_are_processes_each_with_its_gpu(self):
        import zarrs_gpu._cluster as cluster

        self.assertIsInstance(self.cluster, cluster._local_gpu_cluster_class())
        state = self.worker_state()
        self.assertEqual(len(state), 2)
        self.assertEqual(sorted(s["gpu"] for s in state), sorted(self.devices))
        self.assertEqual(len({s["pid"] for s in state} | {os.getpid()}), 3)
        self.assertTrue(all(s["preloaded"] for s in state), state)
        self.assertEqual({w["nthreads"] for w in self.client.scheduler_info()["workers"].values()}, {1})
        # Each worker's zarrs_gpu reader gets its share of this host's cores, not all of them.
        share = os.environ.get("ZARRS_GDS_NTHREADS") or str(max(1, cluster._cores() // 2))
        self.assertEqual({s["reader_threads"] for s in state}, {share})

    def test_reductions_equal_dask_from_zarr_and_both_workers_read(self):
        import dask.array as da

        for name, (path, data) in self.arrays.items():
            with self.subTest(array=name):
                z = zarr.open_array(path, mode="r")
                unit = z.shards or z.chunks
                x = self.from_zarr(path, block_bytes=data.dtype.itemsize * math.prod(unit) * 2)
                self.assertGreaterEqual(x.npartitions, 8)
                host = da.from_zarr(z)
                self.worker_state()  # forget earlier reads
                # One graph: every block read once, its partial results sent on to be combined.
                got = self.client.compute([x.mean(), x.max(), x.sum(), x.min(axis=0)], sync=True)
                want = [r.compute(scheduler="threads") for r in (host.mean(), host.max(), host.sum(), host.min(axis=0))]
                np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
                self.assertEqual(got[1], want[1])
                np.testing.assert_array_equal(got[3], want[3])
                if data.dtype.kind == "f":  # sums of blocks added in another order
                    np.testing.assert_allclose(got[2], want[2], rtol=1e-12)
                else:
                    self.assertEqual(got[2], want[2])
                    self.assertEqual(got[2], data.sum())
                state = self.worker_state()
                for s in state:
                    self.assertTrue(s["reads"], f"worker on {s['gpu']} read nothing: {state}")
                    self.assertEqual({device for _, device in s["reads"]}, {None})  # the worker's own GPU
                boxes = [box for s in state for box, _ in s["reads"]]
                self.assertEqual(len(boxes), x.npartitions)
                np.testing.assert_array_equal(covered(data.shape, boxes), np.ones(data.shape, np.int64))
                whole = self.client.compute(x, sync=True)
                np.testing.assert_array_equal(whole, data)
        # The partial results of the reductions went from worker to worker.
        self.assertGreater(sum(s["fetched"] for s in self.worker_state()), 0)

    def test_a_histogram_equals_dask_on_the_host(self):
        import dask.array as da

        path, data = self.arrays["v3_zstd_f8"]
        x = self.from_zarr(path, block_bytes=8 * 4 * 5 * 6 * 3)
        counts, edges = da.histogram(x, bins=16, range=(-250, 250))
        want_counts, want_edges = da.histogram(da.from_zarr(zarr.open_array(path, mode="r")), bins=16, range=(-250, 250))
        got = self.client.compute(counts, sync=True)
        np.testing.assert_array_equal(got, want_counts.compute(scheduler="threads"))
        np.testing.assert_array_equal(got, np.histogram(data, bins=16, range=(-250, 250))[0])
        self.assertGreater(got.sum(), data.size // 2)

    def test_after_a_restart_the_workers_keep_their_gpus(self):
        path, data = self.arrays["v2_u2"]
        before = {s["pid"] for s in self.worker_state()}
        self.client.restart(wait_for_workers=True)
        self.client.wait_for_workers(2, timeout=60)
        state = self.worker_state()
        self.assertTrue(before.isdisjoint(s["pid"] for s in state))  # new processes
        self.assertEqual(sorted(s["gpu"] for s in state), sorted(self.devices))
        self.assertTrue(all(s["preloaded"] for s in state), state)
        x = self.from_zarr(path, block_bytes=2 * 3 * 4 * 4)
        self.assertEqual(self.client.compute(x.max(), sync=True), data.max())
        self.assertEqual(sum(len(s["reads"]) for s in self.worker_state()), x.npartitions)

    def test_worker_devices(self):
        from zarrs_gpu.dask import worker_devices

        self.assertEqual(worker_devices(devices=[0, 1], environ={}), ["0", "1"])
        self.assertEqual(worker_devices(devices=[0, 0, 1], environ={}), ["0", "0", "1"])
        # Ordinals as this process sees them: through its own CUDA_VISIBLE_DEVICES.
        env = {"CUDA_VISIBLE_DEVICES": "2, 3"}
        self.assertEqual(worker_devices(devices=[1, 0], environ=env), ["3", "2"])
        self.assertEqual(worker_devices(environ=env), ["2", "3"])
        self.assertEqual(worker_devices(1, environ=env), ["2"])
        self.assertEqual(worker_devices(devices=["GPU-5e1c", 0], environ=env), ["GPU-5e1c", "2"])
        uuids = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}
        self.assertEqual(worker_devices(devices=[1], environ=uuids), ["GPU-bb"])
        for args, error, text in [
            (dict(devices=[2], environ=env), ValueError, "sees CUDA_VISIBLE_DEVICES='2, 3'"),
            (dict(n_workers=3, environ=env), ValueError, "n_workers=3 but 2 GPU(s) are visible"),
            (dict(n_workers=2, devices=[0], environ={}), ValueError, "n_workers=2 but 1 devices"),
            (dict(n_workers=0, environ=env), ValueError, "n_workers must be 1 or more"),
            (dict(devices=[-1], environ={}), ValueError, "negative"),
            (dict(devices=["0,1"], environ={}), ValueError, "not one CUDA_VISIBLE_DEVICES entry"),
            (dict(devices=[], environ={}), ValueError, "empty"),
            (dict(devices=0, environ={}), TypeError, "a sequence"),
            (dict(devices=[True], environ={}), TypeError, "CUDA ordinal"),
            (dict(devices=[1.0], environ={}), TypeError, "CUDA ordinal"),
            (dict(environ={"CUDA_VISIBLE_DEVICES": ""}), RuntimeError, "no GPU is visible"),
        ]:
            with self.subTest(**{k: v for k, v in args.items() if k != "environ"}):
                with self.assertRaises(error) as caught:
                    worker_devices(**args)
                self.assertIn(text, str(caught.exception))

    def test_local_cluster_refusals_and_dask_cuda(self):
        from unittest import mock

        import zarrs_gpu.dask as zd

        with self.assertRaises(ValueError) as caught:
            zd.local_cluster(devices=[0], dask_cuda=False, processes=False)
        self.assertIn("processes=False", str(caught.exception))
        with mock.patch.dict(os.environ, {"CUDA_VISIBLE_DEVICES": ""}), self.assertRaises(RuntimeError):
            zd.local_cluster()
        with self.assertRaises(ValueError):
            zd.local_cluster(devices=[0], threads_per_worker=0)
        with self.assertRaises(ValueError) as caught:
            zd.local_cluster(devices=[0], reader_threads=-1)
        self.assertIn("reader_threads", str(caught.exception))
        # Where dask_cuda imports, its LocalCUDACluster gets the GPUs (a stand-in records the call).
        import types

        calls = []
        fake = types.ModuleType("dask_cuda")
        fake.LocalCUDACluster = lambda **kwargs: calls.append(kwargs) or "dask-cuda cluster"
        with mock.patch.dict(sys.modules, {"dask_cuda": fake}):
            self.assertEqual(zd.local_cluster(devices=[1, 0], memory_limit="2GiB"), "dask-cuda cluster")
            self.assertEqual(calls, [dict(n_workers=2, CUDA_VISIBLE_DEVICES=["1", "0"], threads_per_worker=4,
                                          memory_limit="2GiB")])
            with self.assertRaises(ValueError) as caught:  # dask-cuda cannot share a GPU
                zd.local_cluster(devices=[0, 0], dask_cuda=True)
            self.assertIn("repeat", str(caught.exception))
        with mock.patch.dict(sys.modules, {"dask_cuda": None}), self.assertRaises(ImportError) as caught:
            zd.local_cluster(devices=[0], dask_cuda=True)
        self.assertIn("needs dask-cuda", str(caught.exception))

    def test_cupy_arrays_are_pickled_where_distributeds_serializer_cannot_load(self):
        # A stand-in CuPy, and no rmm or numba (what distributed's CuPy serializer imports).
        code = ("import sys, types, numpy as np\n"
                "cupy = types.ModuleType('cupy'); cupy.__version__ = '13.0.0'\n"
                "class ndarray:\n"
                "    def __init__(self, a): self.a = np.asarray(a)\n"
                "ndarray.__module__ = 'cupy'; cupy.ndarray = ndarray\n"
                "sys.modules.update(cupy=cupy, rmm=None, numba=None)\n"
                "from distributed.protocol.serialize import serialize, deserialize\n"
                "import zarrs_gpu.dask as zd\n"
                "if sys.argv[1] == 'register':\n"
                "    print(zd.register_cupy_serialization())\n"
                "header, frames = serialize(ndarray([1, 2, 3]), serializers=('dask', 'pickle'), on_error='raise')\n"
                "print(header['serializer'], deserialize(header, frames).a.tolist())\n")
        without = subprocess.run([sys.executable, "-c", code, "no"], capture_output=True, text=True)
        self.assertNotEqual(without.returncode, 0)  # the failure this guards against
        self.assertIn("Could not serialize object of type ndarray", without.stderr)
        registered = subprocess.run([sys.executable, "-c", code, "register"], capture_output=True, text=True)
        self.assertEqual(registered.returncode, 0, registered.stderr)
        self.assertEqual(registered.stdout.split("\n")[:2], ["pickle", "pickle [1, 2, 3]"])
        # Without CuPy there is nothing to do.
        plain = subprocess.run([sys.executable, "-c", "import sys; sys.modules['cupy'] = None\n"
                                "import zarrs_gpu.dask as zd; print(zd.register_cupy_serialization())"],
                               capture_output=True, text=True)
        self.assertEqual(plain.stdout.strip(), "no cupy", plain.stderr)


class MissingNodeTests(unittest.TestCase):
    """A node that is not there: zarrs_gpu.ArrayNotFoundError, a FileNotFoundError (what zarr-python's
    own ArrayNotFoundError is too) and a ValueError (what zarrs_gpu raised before), naming what is
    there. It said only "array metadata is missing", as a plain ValueError."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def image(self, version):
        path = os.path.join(self.dir.name, f"image{version}.zarr")
        group = zarr.open_group(path, mode="w", zarr_format=3)
        multiscales = [{"name": "cells", "datasets": [{"path": "s0"}, {"path": "s1"}]}]
        if version == "0.5":
            group.attrs["ome"] = {"version": "0.5", "multiscales": multiscales}
        else:
            group.attrs["multiscales"] = multiscales
        for name, n in (("s0", 8), ("s1", 4)):
            group.create_array(name, shape=(n, n), chunks=(4, 4), dtype="uint8")
        return path

    def test_a_missing_node_raises_array_not_found_naming_the_levels(self):
        for version in ("0.4", "0.5"):
            path = self.image(version)
            with self.assertRaises(zarrs_gpu.ArrayNotFoundError) as caught:
                zarrs_gpu.open(path, "/0")
            err = caught.exception
            self.assertIsInstance(err, FileNotFoundError)
            self.assertIsInstance(err, ValueError)
            self.assertIs(zarrs_gpu.ArrayNotFoundError, zarrs_gpu.errors.ArrayNotFoundError)
            message = str(err)
            self.assertIn('no array or group at "/0"', message)
            self.assertIn("its arrays: /s0, /s1; OME-Zarr multiscale levels: /s0, /s1", message)
            self.assertIn("(pick one with array=...)", message)
            self.assertNotIn("metadata is missing", message)
            # read() opens the same way.
            with self.assertRaises(zarrs_gpu.ArrayNotFoundError):
                zarrs_gpu.read(path, "s0/x")
            # zarr-python's own error for the same node is caught by the same except clause.
            for opener in (lambda: zarr.open_array(path, path="0", mode="r"), lambda: zarrs_gpu.open(path, "0")):
                with self.assertRaises(FileNotFoundError):
                    opener()

    def test_a_group_and_a_missing_store_keep_their_classes(self):
        path = self.image("0.4")
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.open(path)
        self.assertNotIsInstance(caught.exception, zarrs_gpu.ArrayNotFoundError)
        self.assertIn("is a group, not an array; its arrays: /s0, /s1", str(caught.exception))
        with self.assertRaises(FileNotFoundError) as caught:
            zarrs_gpu.open(os.path.join(self.dir.name, "absent.zarr"))
        self.assertNotIsInstance(caught.exception, zarrs_gpu.ArrayNotFoundError)


class S3ServerHarnessTests(unittest.TestCase):
    """The S3 tests' server: a missing s3s-fs is a skip saying why (an error where
    ZARRS_GPU_REQUIRE_S3=1, as CI sets it), and a server that does not start leaves no directory."""

    def setUp(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import s3_server

        self.s3_server = s3_server

    def leftover_dirs(self):
        return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("zarrs_gpu_s3_")}

    def test_a_missing_server_skips_unless_required(self):
        s3_server = self.s3_server
        found, required = s3_server.find_program, os.environ.pop(s3_server.REQUIRE, None)
        s3_server.find_program = lambda: None
        try:
            before = self.leftover_dirs()
            with self.assertRaises(unittest.SkipTest) as caught:
                s3_server.start_or_skip()
            self.assertIn("s3s-fs not found", str(caught.exception))
            self.assertIn("cargo install s3s-fs@0.14.1", str(caught.exception))
            self.assertIn("ZARRS_GPU_REQUIRE_S3=1 makes this an error", str(caught.exception))
            os.environ[s3_server.REQUIRE] = "1"
            with self.assertRaises(FileNotFoundError) as caught:
                s3_server.start_or_skip()
            self.assertIn("ZARRS_GPU_REQUIRE_S3=1 requires the S3 tests", str(caught.exception))
            with self.assertRaises(FileNotFoundError):
                s3_server.S3Server()
            self.assertEqual(self.leftover_dirs(), before)
        finally:
            s3_server.find_program = found
            os.environ.pop(s3_server.REQUIRE, None)
            if required is not None:
                os.environ[s3_server.REQUIRE] = required

    def test_a_server_that_exits_leaves_no_directory(self):
        import shutil

        before = self.leftover_dirs()
        with self.assertRaisesRegex(RuntimeError, "did not listen"):
            self.s3_server.S3Server(shutil.which("false"))
        self.assertEqual(self.leftover_dirs(), before)
        with self.assertRaises(OSError):
            self.s3_server.S3Server(os.path.join(tempfile.gettempdir(), "no-such-s3s-fs-program"))
        self.assertEqual(self.leftover_dirs(), before)


class RemoteCpuTests(unittest.TestCase):
    """Arrays in an S3 bucket (s3s-fs on loopback), written by zarr-python through obstore: opened
    by URL with zarr-python's storage_options, described as zarr-python describes them, numpy
    writes through S3 read back by zarr-python, and errors that name the chunk and never a
    secret."""

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import s3_server

        # Skipped, saying why, where s3s-fs is missing, unless ZARRS_GPU_REQUIRE_S3=1.
        cls.server = s3_server.start_or_skip()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def test_s3_arrays_open_by_url_and_numpy_writes_land(self):
        server = self.server
        rng = np.random.default_rng(5)
        cases = {
            "plain.zarr": dict(shape=(30, 41), chunks=(8, 16), dtype="float32", fill_value=1.5),
            "sharded.zarr": dict(shape=(33, 20), chunks=(4, 5), shards=(8, 10), dtype="uint16",
                                 compressors=zc.ZstdCodec(level=3)),
        }
        for name, kwargs in cases.items():
            with self.subTest(name=name):
                z = zarr.create_array(server.zarr_store(name), **kwargs)
                values = rng.integers(0, 1000, kwargs["shape"]).astype(kwargs["dtype"])
                z[...] = values
                a = zarrs_gpu.open(server.url(name), storage_options=server.storage_options(), mode="r+")
                self.assertEqual((a.shape, a.dtype, a.chunks), (z.shape, z.dtype, z.chunks))
                self.assertEqual(a.fill_value, z.fill_value)
                self.assertIn("s3://volumes/", repr(a))
                self.assertNotIn(server.storage_options()["secret"], repr(a))
                # Reads need a GPU; writes from numpy go through zarrs and the S3 store.
                with self.assertRaisesRegex(RuntimeError, "GPU|CUDA|device"):
                    a[0:2, 0:2]
                update = rng.integers(0, 1000, (7, 9)).astype(kwargs["dtype"])
                a.write((slice(3, 10), slice(2, 11)), update)
                values[3:10, 2:11] = update
                back = zarr.open_array(server.zarr_store(name, read_only=True), mode="r")[...]
                np.testing.assert_array_equal(back, values)
        # object_store's own option names work too, and the AWS environment is read.
        options = {"aws_endpoint": server.endpoint, "aws_access_key_id": "zarrs-gpu-test",
                   "aws_secret_access_key": server.storage_options()["secret"], "aws_region": "us-east-1",
                   "allow_http": "true"}
        self.assertEqual(zarrs_gpu.open(server.url("plain.zarr"), storage_options=options).shape, (30, 41))

    def test_zarr_python_object_stores_are_named_for_zarrs_gpu(self):
        import datetime

        import obstore.store as obs
        import zarr.storage

        from zarrs_gpu._arrays import RemoteLocation, zarr_python_root
        from zarrs_gpu.pipeline import zarrs_array_of

        server = self.server
        rng = np.random.default_rng(12)
        # zarr-python's own S3 path (obstore), as a user opens it: the same array by URL, with the
        # store's configuration, client and retry options as storage_options.
        kwargs = dict(shape=(21, 34), chunks=(8, 8), dtype="int16", compressors=zc.ZstdCodec(level=1))
        z = zarr.create_array(server.zarr_store("objectstore.zarr"), **kwargs)
        values = rng.integers(-500, 500, kwargs["shape"]).astype("int16")
        z[...] = values
        a = zarrs_array_of(zarr.open_array(server.zarr_store("objectstore.zarr", read_only=True), mode="r"))
        self.assertEqual((a.shape, a.dtype, a.chunks, a.fill_value), (z.shape, z.dtype, z.chunks, z.fill_value))
        self.assertIn("s3://volumes/objectstore.zarr", repr(a))
        with self.assertRaisesRegex(RuntimeError, "GPU|CUDA|device"):
            a[0:2, 0:2]
        # Its writes land where zarr-python reads (the pipeline's writes take this array).
        update = rng.integers(-500, 500, (5, 6)).astype("int16")
        a.write((slice(16, 21), slice(28, 34)), update)
        values[16:21, 28:34] = update
        np.testing.assert_array_equal(zarr.open_array(server.zarr_store("objectstore.zarr"), mode="r")[...], values)

        s3 = obs.S3Store("volumes", prefix="deep/v.zarr", endpoint=server.endpoint, access_key_id="AK",
                         secret_access_key="SK", region="eu-west-1", virtual_hosted_style_request=False,
                         client_options={"allow_http": True, "timeout": "30s"},
                         retry_config={"max_retries": 4, "retry_timeout": datetime.timedelta(seconds=90),
                                       "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                                                   "max_backoff": datetime.timedelta(seconds=15),
                                                   "base": 2}})
        root = zarr_python_root(zarr.storage.ObjectStore(s3))
        self.assertIsInstance(root, RemoteLocation)
        self.assertEqual(root.url, "s3://volumes/deep/v.zarr")
        options = root.storage_options
        self.assertEqual({k: options[k] for k in ("endpoint", "access_key_id", "secret_access_key", "region",
                                                    "allow_http", "timeout", "max_retries", "retry_timeout",
                                                    "profile_files")},
                         {"endpoint": server.endpoint, "access_key_id": "AK", "secret_access_key": "SK",
                          "region": "eu-west-1", "allow_http": "true", "timeout": "30s", "max_retries": "4",
                          "retry_timeout": "90.0", "profile_files": "false"})
        self.assertNotIn("bucket", options)
        self.assertNotIn("SK", repr(root))
        # obstore reads no AWS shared file: neither does zarrs_gpu for its stores (a profile's
        # endpoint or keys would send the requests elsewhere), where a URL of the user's would.
        from unittest import mock

        from zarrs_gpu._zarrs_gpu import _object_store_options

        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "credentials"), "w") as f:
                f.write("[default]\naws_access_key_id = AKPROFILE\naws_secret_access_key = secret-profile\n")
            with open(os.path.join(d, "config"), "w") as f:
                f.write("[default]\nregion = ap-south-1\nendpoint_url = https://elsewhere.invalid:9000\n")
            files = {"AWS_SHARED_CREDENTIALS_FILE": os.path.join(d, "credentials"),
                     "AWS_CONFIG_FILE": os.path.join(d, "config")}
            bare = zarr_python_root(zarr.storage.ObjectStore(obs.S3Store("volumes", prefix="v.zarr",
                                                                         region="us-east-1")))
            with mock.patch.dict(os.environ, files):
                got = dict(_object_store_options(bare.url, bare.storage_options))
                self.assertEqual(got, {"region": "us-east-1"}, "nothing from the profile")
                by_url = dict(_object_store_options("s3://volumes/v.zarr", {}))
                self.assertEqual(by_url.get("aws_endpoint"), "https://elsewhere.invalid:9000", "a URL reads it")
        # A prefix is a path, not URL text; obstore settings it cannot report, a relative local
        # prefix: zarr-python's.
        odd = zarr_python_root(zarr.storage.ObjectStore(obs.S3Store("volumes", prefix="run#3/a?b%41.zarr",
                                                                    region="us-east-1")))
        self.assertEqual(odd.url, "s3://volumes/run%233/a%3Fb%2541.zarr")
        self.assertEqual(zarr_python_root(zarr.storage.ObjectStore(obs.S3Store(
            "volumes", region="us-east-1", request_payer=True))).storage_options["request_payer"], "true")
        self.assertIsNone(zarr_python_root(zarr.storage.ObjectStore(obs.S3Store(
            "volumes", region="us-east-1", config={"allow_http": "true"}))))
        self.assertIsNone(zarr_python_root(zarr.storage.ObjectStore(obs.LocalStore("relative-dir", mkdir=True))))
        os.rmdir("relative-dir")
        # A bucket's root, HTTP, a local directory; and what zarrs_gpu cannot stand in for.
        self.assertEqual(zarr_python_root(zarr.storage.ObjectStore(obs.S3Store("volumes", region="us-east-1"))).url,
                         "s3://volumes")
        http = zarr_python_root(zarr.storage.ObjectStore(obs.HTTPStore.from_url(
            "http://127.0.0.1:1/data/v.zarr", client_options={"allow_http": True})))
        self.assertEqual((http.url, http.storage_options), ("http://127.0.0.1:1/data/v.zarr", {"allow_http": "true"}))
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(zarr_python_root(zarr.storage.ObjectStore(obs.LocalStore(d))), str(obs.LocalStore(d).prefix))
            self.assertEqual(zarr_python_root(zarr.storage.LocalStore(d)), d)
        self.assertIsNone(zarr_python_root(zarr.storage.ObjectStore(obs.MemoryStore())))
        self.assertIsNone(zarr_python_root(zarr.storage.MemoryStore()))
        provided = obs.S3Store("volumes", region="us-east-1", credential_provider=lambda: {
            "access_key_id": "AK", "secret_access_key": "SK", "token": None, "expires_at": None})
        self.assertIsNone(zarr_python_root(zarr.storage.ObjectStore(provided)))
        with self.assertRaisesRegex(TypeError, "MemoryStore"):
            zarrs_array_of(zarr.create_array(zarr.storage.MemoryStore(), shape=(4,), dtype="uint8"))

    def test_dask_reads_and_writes_over_s3(self):
        import pickle
        from unittest import mock

        import dask.array as da

        import zarrs_gpu.dask as zd
        from zarrs_gpu._arrays import RemoteLocation

        server = self.server
        options = server.storage_options()
        values = np.arange(40 * 30, dtype="float32").reshape(40, 30)
        z = zarr.create_array(server.zarr_store("dask.zarr"), shape=(40, 30), chunks=(10, 15), dtype="float32")
        z[...] = values
        seen = []

        def host_reader(path, array, device, box):
            # Each task carries the URL and its options; zarr-python reads its box through S3.
            seen.append(path)
            self.assertIsInstance(path, RemoteLocation)
            self.assertEqual(path, pickle.loads(pickle.dumps(path)))
            key = tuple(slice(a, b) for a, b in box)
            return zarr.open_array(server.zarr_store(path.url.split("/", 3)[3], read_only=True), mode="r")[key]

        with mock.patch.object(zd, "reader", host_reader), \
                mock.patch.object(zd, "make_meta", lambda dtype, ndim: np.empty((0,) * ndim, dtype)):
            x = zd.from_zarr(server.url("dask.zarr"), storage_options=options)
            self.assertEqual((x.shape, x.dtype, x.chunks[0][0], x.chunks[1][0]), ((40, 30), np.float32, 40, 30))
            np.testing.assert_array_equal(x.compute(scheduler="threads"), values)
        self.assertTrue(seen)
        # Neither the graph's name nor a task's location shows the secret (the options travel
        # pickled in the tasks, never in a name).
        self.assertNotIn(options["secret"], repr(seen[0]) + x.name + repr(list(x.dask.keys())))
        # Writes of numpy blocks go through zarrs and S3.
        zarr.create_array(server.zarr_store("dask-out.zarr"), shape=(40, 30), chunks=(10, 15), dtype="float32")
        zd.to_zarr(da.from_array(values * 2, chunks=(10, 15)), server.url("dask-out.zarr"), storage_options=options)
        back = zarr.open_array(server.zarr_store("dask-out.zarr", read_only=True), mode="r")[...]
        np.testing.assert_array_equal(back, values * 2)
        with self.assertRaisesRegex(ValueError, "storage_options"):
            zd.from_zarr(tempfile.gettempdir(), storage_options=options)

    def test_cached_remote_arrays_are_opened_again_when_rewritten(self):
        from zarrs_gpu._arrays import RemoteLocation, open_cached

        server = self.server
        where = RemoteLocation(server.url(""), server.storage_options())
        zarr.create_array(server.zarr_store("cached.zarr"), shape=(10,), chunks=(4,), dtype="float32", fill_value=1.0)
        first = open_cached(where, "cached.zarr")
        self.assertIs(open_cached(where, "cached.zarr"), first)
        self.assertEqual(first.fill_value, 1.0)
        # Rewritten in place with another fill value: the next use opens it again.
        zarr.create_array(server.zarr_store("cached.zarr"), shape=(12,), chunks=(4,), dtype="float32",
                          fill_value=2.0, overwrite=True)
        again = open_cached(where, "cached.zarr")
        self.assertIsNot(again, first)
        self.assertEqual((again.shape, again.fill_value), ((12,), 2.0))
        self.assertIsNone(open_cached(where, "absent.zarr"))

    def test_torch_crop_datasets_take_s3_urls(self):
        import pickle
        from unittest import mock

        import zarrs_gpu.torch as zt
        from zarrs_gpu._arrays import RemoteLocation

        server = self.server
        values = np.arange(32 * 48, dtype="float32").reshape(32, 48)
        z = zarr.create_array(server.zarr_store("crops.zarr"), shape=(32, 48), chunks=(16, 16), dtype="float32")
        z[...] = values

        class RemoteHostArray(HostCropArray):
            def __init__(self, path, array, device, log):
                self.z = zarr.open_array(server.zarr_store(path.url.split("/", 3)[3], read_only=True), mode="r")
                self.path, self.device, self.log, self.fail_at, self.aheads = path, device, log, None, []

        class RemoteHostBackend(HostTorchBackend):
            def open(self, path, array, device):
                self.opened.append((path, array, device))
                self.arrays.append(RemoteHostArray(path, array, device, self.log))
                return self.arrays[-1]

        host = RemoteHostBackend()
        with mock.patch.object(zt, "backend", host):
            ds = zt.CropDataset(server.url("crops.zarr"), (8, 16), storage_options=server.storage_options())
            self.assertEqual(len(ds), 4 * 3)
            crop = ds[5]
            a, b = ds.plan[5]
            np.testing.assert_array_equal(crop, values[a[0]:a[1], b[0]:b[1]])
            # The dataset pickles (DataLoader workers) with its location; no secret is shown.
            again = pickle.loads(pickle.dumps(ds))
            np.testing.assert_array_equal(again[5], crop)
        path = host.opened[0][0]
        self.assertIsInstance(path, RemoteLocation)
        self.assertNotIn(server.storage_options()["secret"], repr(path) + repr(ds._sources[0].name))
        # zarr-python's own array in the bucket (an ObjectStore) is the same array by location.
        host = RemoteHostBackend()
        with mock.patch.object(zt, "backend", host):
            ds = zt.CropDataset(zarr.open_array(server.zarr_store("crops.zarr", read_only=True), mode="r"), (8, 16))
            np.testing.assert_array_equal(ds[5], crop)
        self.assertEqual(host.opened[0][0].url, server.url("crops.zarr"))
        self.assertEqual(host.opened[0][1], "/")

    def test_xarray_opens_s3_datasets(self):
        from unittest import mock

        import xarray as xr

        import zarrs_gpu.dask as zd
        from zarrs_gpu._arrays import RemoteLocation, zarr_python_store

        server = self.server
        rng = np.random.default_rng(2)
        ds = xr.Dataset({"temp": (("t", "y"), rng.standard_normal((6, 9)).astype("float32")),
                         "count": (("y",), np.arange(9, dtype="int32"))},
                        coords={"t": np.arange(6), "y": np.linspace(0, 1, 9)}, attrs={"title": "remote"})
        ds.to_zarr(server.zarr_store("ds.zarr"), zarr_format=3, consolidated=False)

        def host_reader(path, array, device, box):
            # The tasks carry the URL and options; zarr-python reads the box through obstore.
            self.assertIsInstance(path, RemoteLocation)
            z = zarr.open_array(zarr_python_store(path), path=array.strip("/"), mode="r")
            return np.asarray(z[tuple(slice(a, b) for a, b in box)])

        with mock.patch.multiple(zd, reader=host_reader, make_meta=lambda dtype, ndim: np.empty((0,) * ndim, dtype)):
            got = xr.open_dataset(server.url("ds.zarr"), engine="zarrs_gpu",
                                  storage_options=server.storage_options())
            xr.testing.assert_identical(got.load(), ds)
            self.assertEqual(got["temp"].encoding["source"], server.url("ds.zarr"))
        with self.assertRaisesRegex(ValueError, "storage_options"):
            xr.open_dataset(tempfile.gettempdir(), engine="zarrs_gpu", storage_options={"anon": True})

    def test_aws_profiles_of_the_shared_files_give_credentials_region_and_endpoint(self):
        from unittest import mock

        from zarrs_gpu._arrays import RemoteLocation, zarr_python_store

        server = self.server
        z = zarr.create_array(server.zarr_store("profiled.zarr"), shape=(12, 5), chunks=(4, 5), dtype="int16")
        values = np.arange(60, dtype="int16").reshape(12, 5)
        z[...] = values
        secret = server.storage_options()["secret"]
        with tempfile.TemporaryDirectory() as files:
            credentials, config = os.path.join(files, "credentials"), os.path.join(files, "config")
            with open(credentials, "w") as f:
                f.write(f"[bench]\naws_access_key_id = zarrs-gpu-test\naws_secret_access_key = {secret}\n")
            with open(config, "w") as f:
                f.write(f"[profile bench]\nregion = us-east-1\nendpoint_url = {server.endpoint}\n")
            cleared = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            env = dict(cleared, AWS_SHARED_CREDENTIALS_FILE=credentials, AWS_CONFIG_FILE=config)
            with mock.patch.dict(os.environ, env, clear=True):
                # s3fs's `profile` option, as zarr-python users pass it; then AWS_PROFILE.
                a = zarrs_gpu.open(server.url("profiled.zarr"), storage_options={"profile": "bench"})
                self.assertEqual((a.shape, a.dtype), ((12, 5), np.dtype("int16")))
                self.assertNotIn(secret, repr(a))
                where = RemoteLocation(server.url("profiled.zarr"), {"profile": "bench"})
                np.testing.assert_array_equal(zarr.open_array(zarr_python_store(where), mode="r")[...], values)
                os.environ["AWS_PROFILE"] = "bench"
                self.assertEqual(zarrs_gpu.open(server.url("profiled.zarr")).shape, (12, 5))
                with self.assertRaises(ValueError) as caught:
                    zarrs_gpu.open(server.url("profiled.zarr"), storage_options={"profile": "absent"})
                self.assertIn("absent", str(caught.exception))
                self.assertNotIn(secret, str(caught.exception))

    def test_remote_errors_name_what_and_never_the_secret(self):
        server = self.server
        zarr.create_array(server.zarr_store("errors.zarr"), shape=(4,), chunks=(2,), dtype="int8")
        wrong = dict(server.storage_options(), secret="not-the-secret")
        with self.assertRaises(ValueError) as caught:
            zarrs_gpu.open(server.url("errors.zarr"), storage_options=wrong)
        self.assertIn("errors.zarr", str(caught.exception))
        self.assertNotIn("not-the-secret", str(caught.exception))
        with self.assertRaises(zarrs_gpu.ArrayNotFoundError):
            zarrs_gpu.open(server.url("absent.zarr"), storage_options=server.storage_options())
        with self.assertRaisesRegex(ValueError, "no_such_option"):
            zarrs_gpu.open(server.url("errors.zarr"), storage_options={"no_such_option": 1})
        with tempfile.TemporaryDirectory() as local:
            with self.assertRaisesRegex(ValueError, "no storage options"):
                zarrs_gpu.open(local, storage_options={"anon": True})


class StalledServer:
    """A loopback HTTP server that takes connections and never answers (a remote store that
    hangs), until `stall` seconds have passed or it is closed: then it drops them."""

    def __init__(self, stall=15.0):
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stall, self.closed, self.held = stall, threading.Event(), []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import time

        self.listener.settimeout(0.05)
        deadline = time.monotonic() + self.stall
        while not self.closed.is_set() and time.monotonic() < deadline:
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                pass
        for conn in self.held:
            conn.close()
        self.listener.close()

    def url(self, name):
        return f"http://127.0.0.1:{self.port}/{name}"

    def close(self):
        self.closed.set()


class InterruptCpuTests(unittest.TestCase):
    """Ctrl-C and timeouts during waits for storage (what a machine without a GPU can reach: an
    open reads metadata before any device is asked for; reads fail at once without one)."""

    def interrupt_after(self, seconds):
        import _thread
        import threading

        timer = threading.Timer(seconds, _thread.interrupt_main)
        timer.start()
        self.addCleanup(timer.cancel)

    def test_ctrl_c_interrupts_an_open_waiting_on_a_stalled_server(self):
        import time

        server = StalledServer()
        self.addCleanup(server.close)
        self.interrupt_after(0.3)
        start = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            zarrs_gpu.open(server.url("stalled.zarr"))
        took = time.monotonic() - start
        self.assertLess(took, 1.3, f"KeyboardInterrupt came {took:.2f} s after the open began (0.3 s after Ctrl-C is due)")
        # The interpreter goes on: a local open works at once.
        with tempfile.TemporaryDirectory() as d:
            zarr.create_array(store=d, shape=(4,), chunks=(2,), dtype="int8")
            self.assertEqual(zarrs_gpu.open(d).shape, (4,))

    @unittest.skipUnless(os.environ.get("ZARRS_GPU_EXPECT_NO_GPU") == "1",
                         "set ZARRS_GPU_EXPECT_NO_GPU=1 on a machine without a GPU (CI does)")
    def test_pending_read_result_takes_a_timeout_and_keeps_the_result(self):
        with tempfile.TemporaryDirectory() as d:
            zarr.create_array(store=d, shape=(4,), chunks=(2,), dtype="int8")
            pending = zarrs_gpu.open(d).read_async()
            # Here the read fails at once (no GPU): its error, not a TimeoutError, within the time.
            with self.assertRaisesRegex(RuntimeError, "(?i)gpu|cuda"):
                pending.result(timeout=10)
            # Kept: the same error again, at once, with any timeout.
            for timeout in (0, -1, None, float("inf")):
                with self.subTest(timeout=timeout), self.assertRaisesRegex(RuntimeError, "(?i)gpu|cuda"):
                    pending.result(timeout=timeout)
            with self.assertRaisesRegex(ValueError, "nan"):
                pending.result(timeout=float("nan"))
            with self.assertRaises(TypeError):
                pending.result(timeout="1")


if __name__ == "__main__":
    unittest.main()
