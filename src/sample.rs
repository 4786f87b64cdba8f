//! Sample arrays: smooth signal plus noise, like microscopy volumes, written with zarrs.

use std::path::Path;
use std::sync::Arc;

use rayon::prelude::*;
use zarrs::array::codec::ShardingCodecBuilder;
use zarrs::array::{data_type, Array, ArrayBuilder, ArrayError, BytesToBytesCodecTraits};
use zarrs_storage::ReadableWritableListableStorageTraits;

use crate::GdsStore;

/// The sample value at flat index `i` of an array of shape `shape`: a smooth field plus a little
/// deterministic noise (compresses about 3:1 with zstd, like real float data).
#[must_use]
pub fn sample_value(i: u64, shape: &[u64]) -> f32 {
    let mut rest = i;
    let mut coord = [0f32; 3];
    for (d, &n) in shape.iter().enumerate().rev() {
        // A zero extent holds no elements: any value will do, but no division by zero.
        let c = rest.checked_rem(n).unwrap_or(0);
        rest = rest.checked_div(n).unwrap_or(0);
        coord[slot(d, shape.len())] += c as f32;
    }
    sample_at(coord, i)
}

/// Dimension `d` of `ndim` feeds coordinate slot z, y or x: the last three dimensions map to
/// z, y, x and leading ones fold into z.
fn slot(d: usize, ndim: usize) -> usize {
    (d + 3).saturating_sub(ndim).min(2)
}

/// The sample value at coordinates `[z, y, x]` (leading dimensions folded into z) and flat index:
/// a smooth field rounded to integers plus 4 bits of noise, which zstd level 3 compresses about
/// 3.2:1 (like the float data of the project's brief).
fn sample_at(coord: [f32; 3], flat: u64) -> f32 {
    let smooth = (coord[2] * 0.011).sin() * (coord[1] * 0.007).cos() * 1000.0 + coord[0] * 0.5;
    let mut h = flat.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^= h >> 29;
    smooth.round() + (h & 0xF) as f32
}

/// The store at `path` when one is given; else a new temporary directory with `write` called
/// on `name` in it (the examples' and the command line's "no path: a sample"). The directory is
/// returned too: it is removed when dropped.
///
/// # Errors
/// Returns `write`'s error, or the temporary directory's.
pub fn given_or_sample(
    path: Option<&Path>,
    name: &str,
    write: impl FnOnce(&Path) -> Result<(), Box<dyn std::error::Error + Send + Sync>>,
) -> Result<(std::path::PathBuf, Option<tempfile::TempDir>), Box<dyn std::error::Error + Send + Sync>> {
    if let Some(path) = path {
        return Ok((path.into(), None));
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(name);
    write(&path)?;
    Ok((path, Some(dir)))
}

/// Create a float32 Zarr v3 array (codec chain `bytes` only, fill value NaN) at `path` in a new
/// directory store and write every chunk with [`sample_value`], in parallel.
///
/// # Errors
/// Returns zarrs' error when the store or a chunk cannot be written.
pub fn create_sample_array(
    path: &Path,
    shape: &[u64],
    chunk_shape: &[u64],
) -> Result<Array<GdsStore>, Box<dyn std::error::Error + Send + Sync>> {
    create_sample_array_with_codecs(path, shape, chunk_shape, vec![])
}

/// As [`create_sample_array`], with these bytes-to-bytes codecs (zstd, crc32c, ...).
///
/// # Errors
/// Returns zarrs' error when the store or a chunk cannot be written.
pub fn create_sample_array_with_codecs(
    path: &Path,
    shape: &[u64],
    chunk_shape: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
) -> Result<Array<GdsStore>, Box<dyn std::error::Error + Send + Sync>> {
    let store = Arc::new(GdsStore::new(path)?);
    let array = ArrayBuilder::new(shape.to_vec(), chunk_shape.to_vec(), data_type::float32(), f32::NAN)
        .bytes_to_bytes_codecs(codecs)
        .build(store, "/")?;
    array.store_metadata()?;
    write_sample_chunks(&array)?;
    Ok(array)
}

/// As [`create_sample_array_with_codecs`], sharded: shards of `shard_shape` (the array's chunks)
/// holding inner chunks of `inner_shape` stored with `codecs`, index at the end with crc32c.
///
/// # Errors
/// Returns zarrs' error when the store or a shard cannot be written, or the shapes do not fit.
pub fn create_sharded_sample_array(
    path: &Path,
    shape: &[u64],
    shard_shape: &[u64],
    inner_shape: &[u64],
    codecs: Vec<Arc<dyn BytesToBytesCodecTraits>>,
) -> Result<Array<GdsStore>, Box<dyn std::error::Error + Send + Sync>> {
    let inner: Vec<std::num::NonZeroU64> = inner_shape
        .iter()
        .map(|&n| std::num::NonZeroU64::new(n).ok_or("inner chunk shape has a zero"))
        .collect::<Result<_, _>>()?;
    let sharding = ShardingCodecBuilder::new(inner, &data_type::float32()).bytes_to_bytes_codecs(codecs).build_arc();
    let store = Arc::new(GdsStore::new(path)?);
    let array = ArrayBuilder::new(shape.to_vec(), shard_shape.to_vec(), data_type::float32(), f32::NAN)
        .array_to_bytes_codec(sharding)
        .build(store, "/")?;
    array.store_metadata()?;
    write_sample_chunks(&array)?;
    Ok(array)
}

/// Write every chunk of a float32 array with [`sample_value`], in parallel.
///
/// # Errors
/// Returns zarrs' error when a chunk cannot be written, and an error when the array has no
/// dimensions or its element count, or its chunks' end, overflows u64.
pub fn write_sample_chunks<S: ReadableWritableListableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
) -> Result<(), ArrayError> {
    let grid = array.chunk_grid_shape().to_vec();
    let shape = array.shape().to_vec();
    if shape.is_empty() {
        return Err(ArrayError::Other("sample arrays have at least one dimension".into()));
    }
    // Checked once: every flat index and stride below is then less than the element count, and
    // the grid has no more chunks than elements (a chunk's start lies inside the array).
    let too_large = || ArrayError::Other(format!("a sample array of shape {shape:?} has more than 2^64 elements"));
    shape.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).ok_or_else(too_large)?;
    let count = grid.iter().try_fold(1u64, |acc, &n| acc.checked_mul(n)).ok_or_else(too_large)?;
    let strides: Vec<u64> = (0..shape.len()).map(|d| shape[d + 1..].iter().product::<u64>()).collect();
    (0..count).into_par_iter().try_for_each(|c| {
        let indices = zarrs::array::unravel_index(c, &grid).ok_or_else(|| ArrayError::Other("unravel".into()))?;
        // zarrs' chunk_subset adds unchecked; the last chunk may end past 2^64.
        let (origin, chunk_shape) = (array.chunk_origin(&indices)?, array.chunk_shape(&indices)?);
        let ranges = origin
            .iter()
            .zip(chunk_shape.iter())
            .map(|(&o, n)| o.checked_add(n.get()).map(|end| o..end))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ArrayError::Other(format!("chunk {indices:?} of the sample array ends past 2^64")))?;
        let subset = zarrs::array::ArraySubset::new_with_ranges(&ranges);
        let len = subset.shape().iter().try_fold(1u64, |acc, &n| acc.checked_mul(n));
        let len = len.and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
            ArrayError::Other(format!("chunk shape {:?} has more elements than memory could hold", subset.shape()))
        })?;
        // Row by row: only the last coordinate changes along a row.
        let last = shape.len() - 1;
        let mut rows = subset.shape().to_vec();
        let row_len = rows[last];
        rows[last] = 1;
        let mut values = Vec::with_capacity(len);
        for row in &zarrs::array::ArraySubset::new_with_start_shape(subset.start().to_vec(), rows)?.indices() {
            let outside = row.iter().zip(&shape).take(last).any(|(i, n)| i >= n);
            let mut coord = [0f32; 3];
            for (d, &c) in row.iter().enumerate().take(last) {
                coord[slot(d, shape.len())] += c as f32;
            }
            // Inside the array the flat index is less than the element count (checked above).
            let base: u64 = if outside { 0 } else { row.iter().zip(&strides).map(|(i, s)| i * s).sum() };
            for k in 0..row_len {
                let x = row[last] + k;
                values.push(if outside || x >= shape[last] {
                    0.0
                } else {
                    coord[2] = x as f32;
                    sample_at(coord, base + k)
                });
            }
        }
        array.store_chunk(&indices, values)
    })
}
