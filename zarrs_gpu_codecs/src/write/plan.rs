//! A write's plan: the chunks (or shards) a subset meets, where the data goes in each, the old
//! values read first where the subset covers a chunk in part, and a shard's inner chunks (which
//! of them are encoded again).

use std::sync::Arc;

use zarrs::array::{Array, ArraySubset};
use zarrs_storage::StoreKey;

use super::codec::WriteChain;
use crate::error::GpuError;
use crate::pipeline::plan::{plan_chunks, ChunkPlacement, Copy3D};
use crate::pipeline::route::chunks_meeting;
use crate::pipeline::shard::{nested_origins, ShardLevel};

/// A chunk (or shard) of a write: where it lies, whether the subset covers all of its part within
/// the array (else its old value is read first), and a shard's inner chunks.
pub(super) struct WriteUnit {
    pub(super) placement: ChunkPlacement,
    /// The chunk reaches past the array's edge: the elements there hold the fill value.
    pub(super) edge: bool,
    /// Old values read before the chunk is assembled (regions of the array, bounded by its edge)
    /// and the copies that put each into the chunk's place: a chunk covered in part, its part
    /// within the array; a shard covered in part, the parts of the inner chunks covered in part.
    pub(super) olds: Vec<(ArraySubset, Vec<Copy3D>)>,
    pub(super) inner: Option<Arc<InnerChunks>>,
    /// A shard covered in part: the inner chunks it encodes again (those the subset meets, in C
    /// order of the inner grid); the others keep their stored bytes. None: all of them.
    pub(super) touched: Option<Vec<usize>>,
}

impl WriteUnit {
    /// The values it encodes (its inner chunks, or itself) and the raw bytes of each.
    pub(super) fn encoded(&self) -> (usize, u64) {
        match (&self.inner, &self.touched) {
            (None, _) => (1, self.placement.chunk_bytes),
            (Some(inner), Some(touched)) => (touched.len(), inner.bytes),
            (Some(inner), None) => (inner.count, inner.bytes),
        }
    }

    /// Bytes of its inner chunks' slots (those it encodes), one after another.
    pub(super) fn slots_len(&self) -> u64 {
        self.inner.as_ref().map_or(0, |inner| inner.slot.saturating_mul(self.encoded().0 as u64))
    }
}

/// A shard's inner chunks, gathered from its raw bytes (C order of the shard's shape) into slots
/// [`SLOT_ALIGN`]-aligned one after another, in C order of the inner grid (the shard's layout).
pub(super) struct InnerChunks {
    pub(super) count: usize,
    /// Raw bytes of each, and of its slot ([`SLOT_ALIGN`]-aligned).
    pub(super) bytes: u64,
    pub(super) slot: u64,
    /// The copies from the shard's bytes into the slots: those of inner chunk k (into slot k) are
    /// `copies[per_chunk[k]]`.
    pub(super) copies: Vec<Copy3D>,
    pub(super) per_chunk: Vec<std::ops::Range<usize>>,
}

/// Where chunks start in a device buffer of chunks to encode (nvCOMP's alignment, and more).
pub(super) const SLOT_ALIGN: u64 = 256;

impl InnerChunks {
    /// The innermost chunks of a shard of `shard_shape` whose levels' inner shapes are
    /// `inner_shapes` (outermost first; one for a shard of chunks), elements of `elem` bytes, in
    /// the order [`nested_origins`] lists them.
    fn new(elem: u64, shard_shape: &[u64], inner_shapes: &[&[u64]]) -> Result<Self, GpuError> {
        let inner_shape = *inner_shapes.last().ok_or_else(|| GpuError::Unsupported("no sharding level".into()))?;
        let shard = ArraySubset::new_with_shape(shard_shape.to_vec());
        let grid: Vec<u64> = shard_shape.iter().zip(inner_shape).map(|(&s, &c)| s / c.max(1)).collect();
        let count = grid.iter().try_fold(1u64, |n, &g| n.checked_mul(g));
        let bytes = inner_shape.iter().try_fold(elem, |n, &c| n.checked_mul(c));
        let (Some(count), Some(bytes)) = (count, bytes) else {
            return Err(GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem));
        };
        let slot = bytes
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or_else(|| GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem))?;
        let key = StoreKey::new("inner").expect("a valid key");
        let (mut copies, mut per_chunk) = (Vec::new(), Vec::new());
        for (k, start) in nested_origins(shard_shape, inner_shapes).into_iter().enumerate() {
            let indices: Vec<u64> = start.iter().zip(inner_shape).map(|(&o, &c)| o / c.max(1)).collect();
            let chunk = ArraySubset::new_with_start_shape(start, inner_shape.to_vec())
                .map_err(|e| GpuError::Array(e.into()))?;
            let placement =
                plan_chunks(elem, &shard, [(indices, key.clone(), chunk)])?.pop().expect("inside the shard");
            // A read's copies (chunk to shard), reversed into slot k.
            let base =
                slot.checked_mul(k as u64).ok_or_else(|| GpuError::bytes_overflow("a shard of", shard_shape, elem))?;
            let first = copies.len();
            copies.extend(placement.copies.iter().map(|c| reversed(c, base + placement.byte_start)));
            per_chunk.push(first..copies.len());
        }
        let count = usize::try_from(count).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Ok(Self { count, bytes, slot, copies, per_chunk })
    }
}

/// The parts within the array (bounded by its `shape`) of the inner chunks of `inner_shape` of a
/// shard at `shard` (unbounded), in C order of the inner grid; None for one wholly past the edge.
fn inner_parts(shard: &ArraySubset, inner_shape: &[u64], shape: &[u64]) -> Result<Vec<Option<ArraySubset>>, GpuError> {
    let grid: Vec<u64> = shard.shape().iter().zip(inner_shape).map(|(&s, &c)| s / c.max(1)).collect();
    ArraySubset::new_with_shape(grid)
        .indices()
        .into_iter()
        .map(|indices| {
            let mut ranges = Vec::with_capacity(indices.len());
            for (((&i, &c), &origin), &end) in indices.iter().zip(inner_shape).zip(shard.start()).zip(shape) {
                // Within the shard, whose end was checked.
                let start = origin + i * c;
                if start >= end {
                    return Ok(None);
                }
                ranges.push(start..(start + c).min(end));
            }
            Ok(Some(ArraySubset::new_with_ranges(&ranges)))
        })
        .collect()
}

/// Inner chunks of `inner_shape` in a shard at `shard` (past the array's edge too).
fn inner_parts_count(shard: &ArraySubset, inner_shape: &[u64]) -> usize {
    shard.shape().iter().zip(inner_shape).map(|(&s, &c)| (s / c.max(1)) as usize).product()
}

/// Whether two subsets share an element.
fn meets(a: &ArraySubset, b: &ArraySubset) -> bool {
    a.start()
        .iter()
        .zip(a.shape())
        .zip(b.start().iter().zip(b.shape()))
        .all(|((&a0, &an), (&b0, &bn))| a0 < b0 + bn && b0 < a0 + an)
}

/// Whether `outer` holds every element of `inner`.
fn covers(outer: &ArraySubset, inner: &ArraySubset) -> bool {
    outer
        .start()
        .iter()
        .zip(outer.shape())
        .zip(inner.start().iter().zip(inner.shape()))
        .all(|((&o0, &on), (&i0, &in_))| o0 <= i0 && i0 + in_ <= o0 + on)
}

/// A read's copy (stored chunk to output) the other way: from the output into the chunk's
/// bytes, which start at `chunk_at`.
pub(super) fn reversed(c: &Copy3D, chunk_at: u64) -> Copy3D {
    Copy3D {
        src_offset: c.dst_offset,
        dst_offset: chunk_at + c.src_offset,
        src_pitch: c.dst_pitch,
        src_height: c.dst_height,
        dst_pitch: c.src_pitch,
        dst_height: c.src_height,
        ..*c
    }
}

/// The units of a write of `subset` (elements of `elem` bytes): each chunk (or shard) it meets,
/// where its data goes, the old values read first, a shard's inner chunks and which of them it
/// encodes again.
pub(super) fn plan_units<S: ?Sized>(
    array: &Array<S>,
    subset: &ArraySubset,
    chain: &WriteChain,
    elem: u64,
) -> Result<Vec<WriteUnit>, GpuError> {
    let chunks = chunks_meeting(array, subset)?;
    let mut units = Vec::with_capacity(chunks.len());
    // Shards of one shape share their inner layout (a regular grid has one shape).
    let mut layouts: Vec<(Vec<u64>, Arc<InnerChunks>)> = Vec::new();
    for (indices, key, chunk) in chunks {
        // The chunk's part within the array: covered by the subset, nothing of it is read.
        let within: Vec<std::ops::Range<u64>> = chunk
            .start()
            .iter()
            .zip(chunk.shape())
            .zip(array.shape())
            .map(|((&a, &n), &e)| a..(a + n).min(e))
            .collect();
        let whole = within
            .iter()
            .zip(subset.start().iter().zip(subset.shape()))
            .all(|(r, (&s, &n))| s <= r.start && r.end <= s + n);
        let edge = within.iter().zip(chunk.shape()).any(|(r, &n)| r.end - r.start < n);
        let within = ArraySubset::new_with_ranges(&within);
        // A read of the chunk into `region` (within the array), reversed: the old values' copies.
        let old = |region: ArraySubset| -> Result<(ArraySubset, Vec<Copy3D>), GpuError> {
            let old = plan_chunks(elem, &region, [(indices.clone(), key.clone(), chunk.clone())])?.pop();
            let old = old.expect("a chunk meets its own part");
            let copies = old.copies.iter().map(|c| reversed(c, old.byte_start)).collect();
            Ok((region, copies))
        };
        let (olds, touched) = match chain.shards.as_slice() {
            _ if whole => (Vec::new(), None),
            // A chunk, or nested shards (encoded whole again), covered in part.
            [] | [_, _, ..] => (vec![old(within.clone())?], None),
            // A shard covered in part: its inner chunks the subset meets are encoded again (those
            // it covers in part read first), the others kept as they are stored.
            [level] => {
                let (mut olds, mut touched) = (Vec::new(), Vec::new());
                for (k, part) in inner_parts(&chunk, level.inner_shape(), array.shape())?.into_iter().enumerate() {
                    let Some(part) = part else { continue };
                    if !meets(&part, subset) {
                        continue;
                    }
                    touched.push(k);
                    if !covers(subset, &part) {
                        olds.push(old(part)?);
                    }
                }
                // Every inner chunk met: nothing to keep (the shard is encoded whole).
                let count = inner_parts_count(&chunk, level.inner_shape());
                (olds, (touched.len() != count).then_some(touched))
            }
        };
        let placement = plan_chunks(elem, subset, [(indices, key, chunk)])?.pop().expect("the chunk meets the subset");
        let inner = if chain.shards.is_empty() {
            None
        } else if let Some((_, inner)) = layouts.iter().find(|(shape, _)| *shape == placement.chunk_shape) {
            Some(inner.clone())
        } else {
            let shapes: Vec<&[u64]> = chain.shards.iter().map(ShardLevel::inner_shape).collect();
            let inner = Arc::new(InnerChunks::new(elem, &placement.chunk_shape, &shapes)?);
            layouts.push((placement.chunk_shape.clone(), inner.clone()));
            Some(inner)
        };
        units.push(WriteUnit { placement, edge, olds, inner, touched });
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_parts_of_edge_shards_and_the_inner_chunks_a_tile_meets() {
        let sub = |r: &[std::ops::Range<u64>]| ArraySubset::new_with_ranges(r);
        // A shard of 8 x 16 in 4 x 8 inner chunks, at the array's edge (14 x 30).
        let parts = inner_parts(&sub(&[8..16, 16..32]), &[4, 8], &[14, 30]).unwrap();
        let want = [sub(&[8..12, 16..24]), sub(&[8..12, 24..30]), sub(&[12..14, 16..24]), sub(&[12..14, 24..30])];
        assert_eq!(parts, want.map(Some).to_vec());
        // Inner chunks wholly past the edge have no part.
        let parts = inner_parts(&sub(&[8..16, 16..32]), &[4, 8], &[12, 24]).unwrap();
        assert_eq!(parts, vec![Some(sub(&[8..12, 16..24])), None, None, None]);
        assert!(meets(&sub(&[0..4, 0..4]), &sub(&[3..9, 3..9])) && !meets(&sub(&[0..4, 0..4]), &sub(&[4..9, 0..9])));
        assert!(
            covers(&sub(&[0..10, 0..10]), &sub(&[3..10, 0..1])) && !covers(&sub(&[0..10, 1..10]), &sub(&[3..9, 0..2]))
        );
        // The GPU test's tile (5..37, 20..70, 33..90 of 40 x 70 x 90) in shards of 16 x 32 x 64
        // and inner chunks of 8 x 16 x 32 meets 5 x 4 x 2 inner chunks and covers 3 x 3 x 1 of
        // their parts within the array whole (z 8..32, y 32..70, x 64..90): 31 are read first.
        let tile = sub(&[5..37, 20..70, 33..90]);
        let (mut met, mut covered) = (0, 0);
        for (z, y, x) in (0..3u64).flat_map(|z| (0..3u64).flat_map(move |y| (0..2u64).map(move |x| (z, y, x)))) {
            let shard = sub(&[z * 16..z * 16 + 16, y * 32..y * 32 + 32, x * 64..x * 64 + 64]);
            for part in inner_parts(&shard, &[8, 16, 32], &[40, 70, 90]).unwrap().into_iter().flatten() {
                met += usize::from(meets(&part, &tile));
                covered += usize::from(covers(&tile, &part));
            }
        }
        assert_eq!((met, covered), (40, 9));
    }
}
