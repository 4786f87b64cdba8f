"""zarrs_gpu on a machine without a GPU (what CI runs): arrays open and describe themselves,
bad indices and options are the right exceptions with the Rust messages, and a read says plainly
that there is no GPU. Needs zarr-python (to write the arrays).

    python -m unittest discover -s python/tests -p 'test_cpu.py'
"""
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import zarr
import zarr.codecs as zc

import zarrs_gpu


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

    def test_bad_indices_are_index_errors_before_any_device_work(self):
        a = zarrs_gpu.open(self.v3)
        cases = [
            ((slice(0, 10, 2),), "steps are not supported"),
            ((20,), "index 20 is out of bounds for axis 0 with size 20"),
            ((-21,), "index -21 is out of bounds for axis 0 with size 20"),
            ((Ellipsis, 0, Ellipsis), "single ellipsis"),
            ((0, 0, 0, 0), "too many indices for array: array is 3-dimensional, but 4 were indexed"),
            ((slice(5, 2),), "selects nothing"),
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
        self.assertEqual(GpuCodecPipeline.device_reads, before)

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
            code = ("import site, sys; sys.path.insert(0, sys.argv[1]); import zarrs_gpu._zarrs_gpu as z; "
                    "print(z._nvcomp_candidates()[0])")
            env = {k: v for k, v in os.environ.items()
                   if k not in ("NVCOMP_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH")}
            run = subprocess.run([sys.executable, "-c", code, site], env=env, capture_output=True, text=True)
            self.assertEqual(run.returncode, 0, run.stderr)
            self.assertEqual(run.stdout.strip(), fake)

    @unittest.skipUnless(os.environ.get("ZARRS_GPU_EXPECT_NO_GPU") == "1",
                         "set ZARRS_GPU_EXPECT_NO_GPU=1 on a machine without a GPU (CI does)")
    def test_reads_without_a_gpu_are_runtime_errors(self):
        for read in (lambda: zarrs_gpu.read(self.v3), lambda: zarrs_gpu.open(self.v2)[0:4]):
            with self.assertRaises(RuntimeError) as caught:
                read()
            self.assertIn("no CUDA device available", str(caught.exception))


if __name__ == "__main__":
    unittest.main()
