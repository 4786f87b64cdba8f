//! The object store's ceiling: every stored chunk of an array fetched into host memory by
//! `RemoteStore::fetch_many` (ranged GETs many in flight, nothing decoded, nothing copied to a
//! device), at several concurrencies, each value dropped as it arrives and then all kept to the
//! end (what holding them costs); beside it the device pipeline's ways of taking whole values,
//! `fetch_values` (one batch; a byte past each value's end as the pipeline asks, and exactly to
//! it) and `fetch_value_batches` (batches of 256, one ahead). No GPU needed. Five JSON rows per
//! concurrency and repetition. `KEPT_BODY_BYTES` sets the store's `kept_body_bytes`.
//! `put DIR URL` uploads a directory's files first (PUTs, 32 at once), as object stores hold
//! arrays.
//!
//! ```text
//! export AWS_ENDPOINT=http://127.0.0.1:9000 AWS_ALLOW_HTTP=true AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...
//! cargo run --release --example remote_get -- put /tmp/b/z2.zarr s3://bucket/z2.zarr
//! cargo run --release --example remote_get -- s3://bucket/z2.zarr 16,64,256 3
//! ```

use std::time::Instant;

use rayon::prelude::*;
use zarrs_gpu::zarrs_gds_store::RemoteRange;
use zarrs_gpu::RemoteStore;
use zarrs_storage::{Bytes, ListableStorageTraits, StorageError, StoreKey, StorePrefix, WritableStorageTraits};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Every file under `dir` PUT under `url`, its path below `dir` the key.
fn put(dir: &std::path::Path, url: &str) -> Result<(), Error> {
    let store = RemoteStore::from_url(url, std::iter::empty::<(&str, &str)>())?;
    let files: Vec<std::path::PathBuf> = walkdir::WalkDir::new(dir)
        .into_iter()
        .filter(|e| e.as_ref().map_or(true, |e| !e.file_type().is_dir()))
        .map(|e| e.map(walkdir::DirEntry::into_path))
        .collect::<Result<_, _>>()?;
    let start = Instant::now();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(32).build()?;
    let bytes: u64 = pool.install(|| {
        files
            .par_iter()
            .map(|path| -> Result<u64, Error> {
                let key = StoreKey::new(path.strip_prefix(dir)?.to_string_lossy())?;
                let value = std::fs::read(path)?;
                let len = value.len() as u64;
                store.set(&key, Bytes::from(value))?;
                Ok(len)
            })
            .sum::<Result<u64, Error>>()
    })?;
    eprintln!("{url}: {} files, {bytes} bytes uploaded in {:.1} s", files.len(), start.elapsed().as_secs_f64());
    Ok(())
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("put") {
        let (Some(dir), Some(url)) = (args.get(1), args.get(2)) else {
            return Err("usage: remote_get put DIR URL".into());
        };
        return put(std::path::Path::new(dir), url);
    }
    let url = args.first().ok_or("usage: remote_get URL [CONCURRENCIES] [REPEAT]")?;
    let concurrencies: Vec<usize> =
        args.get(1).map_or("16,64,256", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    let repeat: usize = args.get(2).map_or(Ok(3), |r| r.parse())?;
    // KEPT_BODY_BYTES: the store's `kept_body_bytes` (0: every body in fresh memory).
    let kept = std::env::var("KEPT_BODY_BYTES").ok().map(|bytes| ("kept_body_bytes", bytes));
    let store = RemoteStore::from_url(url, kept)?;
    let start = Instant::now();
    // Every value but the metadata: the chunks (v3 `c/...` or v2 `0.0.0` keys).
    let keys: Vec<_> = store
        .list_prefix(&StorePrefix::root())?
        .into_iter()
        .filter(|k| !matches!(k.as_str().rsplit('/').next(), Some("zarr.json" | ".zarray" | ".zattrs" | ".zgroup")))
        .collect();
    let listed = start.elapsed().as_secs_f64();
    let sizes = store.sizes(&keys.iter().collect::<Vec<_>>())?;
    let ranges: Vec<RemoteRange> = keys
        .iter()
        .zip(&sizes)
        .filter_map(|(key, size)| size.map(|len| RemoteRange { key: key.clone(), offset: 0, len }))
        .collect();
    let total: u64 = ranges.iter().map(|r| r.len).sum();
    eprintln!("{url}: {} values, {:.3} GiB, listed in {listed:.2} s", ranges.len(), total as f64 / f64::from(1 << 30));
    for &concurrency in &concurrencies {
        let store = store.clone().with_concurrency(concurrency);
        for run in 0..repeat {
            let row = |case: &str, seconds: f64| {
                println!(
                    "{}",
                    serde_json::json!({
                        "case": case, "url": url, "concurrency": concurrency, "run": run,
                        "values": ranges.len(), "bytes": total, "seconds": seconds,
                        "gib_s": total as f64 / f64::from(1 << 30) / seconds,
                    })
                );
            };
            let timed = |case: &str, fetch: &dyn Fn() -> Result<u64, Error>| -> Result<(), Error> {
                let start = Instant::now();
                let got = fetch()?;
                let seconds = start.elapsed().as_secs_f64();
                assert_eq!(got, total, "{case}: every value fetched whole");
                row(case, seconds);
                Ok(())
            };
            // Exact ranges, each value dropped as it arrives: the server's and the loopback's rate.
            timed("remote fetch to host", &|| {
                let mut got = 0u64;
                store.fetch_many(&ranges, |_, bytes| {
                    got += bytes.map_or(0, |b| b.len() as u64);
                    Ok::<(), StorageError>(())
                })?;
                Ok(got)
            })?;
            // The same, every value kept to the end (as a batch's values are, until decoded): what
            // holding them costs (fresh memory, page faults).
            timed("remote fetch to host, kept", &|| {
                let mut kept = Vec::with_capacity(ranges.len());
                store.fetch_many(&ranges, |_, bytes| {
                    kept.extend(bytes);
                    Ok::<(), StorageError>(())
                })?;
                Ok(kept.iter().map(|b| b.len() as u64).sum())
            })?;
            // The device pipeline's ways of taking whole values: all at once (one batch), each GET
            // a byte past the value's end (as the pipeline asks, its size unknown) or exactly to
            // it; and in batches of BATCH values, each fetched while the one before is taken.
            let whole: Vec<(StoreKey, u64)> = ranges.iter().map(|r| (r.key.clone(), r.len)).collect();
            let exact: Vec<(StoreKey, u64)> = ranges.iter().map(|r| (r.key.clone(), r.len.saturating_sub(1))).collect();
            for (case, keys) in [("fetch_values, one batch", &whole), ("fetch_values, exact ranges", &exact)] {
                timed(case, &|| {
                    let values = store.fetch_values(&keys.iter().map(|(k, l)| (k, *l)).collect::<Vec<_>>())?;
                    Ok(values.iter().flatten().map(|b| b.len() as u64).sum())
                })?;
            }
            timed("fetch_value_batches of 256", &|| {
                let mut batches = store.fetch_value_batches(whole.chunks(BATCH).map(<[_]>::to_vec).collect(), 1);
                let mut got = 0u64;
                while let Some(values) = batches.next_batch() {
                    got += values?.iter().flatten().map(|b| b.len() as u64).sum::<u64>();
                }
                Ok(got)
            })?;
        }
    }
    Ok(())
}

/// Values per batch in `fetch_value_batches` rows: Z2's chunks in a 256 MiB batch.
const BATCH: usize = 256;
