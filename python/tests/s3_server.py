"""An S3 server on loopback for the tests: ``s3s-fs`` (from the Rust registry; ``.ci/run``
installs it under ``target/tools/bin``, ``S3S_FS`` names another) serving a fresh directory whose
bucket ``volumes`` zarr-python writes through obstore (its own S3 path) and zarrs_gpu reads by
URL.

Without s3s-fs the S3 tests are skipped, saying why, unless ``ZARRS_GPU_REQUIRE_S3=1`` (CI sets
it) makes its absence an error: ``start_or_skip()``."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

ACCESS_KEY = "zarrs-gpu-test"
SECRET_KEY = "zarrs-gpu-test-secret-0123456789"
BUCKET = "volumes"


#: How to install the server where it is missing (what .ci/run does).
INSTALL = "cargo install s3s-fs@0.14.1 --features binary --locked --root target/tools"
#: The environment variable that makes a missing server an error rather than a skip.
REQUIRE = "ZARRS_GPU_REQUIRE_S3"


def find_program():
    """The s3s-fs binary: $S3S_FS, the checkout's target/tools/bin, or the PATH; None if absent."""
    if os.environ.get("S3S_FS"):
        return os.environ["S3S_FS"]
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.join(here, "..", ".."), os.getcwd()):
        candidate = os.path.join(root, "target", "tools", "bin", "s3s-fs")
        if os.path.exists(candidate):
            return candidate
    return shutil.which("s3s-fs")


def start_or_skip():
    """A started S3Server; without s3s-fs, unittest.SkipTest saying why and how to install it, or
    FileNotFoundError where $ZARRS_GPU_REQUIRE_S3 is 1."""
    import unittest

    program = find_program()
    if program is None:
        why = f"s3s-fs not found (set S3S_FS, or install it: {INSTALL})"
        if os.environ.get(REQUIRE) == "1":
            raise FileNotFoundError(f"{why}; {REQUIRE}=1 requires the S3 tests")
        raise unittest.SkipTest(f"{why}; {REQUIRE}=1 makes this an error")
    return S3Server(program)


class S3Server:
    """s3s-fs (``program``, default: ``find_program()``) on a free loopback port; ``close()`` stops
    it and removes its directory. A server that does not start leaves no directory behind."""

    def __init__(self, program=None):
        program = program or find_program()
        if program is None:
            raise FileNotFoundError(f"s3s-fs: set S3S_FS or install it ({INSTALL})")
        self.process = None
        self.dir = tempfile.TemporaryDirectory(prefix="zarrs_gpu_s3_")
        try:
            os.mkdir(os.path.join(self.dir.name, BUCKET))
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            self.process = subprocess.Popen(
                [program, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS_KEY,
                 "--secret-key", SECRET_KEY, self.dir.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                    break
                except OSError:
                    if self.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"s3s-fs ({program}) did not listen on port {self.port}")
                    time.sleep(0.05)
        except BaseException:
            self.close()
            raise

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix):
        """The s3:// URL of `prefix` in the bucket."""
        return f"s3://{BUCKET}/{prefix}"

    def storage_options(self):
        """zarrs_gpu's storage_options, as zarr-python users pass them to s3fs: no `allow_http` (a
        plain-HTTP endpoint implies it) and s3fs's `token=None`."""
        return {"key": ACCESS_KEY, "secret": SECRET_KEY, "token": None,
                "client_kwargs": {"endpoint_url": self.endpoint, "region_name": "us-east-1"}}

    def zarr_store(self, prefix, read_only=False):
        """zarr-python's store of `prefix` in the bucket, through obstore."""
        import obstore.store
        import zarr.storage

        s3 = obstore.store.S3Store(BUCKET, prefix=prefix, endpoint=self.endpoint, access_key_id=ACCESS_KEY,
                                   secret_access_key=SECRET_KEY, region="us-east-1",
                                   virtual_hosted_style_request=False, client_options={"allow_http": True})
        return zarr.storage.ObjectStore(s3, read_only=read_only)

    def close(self):
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        self.dir.cleanup()
