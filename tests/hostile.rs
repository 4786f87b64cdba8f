//! Hostile metadata and requests through the library: sizes that overflow u64 are refused with
//! a message naming them, before any CUDA call (so these run everywhere), and planning costs
//! what the chunks meeting a subset cost, never the whole grid.

use std::error::Error;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zarrs_gpu::DeviceArray;

use serde_json::json;
use zarrs::array::{Array, ArraySubset};
use zarrs_gpu::zarrs_gpu_codecs::plan::plan_chunks;
use zarrs_gpu::{ArrayDeviceExt, GdsStore, GpuError};

#[path = "common/metadata.rs"]
mod metadata;

type Result<T = ()> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

const TB: u64 = 1 << 40;

/// Write a float32 Zarr v3 array's `zarr.json` (no chunks) at `dir/name` and open it.
fn array(dir: &Path, name: &str, shape: &[u64], chunks: &[u64], codecs: &serde_json::Value) -> Result<Array<GdsStore>> {
    let path = dir.join(name);
    metadata::write_float32(&path, shape, chunks, 0.0, codecs)?;
    Ok(Array::open(Arc::new(GdsStore::new(&path)?), "/")?)
}

fn bytes() -> serde_json::Value {
    json!([{"name": "bytes", "configuration": {"endian": "little"}}])
}

/// A device read of `subset` as f32: its error (a read that succeeds fails the test), and how
/// long it took.
fn refused(array: &Array<GdsStore>, subset: &ArraySubset) -> Result<(GpuError, Duration)> {
    let start = Instant::now();
    match array.retrieve_array_subset_device::<DeviceArray<f32>>(subset) {
        Ok(data) => Err(format!("read {:?} of {:?}: expected a refusal", data.shape(), subset.to_ranges()).into()),
        Err(err) => Ok((err, start.elapsed())),
    }
}

fn overflow_message(err: &GpuError) -> Result<&str> {
    match err {
        GpuError::Overflow(message) => Ok(message),
        other => Err(format!("expected an overflow error, got: {other}").into()),
    }
}

#[test]
fn whole_reads_whose_size_overflows_are_refused_at_once() -> Result {
    let dir = tempfile::tempdir()?;
    // The arrays: 2^80 and 2^69 elements.
    let big = array(dir.path(), "big.zarr", &[TB, TB], &[1024, 1024], &bytes())?;
    let (err, took) = refused(&big, &big.subset_all())?;
    assert_eq!(
        overflow_message(&err)?,
        "the subset of shape [1099511627776, 1099511627776]: 2^80 elements of 4 bytes overflow u64"
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    let tall = array(dir.path(), "tall.zarr", &[1 << 63, 64], &[1024, 64], &bytes())?;
    let (err, took) = refused(&tall, &tall.subset_all())?;
    assert!(overflow_message(&err)?.contains("2^69 elements of 4 bytes overflow u64"), "{err}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // 2^62 elements of 4 bytes: 2^64 bytes, one too many.
    let (err, _) = refused(&tall, &ArraySubset::new_with_ranges(&[0..1 << 56, 0..64]))?;
    assert!(overflow_message(&err)?.contains("2^62 elements of 4 bytes"), "{err}");
    // Any codecs: the size is checked before the route is chosen.
    let zstd = json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 3, "checksum": false}}]);
    let compressed = array(dir.path(), "zstd.zarr", &[TB, TB], &[1024, 1024], &zstd)?;
    overflow_message(&refused(&compressed, &compressed.subset_all())?.0)?;
    let blosc = json!([{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": "shuffle", "typesize": 4, "blocksize": 0}}]);
    let blosc = array(dir.path(), "blosc.zarr", &[TB, TB], &[1024, 1024], &blosc)?;
    overflow_message(&refused(&blosc, &blosc.subset_all())?.0)?;
    // A chain with no device plan (two transposes: zarrs decodes on the host).
    let transposes = json!([{"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "transpose", "configuration": {"order": [1, 0]}}, {"name": "bytes", "configuration": {"endian": "little"}}]);
    let host = array(dir.path(), "transposes.zarr", &[TB, TB], &[1024, 1024], &transposes)?;
    assert!(
        zarrs_gpu::zarrs_gpu_codecs::host_decode_reason(&host).is_some_and(|r| r.contains("no device implementation"))
    );
    overflow_message(&refused(&host, &host.subset_all())?.0)?;
    Ok(())
}

#[test]
fn hostile_subsets_and_chunk_boxes_are_errors() -> Result {
    let dir = tempfile::tempdir()?;
    let big = array(dir.path(), "big.zarr", &[TB, TB], &[1024, 1024], &bytes())?;
    // A subset whose end overflows: named as such (zarrs' own Display of it would overflow).
    for subset in [
        ArraySubset::new_with_start_shape(vec![u64::MAX, 0], vec![2, 1])?,
        ArraySubset::new_with_start_shape(vec![0, u64::MAX], vec![1, u64::MAX])?,
    ] {
        let (err, _) = refused(&big, &subset)?;
        assert!(overflow_message(&err)?.contains("ends past 2^64"), "{err}");
    }
    // Out of bounds, or of another dimensionality: invalid.
    for subset in [ArraySubset::new_with_ranges(&[0..TB + 1, 0..1]), ArraySubset::new_with_shape(vec![1])] {
        let (err, _) = refused(&big, &subset)?;
        assert!(matches!(&err, GpuError::Array(zarrs::array::ArrayError::InvalidArraySubset(..))), "{err}");
    }
    // Chunk boxes outside the grid (or whose end overflows) are invalid chunk indices.
    for chunks in [
        ArraySubset::new_with_start_shape(vec![u64::MAX, 0], vec![2, 1])?,
        ArraySubset::new_with_ranges(&[0..TB, 0..1]),
    ] {
        let err = big.retrieve_chunks_device::<DeviceArray<f32>>(&chunks).map(|_| ()).unwrap_err();
        assert!(matches!(&err, GpuError::Array(zarrs::array::ArrayError::InvalidChunkGridIndicesError(_))), "{err}");
    }
    let err = big.retrieve_chunk_device::<DeviceArray<f32>>(&[TB, 0]).map(|_| ()).unwrap_err();
    assert!(matches!(&err, GpuError::Array(zarrs::array::ArrayError::InvalidChunkGridIndicesError(_))), "{err}");
    // All of the grid: 2^80 elements again.
    let all = ArraySubset::new_with_shape(big.chunk_grid_shape().to_vec());
    let err = big.retrieve_chunks_device::<DeviceArray<f32>>(&all).map(|_| ()).unwrap_err();
    assert!(overflow_message(&err)?.contains("2^80 elements"), "{err}");
    Ok(())
}

#[test]
fn chunks_whose_size_or_end_overflows_are_refused() -> Result {
    let dir = tempfile::tempdir()?;
    // One chunk of 2^80 elements: reading it whole overflows; planning a part of it names it.
    let wide = array(dir.path(), "wide.zarr", &[4, 4], &[TB, TB], &bytes())?;
    let err = wide.retrieve_chunk_device::<DeviceArray<f32>>(&[0, 0]).map(|_| ()).unwrap_err();
    assert!(overflow_message(&err)?.contains("2^80 elements of 4 bytes"), "{err}");
    let subset = ArraySubset::new_with_ranges(&[0..1, 0..1]);
    let grid = wide.chunks_in_array_subset(&subset)?.ok_or("a regular grid")?;
    let chunks: Vec<_> =
        grid.indices().into_iter().map(|i| (i.to_vec(), wide.chunk_key(&i), wide.chunk_subset(&i))).collect();
    assert_eq!(chunks.len(), 1);
    let chunks = chunks.into_iter().map(|(i, k, s)| Ok((i, k, s?))).collect::<Result<Vec<_>>>()?;
    let err = plan_chunks(4, &subset, chunks).unwrap_err();
    assert_eq!(
        overflow_message(&err)?,
        "chunk c/0/0 of shape [1099511627776, 1099511627776]: 2^80 elements of 4 bytes overflow u64"
    );
    // A grid whose last chunk ends past 2^64 (zarrs' chunk_subset would overflow).
    let edge = array(dir.path(), "edge.zarr", &[u64::MAX], &[1 << 63], &bytes())?;
    for err in [
        edge.retrieve_chunk_device::<DeviceArray<f32>>(&[1]).map(|_| ()).unwrap_err(),
        edge.retrieve_chunks_device::<DeviceArray<f32>>(&ArraySubset::new_with_start_shape(vec![1], vec![1])?)
            .map(|_| ())
            .unwrap_err(),
    ] {
        assert!(overflow_message(&err)?.contains("ends past 2^64"), "{err}");
    }
    Ok(())
}

#[test]
fn planning_costs_the_chunks_meeting_the_subset() -> Result {
    let dir = tempfile::tempdir()?;
    let big = array(dir.path(), "big.zarr", &[TB, TB], &[1024, 1024], &bytes())?;
    // What retrieval plans from: zarrs' chunks meeting the subset, then plan_chunks. One element
    // far into the array, and a 3000 x 3000 box over 16 chunks: milliseconds either way.
    for (subset, count) in [
        (ArraySubset::new_with_ranges(&[TB - 7..TB - 6, 123_456_789..123_456_790]), 1),
        (ArraySubset::new_with_ranges(&[5_000_000..5_003_000, TB - 4000..TB - 1000]), 16),
    ] {
        let start = Instant::now();
        let grid = big.chunks_in_array_subset(&subset)?.ok_or("a regular grid")?;
        let chunks = grid
            .indices()
            .into_iter()
            .map(|i| Ok((i.to_vec(), big.chunk_key(&i), big.chunk_subset(&i)?)))
            .collect::<Result<Vec<_>>>()?;
        let plan = plan_chunks(4, &subset, chunks)?;
        let took = start.elapsed();
        assert_eq!(plan.len(), count);
        assert!(took < Duration::from_millis(200), "{took:?}");
    }
    Ok(())
}

#[test]
fn transpose_orders_of_another_dimensionality_are_not_decoded_on_the_device() -> Result {
    let dir = tempfile::tempdir()?;
    let codecs = json!([{"name": "transpose", "configuration": {"order": [0, 1, 2]}}, {"name": "bytes", "configuration": {"endian": "little"}}]);
    let array = array(dir.path(), "t.zarr", &[8, 8], &[4, 4], &codecs)?;
    let reason = zarrs_gpu::zarrs_gpu_codecs::host_decode_reason(&array).ok_or("a reason")?;
    assert!(reason.contains("transpose order [0, 1, 2] does not fit 2 dimensions"), "{reason}");
    Ok(())
}
