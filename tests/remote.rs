//! `RemoteStore` against real servers on loopback (`s3s-fs`, or SeaweedFS with
//! `S3_TEST_SERVER=seaweedfs`, for S3; RangeHTTPServer for HTTP):
//! zarrs' host reads through it equal the same arrays read from their directories, writes
//! through S3 land, and failures (a server gone, a server that dies mid-response, wrong
//! credentials) are errors naming the chunk, within a bounded time, that never show a secret.
//!
//! The servers are installed by `.ci/run` (`target/tools/bin/s3s-fs` and `weed`, RangeHTTPServer
//! in `target/interop-venv`); the tests that need them are `#[ignore]`d so that a machine without
//! them names them as not run, and CI runs them with `--ignored`.

#[path = "common/boxes.rs"]
mod boxes;
#[path = "common/servers.rs"]
mod servers;

use std::error::Error;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use servers::{files_under, Server, SECRET_KEY};
use zarrs::array::codec::ZstdCodec;
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayBytes, ArraySubset};
use zarrs::filesystem::FilesystemStore;
use zarrs_gpu::zarrs_gds_store::RemoteRange;
use zarrs_gpu::{AnyStore, RemoteStore};
use zarrs_storage::{ListableStorageTraits, ReadableStorageTraits, StorageError, StoreKey, StorePrefix};

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const SERVERS: &str = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)";

/// Subsets of `shape`: the whole array, an edge box, and a few random boxes.
fn subsets(shape: &[u64], rng: &mut StdRng) -> Vec<ArraySubset> {
    let mut out = vec![ArraySubset::new_with_shape(shape.to_vec())];
    out.push(ArraySubset::new_with_ranges(&shape.iter().map(|&s| (s - s / 3)..s).collect::<Vec<_>>()));
    out.extend((0..4).map(|_| boxes::random_box(shape, rng)));
    out
}

/// zarrs' reads of every array through `store` equal its reads from the directory.
fn reads_equal(local: &[Array<FilesystemStore>], store: &Arc<RemoteStore>, what: &str) -> Result {
    let mut rng = StdRng::seed_from_u64(3);
    for built in local {
        let path = built.path().as_str();
        let want = Array::open(built.storage(), path)?;
        let remote = Array::open(store.clone(), path)?;
        assert_eq!(remote.metadata(), want.metadata(), "{what} {path}");
        for subset in subsets(want.shape(), &mut rng) {
            let a = remote.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
            let b = want.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
            assert!(a == b, "{what} {path} {subset:?}: the remote read differs from the directory's");
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn s3_and_http_reads_equal_the_directory_reads() -> Result {
    let _ = SERVERS;
    let s3 = Server::s3();
    let local = s3.arrays("")?;
    reads_equal(&local, &Arc::new(s3.s3_store("")), "s3")?;
    // A prefix in the URL: keys are under it.
    let nested = s3.arrays("a/b")?;
    reads_equal(&nested, &Arc::new(s3.s3_store("a/b")), "s3 prefix")?;
    let http = Server::http();
    let local = http.arrays("data")?;
    reads_equal(&local, &Arc::new(http.http_store("data")), "http")?;
    // Opened by URL as the command line and Python do: an AnyStore holding a RemoteStore.
    let (url, options) = s3.s3_url("");
    let any = AnyStore::open(&url, options.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    assert!(any.remote().is_some());
    let array = Array::open(Arc::new(any), "/zstd.zarr")?;
    let subset = array.subset_all();
    let want = Array::open(Arc::new(FilesystemStore::new(s3.dir("", true))?), "/zstd.zarr")?;
    assert!(
        array.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned()
            == want.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned()
    );
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn any_async_zarrs_store_reads_through_remote_store() -> Result {
    // zarrs' own async object store (zarrs_object_store) over object_store's S3 client.
    let server = Server::s3();
    let local = server.arrays("")?;
    let async_store = Arc::new(zarrs_object_store::AsyncObjectStore::new(server.s3_client()?));
    let store = Arc::new(RemoteStore::from_async(async_store, "s3 through zarrs_object_store"));
    reads_equal(&local, &store, "async store")?;
    // Reads only: listing and writes name the store.
    let err = store.list().unwrap_err().to_string();
    assert!(err.contains("through zarrs_object_store"), "{err}");
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn fetch_many_hands_over_each_range_sizes_and_missing_keys() -> Result {
    for (server, s3) in [(Server::s3(), true), (Server::http(), false)] {
        let dir = server.dir("f", s3);
        server.arrays("f")?;
        let store = if s3 { server.s3_store("f") } else { server.http_store("f") }.with_concurrency(3);
        let key = StoreKey::new("gzip.zarr/c/1/2")?;
        let file = std::fs::read(dir.join("gzip.zarr/c/1/2"))?;
        let len = file.len() as u64;
        let ranges = vec![
            RemoteRange { key: key.clone(), offset: 0, len },
            RemoteRange { key: key.clone(), offset: 5, len: len - 9 },
            RemoteRange { key: StoreKey::new("gzip.zarr/c/9/9")?, offset: 0, len: 4 },
            RemoteRange { key: StoreKey::new("raw.zarr/c/1/1/1")?, offset: 1000, len: 3000 },
            RemoteRange { key: key.clone(), offset: 3, len: 0 },
        ];
        let mut got = vec![None; ranges.len()];
        store.fetch_many(&ranges, |i, bytes| {
            got[i] = Some(bytes);
            Ok::<(), StorageError>(())
        })?;
        let raw = std::fs::read(dir.join("raw.zarr/c/1/1/1"))?;
        assert_eq!(got[0].clone().unwrap().unwrap().as_ref(), &file[..]);
        assert_eq!(got[1].clone().unwrap().unwrap().as_ref(), &file[5..file.len() - 4]);
        assert_eq!(got[2], Some(None), "a missing key is None");
        assert_eq!(got[3].clone().unwrap().unwrap().as_ref(), &raw[1000..4000]);
        assert_eq!(got[4].clone().unwrap().unwrap().len(), 0);
        // Past the value's end: an error naming the key.
        let past = [RemoteRange { key: key.clone(), offset: len - 2, len: 10 }];
        let err = store.fetch_many(&past, |_, _| Ok::<(), StorageError>(())).unwrap_err().to_string();
        assert!(err.contains("gzip.zarr/c/1/2"), "{err}");
        let sizes = store.sizes(&[&key, &StoreKey::new("nothing/here")?])?;
        assert_eq!(sizes, vec![Some(len), None]);
        // Each range with its value's whole size, as object stores' responses say it.
        let mut with_size = Vec::new();
        store.fetch_many_sized(&ranges[..2], |i, got| {
            with_size.push((i, got.map(|(bytes, size)| (bytes.len(), size))));
            Ok::<(), StorageError>(())
        })?;
        with_size.sort_unstable();
        assert_eq!(with_size, vec![(0, Some((file.len(), Some(len)))), (1, Some((file.len() - 9, Some(len))))]);
        assert!(store.reports_sizes());
        // Whole values up to a limit: whole when shorter, one byte past the limit when longer.
        let missing = StoreKey::new("nothing/here")?;
        let values = store.fetch_values(&[(&key, len + 100), (&key, len), (&key, 10), (&missing, 5)])?;
        assert_eq!(values[0].as_deref(), Some(&file[..]));
        assert_eq!(values[1].as_deref(), Some(&file[..]));
        assert_eq!(values[2].as_deref(), Some(&file[..11]));
        assert_eq!(values[3], None);
        // A zarrs partial read of a missing key is None; a suffix read is the value's end.
        assert_eq!(store.get(&StoreKey::new("gzip.zarr/c/9/9")?)?, None);
        let suffix = store.get_partial(&key, zarrs_storage::byte_range::ByteRange::Suffix(6))?.unwrap();
        assert_eq!(suffix.as_ref(), &file[file.len() - 6..]);
    }
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn value_batches_arrive_in_order_equal_to_fetch_values_and_stop_at_errors() -> Result {
    for (server, s3) in [(Server::s3(), true), (Server::http(), false)] {
        let dir = server.dir("b", s3);
        server.arrays("b")?;
        let store = if s3 { server.s3_store("b") } else { server.http_store("b") }.with_concurrency(3);
        // Every stored chunk of two arrays, in batches of 3, an empty batch and a missing key among them.
        let mut keys = Vec::new();
        for array in ["gzip.zarr", "zstd.zarr"] {
            for entry in files_under(&dir.join(array).join("c"))? {
                let key = entry.strip_prefix(&dir)?.to_string_lossy().into_owned();
                keys.push((StoreKey::new(key)?, 1 << 20));
            }
        }
        keys.insert(7, (StoreKey::new("gzip.zarr/c/99/99")?, 10));
        keys.sort_unstable_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let mut batches: Vec<Vec<(StoreKey, u64)>> = keys.chunks(3).map(<[_]>::to_vec).collect();
        batches.insert(2, Vec::new());
        assert!(batches.len() > 6, "{} batches", batches.len());
        for ahead in [0, 1, 4] {
            let mut fetched = store.fetch_value_batches(batches.clone(), ahead);
            for batch in &batches {
                let got = fetched.next_batch().expect("a batch per batch")?;
                let refs: Vec<(&StoreKey, u64)> = batch.iter().map(|(k, l)| (k, *l)).collect();
                assert_eq!(got, store.fetch_values(&refs)?, "ahead {ahead}");
                for ((key, _), value) in batch.iter().zip(&got) {
                    let file = std::fs::read(dir.join(key.as_str())).ok();
                    assert_eq!(value.as_deref(), file.as_deref(), "{key}");
                }
            }
            assert!(fetched.next_batch().is_none());
        }
        // Dropped after one batch: the rest stop (no hang, nothing left running to wait for).
        let mut fetched = store.fetch_value_batches(batches.clone(), 1);
        fetched.next_batch().expect("a batch")?;
        drop(fetched);
    }
    // A server that dies mid-response: every batch is an error naming a key, soon.
    let port = dying_server();
    let store = RemoteStore::from_url(&format!("http://127.0.0.1:{port}/x"), [("allow_http", "true")])?;
    let batches = vec![vec![(StoreKey::new("arr/c/0")?, 200_000)], vec![(StoreKey::new("arr/c/1")?, 200_000)]];
    let start = Instant::now();
    let mut fetched = store.fetch_value_batches(batches, 1);
    for _ in 0..2 {
        let err = fetched.next_batch().expect("a batch").unwrap_err().to_string();
        assert!(err.contains("arr/c/0") || err.contains("arr/c/1"), "{err}");
    }
    assert!(start.elapsed() < Duration::from_mins(1), "took {:?}", start.elapsed());
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn large_values_read_whole_and_in_ranges_across_the_servers_own_pieces() -> Result {
    // 20 MiB and a few bytes: larger than an uncompressed benchmark chunk, and cut by a server
    // into pieces of its own (SeaweedFS stores 4 MiB chunks); ranges across those cuts.
    let server = Server::s3();
    let store = server.s3_store("big").with_concurrency(4);
    let mut rng = StdRng::seed_from_u64(20);
    let value: Vec<u8> = (0..(20 << 20) + 13).map(|_| rng.random()).collect();
    let key = StoreKey::new("v/c/0")?;
    zarrs_storage::WritableStorageTraits::set(&store, &key, zarrs_storage::Bytes::from(value.clone()))?;
    let len = value.len() as u64;
    let mib = 1u64 << 20;
    let mut ranges = vec![(0, len), (4 * mib - 7, 14), (8 * mib, 4 * mib + 1), (len - 5, 5), (mib + 1, 15 * mib)];
    for _ in 0..12 {
        let offset = rng.random_range(0..len);
        ranges.push((offset, rng.random_range(0..=len - offset)));
    }
    let requests: Vec<RemoteRange> =
        ranges.iter().map(|&(offset, len)| RemoteRange { key: key.clone(), offset, len }).collect();
    let mut got = vec![None; requests.len()];
    store.fetch_many(&requests, |i, bytes| {
        got[i] = bytes;
        Ok::<(), StorageError>(())
    })?;
    for ((offset, n), bytes) in ranges.iter().zip(&got) {
        let (a, b) = (*offset as usize, (*offset + *n) as usize);
        assert!(bytes.as_deref() == Some(&value[a..b]), "{a}..{b} differs");
    }
    assert_eq!(store.get(&key)?.as_deref(), Some(&value[..]));
    let suffix = store.get_partial(&key, zarrs_storage::byte_range::ByteRange::Suffix(3 * mib + 3))?.unwrap();
    assert!(suffix.as_ref() == &value[value.len() - (3 << 20) - 3..]);
    assert_eq!(store.size_key(&key)?, Some(len));
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn writes_through_s3_land_and_list() -> Result {
    let server = Server::s3();
    let store = Arc::new(server.s3_store("w"));
    let array = ArrayBuilder::new(vec![20, 30], vec![8, 8], data_type::float32(), 0.0f32)
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
        .build(store.clone(), "/out.zarr")?;
    array.store_metadata()?;
    let values: Vec<f32> = (0..600).map(|i| i as f32 * 0.5).collect();
    array.store_array_subset(&array.subset_all(), &values)?;
    // A chunk of fill values only is erased, as zarrs does on any store.
    array.store_chunk(&[0, 0], vec![0.0f32; 64])?;
    let landed = server.landed("w")?;
    let local = Array::open(Arc::new(FilesystemStore::new(&landed)?), "/out.zarr")?;
    let mut want = values.clone();
    for y in 0..8 {
        for x in 0..8 {
            want[y * 30 + x] = 0.0;
        }
    }
    assert_eq!(local.retrieve_array_subset::<Vec<f32>>(&local.subset_all())?, want);
    assert!(landed.join("out.zarr/c/1/1").exists() && !landed.join("out.zarr/c/0/0").exists());
    let keys = store.list_prefix(&StorePrefix::new("out.zarr/")?)?;
    assert!(keys.contains(&StoreKey::new("out.zarr/zarr.json")?) && keys.contains(&StoreKey::new("out.zarr/c/2/3")?));
    assert!(!keys.contains(&StoreKey::new("out.zarr/c/0/0")?));
    let dir = store.list_dir(&StorePrefix::new("out.zarr/")?)?;
    assert_eq!(dir.keys(), &[StoreKey::new("out.zarr/zarr.json")?]);
    assert_eq!(dir.prefixes(), &[StorePrefix::new("out.zarr/c/")?]);
    Ok(())
}

/// A server on loopback that answers its `n`th request (from 0) with `respond(n)`, then closes
/// the connection; its port and the count of requests it has had.
fn scripted_server(respond: impl Fn(usize) -> Vec<u8> + Send + 'static) -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(&respond(seen.fetch_add(1, Ordering::SeqCst)));
        }
    });
    (port, count)
}

/// A server that answers every request with a 200 whose body stops a long way short of its
/// length, then closes the connection.
fn dying_server() -> u16 {
    scripted_server(|_| [&b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n"[..], &[7u8; 1000]].concat()).0
}

/// A server that answers its first `failures` requests with 503 and every later one with `body`;
/// the count of requests it has had.
fn flaky_server(failures: usize, body: &'static [u8]) -> (u16, Arc<AtomicUsize>) {
    scripted_server(move |n| {
        if n < failures {
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        } else {
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            [head.as_bytes(), body].concat()
        }
    })
}

#[test]
fn server_errors_are_retried_with_backoff_then_read() -> Result {
    // Two 503s, then the value: read, after three requests.
    let (port, count) = flaky_server(2, b"zarr chunk bytes");
    let store = RemoteStore::from_url(&format!("http://127.0.0.1:{port}/a"), [("allow_http", "true")])?;
    let value = store.get(&StoreKey::new("c/0/0")?)?.expect("the value");
    assert_eq!(value.as_ref(), b"zarr chunk bytes");
    assert_eq!(count.load(Ordering::SeqCst), 3);
    // More failures than retries: an error naming the key, after max_retries + 1 requests.
    let (port, count) = flaky_server(100, b"");
    let url = format!("http://127.0.0.1:{port}/a");
    let store = RemoteStore::from_url(&url, [("allow_http", "true"), ("max_retries", "2")])?;
    let err = store.get(&StoreKey::new("c/4/2")?).unwrap_err().to_string();
    assert!(err.contains("c/4/2") && err.contains("503"), "{err}");
    assert_eq!(count.load(Ordering::SeqCst), 3);
    Ok(())
}

#[test]
fn a_server_dying_mid_response_is_an_error_naming_the_chunk_never_a_hang() -> Result {
    // Dies mid-response, every time: retried, then an error naming the key.
    let port = dying_server();
    let store = RemoteStore::from_url(&format!("http://127.0.0.1:{port}/x"), [("allow_http", "true")])?;
    let start = Instant::now();
    let ranges = [RemoteRange { key: StoreKey::new("arr/c/4/2")?, offset: 0, len: 100_000 }];
    let err = store.fetch_many(&ranges, |_, _| Ok::<(), StorageError>(())).unwrap_err().to_string();
    assert!(err.contains("arr/c/4/2"), "{err}");
    assert!(start.elapsed() < Duration::from_mins(1), "took {:?}", start.elapsed());
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn a_server_gone_is_an_error_naming_the_chunk_never_a_hang() -> Result {
    // A server gone: reads of an array opened before are errors naming the chunk.
    let mut server = Server::s3();
    server.arrays("")?;
    let (url, mut options) = server.s3_url("");
    options.push(("max_retries".into(), "1".into()));
    let array = Array::open(Arc::new(RemoteStore::from_url(&url, options)?), "/gzip.zarr")?;
    server.kill();
    let start = Instant::now();
    let err = array.retrieve_chunk::<ArrayBytes<'static>>(&[1, 2]).unwrap_err().to_string();
    assert!(err.contains("gzip.zarr/c/1/2"), "{err}");
    assert!(start.elapsed() < Duration::from_mins(1), "took {:?}", start.elapsed());
    Ok(())
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn credentials_are_used_and_never_shown() -> Result {
    let server = Server::s3();
    server.arrays("")?;
    let (url, options) = server.s3_url("");
    let wrong: Vec<(String, String)> =
        options
            .iter()
            .map(|(k, v)| {
                if k == "aws_secret_access_key" {
                    (k.clone(), "not-the-secret".into())
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect();
    let store = RemoteStore::from_url(&url, wrong)?;
    let err = store.get(&StoreKey::new("zstd.zarr/zarr.json")?).unwrap_err().to_string();
    assert!(err.contains("zstd.zarr/zarr.json") && !err.contains("not-the-secret"), "{err}");
    // fsspec's names (zarr-python's storage_options) are taken too; the store shows no secret.
    let fsspec = [
        ("endpoint_url", format!("http://127.0.0.1:{}", server.port)),
        ("key", servers::ACCESS_KEY.to_string()),
        ("secret", SECRET_KEY.to_string()),
        ("region_name", "us-east-1".to_string()),
        ("allow_http", "True".to_string()),
    ];
    let store = RemoteStore::from_url(&url, fsspec)?;
    assert!(store.get(&StoreKey::new("zstd.zarr/zarr.json")?)?.is_some());
    for shown in [format!("{store}"), format!("{store:?}")] {
        assert!(!shown.contains(SECRET_KEY), "{shown}");
    }
    // Credentials in the URL itself are refused (the HTTP client would not send them), and no
    // message shows them or a query's signature.
    for url in ["s3://user:hunter2@bucket/x", "http://alice:hunter2@127.0.0.1:9/a", "http://alice:hunter2@[::1/x"] {
        let err = RemoteStore::from_url(url, [("allow_http", "true")]).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }
    let err =
        RemoteStore::from_url("s3:///bucket?X-Amz-Security-Token=SECRETTOKEN", [("a", "b")]).unwrap_err().to_string();
    assert!(!err.contains("SECRETTOKEN"), "{err}");
    assert_eq!(zarrs_gpu::zarrs_gds_store::redact_url("https://u:p@host/x?sig=1#f"), "https://host/x");
    Ok(())
}

/// A server that answers every request with a 206 whose body is 5,000 bytes where its
/// Content-Range says 10.
fn overlong_server() -> u16 {
    let head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/10\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n";
    scripted_server(move |_| [head.as_bytes(), &[1u8; 5000]].concat()).0
}

#[test]
fn a_body_longer_than_its_range_is_refused() -> Result {
    let port = overlong_server();
    let store = RemoteStore::from_url(&format!("http://127.0.0.1:{port}/a"), [("allow_http", "true")])?;
    let key = StoreKey::new("c/0")?;
    let err = store.fetch_values(&[(&key, 100)]).unwrap_err().to_string();
    assert!(err.contains("c/0") && err.contains("5000") && err.contains("0..10"), "{err}");
    let ranges = [RemoteRange { key: key.clone(), offset: 0, len: 10 }];
    assert!(store.fetch_many(&ranges, |_, _| Ok::<(), StorageError>(())).is_err());
    Ok(())
}

#[test]
fn urls_and_options_are_checked_before_any_request() {
    for (url, option, expected) in [
        ("s3://bucket/x", ("no_such_option", "1"), "no_such_option"),
        ("http://127.0.0.1:1/x", ("aws_region", "us-east-1"), "aws_region"),
        ("s3://bucket/x", ("max_retries", "many"), "max_retries"),
        ("gs://bucket/x", ("timeout", "1s"), "s3, http, https"),
    ] {
        let err = RemoteStore::from_url(url, [option]).unwrap_err().to_string();
        assert!(err.contains(expected), "{url} {option:?}: {err}");
    }
    assert!(AnyStore::is_url("s3://b/x") && AnyStore::is_url("HTTPS://h/x") && !AnyStore::is_url("/data/x.zarr"));
    let err = AnyStore::open("/tmp", [("endpoint_url", "x")]).unwrap_err().to_string();
    assert!(err.contains("no storage options"), "{err}");
}

#[test]
#[ignore = "needs an S3 server and RangeHTTPServer on loopback (.ci/run installs them)"]
fn the_command_line_opens_s3_urls_with_the_aws_environment() -> Result {
    let server = Server::s3();
    server.arrays("cli")?;
    let (url, options) = server.s3_url("cli");
    // The options as the AWS environment names them (AWS_ENDPOINT, AWS_ALLOW_HTTP, ...).
    let env: Vec<(String, String)> = options
        .iter()
        .map(|(k, v)| (format!("AWS_{}", k.trim_start_matches("aws_")).to_uppercase(), v.clone()))
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zarrs-gpu"))
        .args(["info", &url, "--array", "sharded.zarr"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("shape [64, 48]") && text.contains("sharding_indexed"), "{text}");
    // A group's listing over S3: every array under it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_zarrs-gpu"))
        .args(["info", &url, "--array", "nothing.zarr"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nothing.zarr") && !err.contains(SECRET_KEY), "{err}");
    // Credentials, region and endpoint in a profile of the AWS shared files only, as `aws
    // configure` writes them: the profile AWS_PROFILE names is read; a profile missing is an
    // error naming it.
    let files = tempfile::tempdir()?;
    let (credentials, config) = (files.path().join("credentials"), files.path().join("config"));
    std::fs::write(
        &credentials,
        format!("[bench]\naws_access_key_id = {}\naws_secret_access_key = {SECRET_KEY}\n", servers::ACCESS_KEY),
    )?;
    std::fs::write(
        &config,
        format!("[profile bench]\nregion = us-east-1\nendpoint_url = http://127.0.0.1:{}\n", server.port),
    )?;
    for (profile, works) in [("bench", true), ("nope", false)] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_zarrs-gpu"))
            .args(["info", &url, "--array", "sharded.zarr"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config)
            .env("AWS_PROFILE", profile)
            .output()?;
        let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.success(), works, "{profile}: {text}{err}");
        if works {
            assert!(text.contains("shape [64, 48]"), "{text}");
        } else {
            assert!(err.contains("nope") && !err.contains(SECRET_KEY), "{err}");
        }
    }
    Ok(())
}

#[test]
fn the_command_line_refuses_plain_http_beyond_loopback_from_the_aws_files_or_environment() -> Result {
    // An endpoint from ~/.aws/config or the environment, not loopback, is
    // refused before any request, the message naming allow_http.
    let files = tempfile::tempdir()?;
    let (credentials, config) = (files.path().join("credentials"), files.path().join("config"));
    std::fs::write(&credentials, "[default]\naws_access_key_id = AK\naws_secret_access_key = secret-file\n")?;
    std::fs::write(&config, "[default]\nregion = us-east-1\nendpoint_url = http://192.0.2.7:9000\n")?;
    for endpoint_env in [None, Some("http://192.0.2.8:9000")] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_zarrs-gpu"));
        command
            .args(["info", "s3://volumes/x", "--array", "a.zarr"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AWS_SHARED_CREDENTIALS_FILE", &credentials)
            .env("AWS_CONFIG_FILE", &config);
        if let Some(endpoint) = endpoint_env {
            command.env("AWS_ENDPOINT", endpoint);
        }
        let start = Instant::now();
        let out = command.output()?;
        let err = String::from_utf8_lossy(&out.stderr);
        let host = endpoint_env.map_or("192.0.2.7", |_| "192.0.2.8");
        assert!(!out.status.success() && err.contains("allow_http") && err.contains(host), "{err}");
        assert!(!err.contains("secret-file"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5), "took {:?}: a request was tried", start.elapsed());
    }
    Ok(())
}
