//! Device reads from object stores on loopback (`s3s-fs` for S3, RangeHTTPServer for HTTP; on the
//! GPU host, staged with the tests): every read equals zarrs' host read of the same array from its
//! directory, through a `RemoteStore` and through an `AnyStore` opened by URL, and reports the
//! remote path; a server gone is an error naming the chunk that leaves the device usable.

use std::sync::Arc;
use zarrs_gpu::DeviceArray;

use zarrs::array::{Array, ArrayBytes, ArraySubset};
use zarrs::filesystem::FilesystemStore;
use zarrs_gpu::{AnyStore, ArrayDeviceExt, GpuConfig, IoPath, RemoteStore, ShardIndexCache};
use zarrs_storage::ReadableStorageTraits;

use super::servers::Server;
use super::{subsets, Result};

/// Each element type the fixtures use, by array name.
fn read_bytes<S: ReadableStorageTraits + 'static>(
    array: &Array<S>,
    name: &str,
    subset: &ArraySubset,
    config: &GpuConfig,
) -> Result<(Vec<u8>, zarrs_gpu::RetrieveReport)> {
    Ok(match name {
        "zstd" => {
            let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<u16>>(subset, config)?;
            (device.to_host_bytes()?, report)
        }
        "gzip" => {
            let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<i32>>(subset, config)?;
            (device.to_host_bytes()?, report)
        }
        _ => {
            let (device, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(subset, config)?;
            (device.to_host_bytes()?, report)
        }
    })
}

/// Every fixture array read to the device through `store` equals zarrs' host read from `dir`.
fn device_reads_equal<S: ReadableStorageTraits + 'static>(store: &Arc<S>, dir: &std::path::Path, what: &str) -> Result {
    let local = Arc::new(FilesystemStore::new(dir)?);
    for name in super::servers::NAMES {
        let path = format!("/{name}.zarr");
        let want_array = Array::open(local.clone(), &path)?;
        let array = Array::open(store.clone(), &path)?;
        // Shard indexes kept between reads, as a caller's handle keeps them.
        let config = GpuConfig::default().with_shard_index_cache(Some(Arc::new(ShardIndexCache::new())));
        for subset in subsets(array.shape(), name.len() as u64) {
            let want = want_array.retrieve_array_subset::<ArrayBytes<'static>>(&subset)?.into_fixed()?.into_owned();
            let (got, report) = read_bytes(&array, name, &subset, &config)?;
            assert!(
                got.as_slice() == AsRef::<[u8]>::as_ref(&want),
                "{what} {name} {:?}: device bytes differ from zarrs' ({report:?})",
                subset.to_ranges()
            );
            if let Some(io) = report.io {
                assert_eq!(io.path, IoPath::Remote, "{what} {name}: {io}");
            }
        }
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU, an S3 server and RangeHTTPServer"]
fn device_reads_from_s3_and_http_equal_zarrs_host_reads() -> Result {
    let s3 = Server::s3();
    s3.arrays("")?;
    device_reads_equal(&Arc::new(s3.s3_store("")), &s3.dir("", true), "s3")?;
    // By URL, as the command line and Python open it: the AnyStore is seen through.
    let (url, options) = s3.s3_url("");
    let any = AnyStore::open(&url, options.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    device_reads_equal(&Arc::new(any), &s3.dir("", true), "s3 by URL")?;
    // Any async zarrs store: zarrs_object_store's, through RemoteStore::from_async.
    let async_store = Arc::new(zarrs_object_store::AsyncObjectStore::new(s3.s3_client()?));
    device_reads_equal(
        &Arc::new(RemoteStore::from_async(async_store, "zarrs_object_store")),
        &s3.dir("", true),
        "async",
    )?;
    // Python's HTTP server takes few connections at once: fewer GETs in flight.
    let http = Server::http();
    http.arrays("data")?;
    device_reads_equal(&Arc::new(http.http_store("data").with_concurrency(8)), &http.dir("data", false), "http")?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU and an S3 server"]
fn device_reads_from_s3_in_many_batches_equal_zarrs_host_reads() -> Result {
    use rand::{Rng, SeedableRng};
    use zarrs::array::codec::ZstdCodec;
    use zarrs::array::{data_type, ArrayBuilder, FillValue};
    let s3 = Server::s3();
    s3.arrays("")?;
    // 6 MiB of u16 in 96 KiB chunks, every seventh unwritten (missing): with 1 MiB of staging a
    // whole read takes several batches, each fetched while the one before is decoded.
    let local = Arc::new(FilesystemStore::new(s3.dir("", true))?);
    let array = ArrayBuilder::new(vec![1536, 2048], vec![192, 256], data_type::uint16(), FillValue::from(3u16))
        .bytes_to_bytes_codecs(vec![Arc::new(ZstdCodec::new(3, false))])
        .build(local.clone(), "/batches.zarr")?;
    array.store_metadata()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let grid = array.chunk_grid_shape().to_vec();
    for i in 0..grid[0] {
        for j in 0..grid[1] {
            if (i * grid[1] + j) % 7 == 3 {
                continue;
            }
            let values: Vec<u16> = (0..192 * 256).map(|_| rng.random_range(0..900)).collect();
            array.store_chunk(&[i, j], values)?;
        }
    }
    let remote = Array::open(Arc::new(s3.s3_store("")), "/batches.zarr")?;
    let config = GpuConfig::default().with_staging_bytes(1 << 20);
    let all = remote.subset_all();
    for subset in [all.clone(), ArraySubset::new_with_ranges(&[100..1400, 33..2047])] {
        let want = array.retrieve_array_subset::<Vec<u16>>(&subset)?;
        let (got, report) = remote.retrieve_array_subset_device_opt::<DeviceArray<u16>>(&subset, &config)?;
        assert!(got.to_host()? == want, "{:?}: device values differ from zarrs' ({report:?})", subset.to_ranges());
        let batches = report.stages.iter().find(|s| s.stage == "sizes").map_or(0, |s| s.count);
        assert!(batches >= 4, "{:?}: {batches} batches with 1 MiB of staging ({report:?})", subset.to_ranges());
        assert_eq!(report.io.map(|io| io.path), Some(IoPath::Remote));
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU, an S3 server and RangeHTTPServer"]
fn device_read_from_a_server_gone_is_an_error_naming_the_chunk() -> Result {
    let mut server = Server::s3();
    server.arrays("")?;
    let (url, mut options) = server.s3_url("");
    options.push(("max_retries".into(), "1".into()));
    let array = Array::open(Arc::new(RemoteStore::from_url(&url, options)?), "/zstd.zarr")?;
    let config = GpuConfig::default();
    array.retrieve_array_subset_device_opt::<DeviceArray<u16>>(&array.subset_all(), &config)?;
    server.kill();
    let err = array
        .retrieve_array_subset_device_opt::<DeviceArray<u16>>(&array.subset_all(), &config)
        .unwrap_err()
        .to_string();
    assert!(err.contains("zstd.zarr/c/"), "{err}");
    // The device is still usable: a new server, the same read.
    let again = Server::s3();
    again.arrays("")?;
    device_reads_equal(&Arc::new(again.s3_store("")), &again.dir("", true), "s3 after a failure")?;
    Ok(())
}

/// `from` of `src` read to the device and written into `to` of `dst` from there, as the fixture
/// `name`'s element type (zstd: u16, sharded: f32).
fn device_copy<S: ReadableStorageTraits + 'static, D: zarrs_storage::ReadableWritableStorageTraits + 'static>(
    name: &str,
    src: &Array<S>,
    from: &ArraySubset,
    dst: &Array<D>,
    to: &ArraySubset,
    config: &GpuConfig,
) -> Result<zarrs_gpu::WriteReport> {
    use zarrs_gpu::ArrayDeviceWriteExt;
    Ok(if name == "zstd" {
        dst.store_array_subset_device_opt(
            to,
            &src.retrieve_array_subset_device_opt::<DeviceArray<u16>>(from, config)?.0,
            config,
        )?
    } else {
        dst.store_array_subset_device_opt(
            to,
            &src.retrieve_array_subset_device_opt::<DeviceArray<f32>>(from, config)?.0,
            config,
        )?
    })
}

#[test]
#[ignore = "needs a CUDA GPU and an S3 server"]
fn device_writes_to_s3_read_back_equal() -> Result {
    use zarrs_storage::WritableStorageTraits;

    let server = Server::s3();
    server.arrays("src")?;
    let local = Arc::new(FilesystemStore::new(server.dir("src", true))?);
    let remote = Arc::new(server.s3_store("dst"));
    for name in ["zstd", "sharded"] {
        let path = format!("/{name}.zarr");
        let src = Array::open(local.clone(), &path)?;
        // The source's metadata, PUT as the new array's.
        let metadata = local.get(&zarrs_storage::StoreKey::new(format!("{name}.zarr/zarr.json"))?)?.expect("metadata");
        remote.set(&zarrs_storage::StoreKey::new(format!("{name}.zarr/zarr.json"))?, metadata)?;
        let dst = Array::open(remote.clone(), &path)?;
        let config = GpuConfig::default();
        let all = src.subset_all();
        let want = src.retrieve_array_subset::<ArrayBytes<'static>>(&all)?.into_fixed()?.into_owned();
        let report = device_copy(name, &src, &all, &dst, &all, &config)?;
        let got = dst.retrieve_array_subset::<ArrayBytes<'static>>(&all)?.into_fixed()?.into_owned();
        assert!(got == want, "{name}: the write through S3 read back differs ({report:?})");
        // Another region's values into a tile at an unaligned place: its partial chunks read back
        // from S3, modified on the device, PUT again; the rest of the array as it was.
        let (from, tile) =
            (ArraySubset::new_with_ranges(&[25..35, 10..22]), ArraySubset::new_with_ranges(&[3..13, 5..17]));
        let moved = src.retrieve_array_subset::<ArrayBytes<'static>>(&from)?.into_fixed()?.into_owned();
        let report = device_copy(name, &src, &from, &dst, &tile, &config)?;
        let got = dst.retrieve_array_subset::<ArrayBytes<'static>>(&tile)?.into_fixed()?.into_owned();
        assert!(got == moved, "{name}: the tile written through S3 differs ({report:?})");
        let below = ArraySubset::new_with_ranges(&[13..src.shape()[0], 0..src.shape()[1]]);
        let rest_dst = dst.retrieve_array_subset::<ArrayBytes<'static>>(&below)?.into_fixed()?.into_owned();
        let rest_src = src.retrieve_array_subset::<ArrayBytes<'static>>(&below)?.into_fixed()?.into_owned();
        assert!(rest_dst == rest_src, "{name}: the rows below the tile changed");
    }
    Ok(())
}
