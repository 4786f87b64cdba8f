//! Hostile sizes on the device: requests larger than the free device memory fail at once with
//! the sizes; tiny subsets of huge, mostly missing arrays are read correctly in milliseconds;
//! chunks and shard indexes whose sizes overflow are errors naming them. (The refusals that
//! need no device are tested everywhere, in `tests/hostile.rs` and `tests/cli.rs`.)

use std::sync::Arc;
use std::time::{Duration, Instant};
use zarrs_gpu::DeviceArray;

use serde_json::{json, Value};
use zarrs::array::{Array, ArraySubset};
use zarrs_gpu::{ArrayDeviceExt, DecodePath, GdsStore, GpuConfig, GpuError};

use super::{check, posix, Result};

const TB: u64 = 1 << 40;

/// A float32 Zarr v3 array at node `name` of a store in `dir`, written as JSON (zarrs' builder
/// is not asked to accept hostile shapes), fill value 0.5.
fn huge(dir: &std::path::Path, name: &str, shape: &[u64], chunks: &[u64], codecs: &Value) -> Result<Array<GdsStore>> {
    super::metadata::write_float32(&dir.join(name.trim_start_matches('/')), shape, chunks, 0.5, codecs)?;
    Ok(Array::open(Arc::new(GdsStore::new(dir)?), name)?)
}

fn bytes() -> Value {
    json!([{"name": "bytes", "configuration": {"endian": "little"}}])
}

fn zstd() -> Value {
    json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3, "checksum": false}}])
}

/// Two transposes in a row: no device plan (zarrs decodes on the host).
fn host_only() -> Value {
    json!([{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes", "configuration": {"endian": "little"}}])
}

fn blosc() -> Value {
    json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}])
}

/// Shards with inner chunks of `inner` x `inner` stored with `codecs`, the index at the end.
fn sharded(inner: u64, codecs: &Value) -> Value {
    json!([{"name": "sharding_indexed", "configuration": {
        "chunk_shape": [inner, inner],
        "codecs": codecs,
        "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        "index_location": "end",
    }}])
}

/// Write distinct values over `subset` (row-major position, small integers: exact in f32).
fn write(array: &Array<GdsStore>, subset: &ArraySubset) -> Result {
    let values: Vec<f32> = (0..subset.num_elements()).map(|i| (i % 4093) as f32 - 100.0).collect();
    array.store_array_subset(subset, values)?;
    Ok(())
}

/// Set up the device (context, pools, NVRTC) outside any timing.
fn warm_up(dir: &std::path::Path) -> Result {
    let array = huge(dir, "/warm", &[64, 64], &[32, 32], &zstd())?;
    write(&array, &array.subset_all())?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_larger_than_free_device_memory_fail_at_once() -> Result {
    let dir = tempfile::tempdir()?;
    warm_up(dir.path())?;
    // 4 TiB in 2^20 chunks of 4 MiB; all of 2^40 x 2^40 in ranges of 2^30 (2^62 bytes, 2^40
    // chunks: before the check came first, planning alone would have run for hours).
    let cases = [
        ("/raw", [1u64 << 20, 1 << 20], bytes()),
        ("/zstd", [1 << 20, 1 << 20], zstd()),
        ("/sharded", [1 << 20, 1 << 20], sharded(512, &zstd())),
        ("/blosc", [1 << 20, 1 << 20], blosc()),
        ("/host", [1 << 20, 1 << 20], host_only()),
        ("/huge", [TB, TB], bytes()),
    ];
    for (name, shape, codecs) in cases {
        let array = huge(dir.path(), name, &shape, &[1024, 1024], &codecs)?;
        let subset = ArraySubset::new_with_ranges(&[0..shape[0].min(1 << 30), 0..shape[1].min(1 << 30)]);
        let needed = subset.num_elements() * 4;
        let start = Instant::now();
        let result = array.retrieve_array_subset_device::<DeviceArray<f32>>(&subset);
        let took = start.elapsed();
        let err = result.map(|_| ()).expect_err("larger than any device");
        let message = err.to_string();
        match err {
            GpuError::OutOfMemory { needed: n, free, .. } => {
                assert_eq!(n, needed, "{name}: {message}");
                assert!(free < needed, "{name}: {message}");
                assert!(message.contains(&needed.to_string()) && message.contains(&free.to_string()), "{message}");
            }
            other => return Err(format!("{name}: expected OutOfMemory, got {other}").into()),
        }
        assert!(took < Duration::from_secs(1), "{name}: refused after {took:?}");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn tiny_subsets_of_huge_sparse_arrays_read_correctly_and_fast() -> Result {
    let dir = tempfile::tempdir()?;
    warm_up(dir.path())?;
    // Shards of 2048 x 2048 (inner 512), else chunks of 1024 x 1024: 2^60 or 2^62 of them.
    let arrays = [
        ("/raw", bytes(), [1024, 1024]),
        ("/zstd", zstd(), [1024, 1024]),
        ("/sharded", sharded(512, &zstd()), [2048, 2048]),
    ];
    for (name, codecs, chunks) in arrays {
        let array = huge(dir.path(), name, &[TB, TB], &chunks, &codecs)?;
        // Two written regions, near the origin and near the far corner; everything else missing.
        write(&array, &ArraySubset::new_with_ranges(&[1000..3100, 5000..6100]))?;
        write(&array, &ArraySubset::new_with_ranges(&[TB - 1500..TB, TB - 700..TB]))?;
        let subsets = [
            ArraySubset::new_with_ranges(&[1500..1501, 5500..5501]), // one written element
            ArraySubset::new_with_ranges(&[TB - 1..TB, TB - 1..TB]), // the last element, written
            ArraySubset::new_with_ranges(&[TB / 2..TB / 2 + 1, 77..78]), // one missing element
            ArraySubset::new_with_ranges(&[0..3000, 4000..7000]),    // written and missing chunks
            ArraySubset::new_with_ranges(&[TB - 2000..TB, TB - 3000..TB]),
        ];
        for subset in &subsets {
            let start = Instant::now();
            let (data, report) = array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(subset, &posix())?;
            let took = start.elapsed();
            assert_eq!(data.shape(), subset.shape());
            assert_eq!(report.decode, DecodePath::Device, "{name}");
            assert!(took < Duration::from_secs(1), "{name} {:?}: {took:?}", subset.to_ranges());
            // The same bytes as zarrs' host retrieval.
            check::<f32>(&array, subset, &posix())?;
        }
        // A missing element reads as the fill value.
        let (data, report) =
            array.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&subsets[2], &GpuConfig::default())?;
        assert_eq!(data.to_host()?, vec![0.5f32]);
        assert_eq!((report.chunks, report.missing_chunks), (1, 1), "{name}");
    }
    Ok(())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chunks_and_shard_indexes_whose_sizes_overflow_are_errors() -> Result {
    let dir = tempfile::tempdir()?;
    let one = ArraySubset::new_with_ranges(&[0..1, 0..1]);
    // Chunks of 2^80 elements, uncompressed and zstd: the chunk is named.
    for (name, codecs) in [("/wide", bytes()), ("/wide_zstd", zstd())] {
        let array = huge(dir.path(), name, &[4, 4], &[TB, TB], &codecs)?;
        let err = array.retrieve_array_subset_device::<DeviceArray<f32>>(&one).map(|_| ()).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, GpuError::Overflow(_)), "{name}: {message}");
        let key = array.chunk_key(&[0, 0]);
        assert!(
            message.contains(&format!("chunk {key} of shape [1099511627776, 1099511627776]: 2^80 elements")),
            "{message}"
        );
    }
    // Chunks of 2^60 elements (2^62 bytes) fit u64: uncompressed, a missing one is read in the
    // bytes the subset needs; compressed, it would be decoded whole: more than the device has.
    let tall = huge(dir.path(), "/tall", &[4, 4], &[1 << 30, 1 << 30], &bytes())?;
    let (data, _) = tall.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&one, &posix())?;
    assert_eq!(data.to_host()?, vec![0.5f32]);
    let tall = huge(dir.path(), "/tall_zstd", &[4, 4], &[1 << 30, 1 << 30], &zstd())?;
    let err = tall.retrieve_array_subset_device::<DeviceArray<f32>>(&one).map(|_| ()).unwrap_err();
    assert!(matches!(err, GpuError::OutOfMemory { .. }), "{err}");
    // Shards of 2^80 inner chunks: their index is refused before zarrs sizes it (inner chunks
    // uncompressed: the device route needs no nvCOMP).
    let shards = huge(dir.path(), "/shards", &[TB, TB], &[TB, TB], &sharded(1, &bytes()))?;
    let err = shards.retrieve_array_subset_device::<DeviceArray<f32>>(&one).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("index too large for 64-bit sizes"), "{err}");
    // The last chunk of this grid ends past 2^64.
    let edge = huge(dir.path(), "/edge", &[u64::MAX], &[1 << 63], &bytes())?;
    let last = ArraySubset::new_with_start_shape(vec![u64::MAX - 1], vec![1])?;
    let err = edge.retrieve_array_subset_device::<DeviceArray<f32>>(&last).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("ends past 2^64"), "{err}");
    Ok(())
}

/// A 1 MiB zstd chunk whose file is a sparse 64 GiB (and a shard's inner chunk is bounded the
/// same way): an error naming the chunk at once, when its size is learned, nothing pinned or
/// staged for it; the next read, the file restored, is zarrs'.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_sparse_chunk_file_far_longer_than_its_chunk_is_refused_at_once() -> Result {
    let dir = tempfile::tempdir()?;
    warm_up(dir.path())?;
    let array = huge(dir.path(), "/sparse", &[512, 2048], &[512, 512], &zstd())?;
    write(&array, &array.subset_all())?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    let key = array.chunk_key(&[0, 1]);
    let path = dir.path().join(key.as_str());
    let good = std::fs::read(&path)?;
    let before = zarrs_gpu::memory_in_use(0)?;
    std::fs::OpenOptions::new().write(true).open(&path)?.set_len(64 << 30)?;
    for config in [posix(), GpuConfig::default()] {
        let start = Instant::now();
        let err = array
            .retrieve_array_subset_device_opt::<DeviceArray<f32>>(&array.subset_all(), &config)
            .map(|_| ())
            .unwrap_err();
        let took = start.elapsed();
        let message = err.to_string();
        assert!(message.contains(key.as_str()), "{message}");
        assert!(
            message.contains(&format!("{} stored bytes for {} decoded bytes", 64u64 << 30, 1u64 << 20)),
            "{message}"
        );
        assert!(took < Duration::from_secs(2), "refused after {took:?}");
    }
    let after = zarrs_gpu::memory_in_use(0)?;
    assert!(after.pinned_pooled <= before.pinned_pooled + (64 << 20), "pinned: {before:?} -> {after:?}");
    assert!(after.staging_pooled <= before.staging_pooled + (256 << 20), "staging: {before:?} -> {after:?}");
    std::fs::write(&path, &good)?;
    check::<f32>(&array, &array.subset_all(), &posix())?;
    Ok(())
}

/// A read into a caller's destination larger than the device memory left free beside it: the
/// destination exists already, so only staging counts against free memory (the destination's
/// bytes were counted again: OutOfMemory). The destination here is 55% of the free memory, of a
/// mostly missing array (placing the fill value costs little); two windows of it are compared
/// with zarrs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn reads_into_a_destination_larger_than_the_memory_left_free() -> Result {
    let dir = tempfile::tempdir()?;
    warm_up(dir.path())?;
    let memory = zarrs_gpu::memory_in_use(0)?;
    // What a read sees as free: the driver's figure and what our pools hold idle.
    let free = memory.device_free + memory.output_pool_idle + memory.staging_pooled;
    // Rows of 1 MiB, chunks of 64 x 4096 (1 MiB), a multiple of 64 rows.
    let (row, chunks) = (1u64 << 18, [64u64, 4096]);
    let rows = (free / 20 * 11 / (4 * row)) / 64 * 64;
    let shape = [rows, row];
    let target = huge(dir.path(), "/target", &shape, &chunks, &zstd())?;
    write(&target, &ArraySubset::new_with_ranges(&[10..200, 1000..9000]))?;
    // Another array of the shape, all missing (fill 2.0): a destination the read must overwrite.
    super::metadata::write_float32(&dir.path().join("other"), &shape, &chunks, 2.0, &zstd())?;
    let other = Array::open(Arc::new(GdsStore::new(dir.path())?), "/other")?;
    let config = posix().with_staging_bytes(256 << 20);
    let all = target.subset_all();
    let (mut out, _) = other.retrieve_array_subset_device_opt::<DeviceArray<f32>>(&all, &config)?;
    let report = target.retrieve_array_subset_into_device_opt(&all, &mut out, &config)?;
    assert_eq!(report.decode, DecodePath::Device, "{report:?}");
    let slice = out.as_cuda_slice().ok_or("the destination is ours")?;
    for window in [0..256u64, rows - 64..rows] {
        let subset = ArraySubset::new_with_ranges(&[window.clone(), 0..row]);
        let want = target.retrieve_array_subset::<Vec<f32>>(&subset)?;
        let view = slice.slice((window.start * row) as usize..(window.end * row) as usize);
        let got = out.stream().clone_dtoh(&view)?;
        assert!(got == want, "rows {window:?} differ from zarrs'");
    }
    Ok(())
}
