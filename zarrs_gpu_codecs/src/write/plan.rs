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
use crate::pipeline::shard::ShardLevel;

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
/// Nothing is kept per inner chunk: a write that meets few of a shard's many inner chunks plans
/// only those ([`InnerChunks::copies`]).
pub(super) struct InnerChunks {
    pub(super) count: usize,
    /// Raw bytes of each, and of its slot ([`SLOT_ALIGN`]-aligned).
    pub(super) bytes: u64,
    pub(super) slot: u64,
    elem: u64,
    shard_shape: Vec<u64>,
    /// The levels' inner shapes, outermost first.
    inner_shapes: Vec<Vec<u64>>,
}

/// Where chunks start in a device buffer of chunks to encode (nvCOMP's alignment, and more).
pub(super) const SLOT_ALIGN: u64 = 256;

/// Bytes of a shard index entry (offset and length, u64 each): a shard's inner chunk count must
/// leave its index addressable.
const INDEX_ENTRY: u64 = 16;

impl InnerChunks {
    /// The innermost chunks of a shard of `shard_shape` whose levels' inner shapes are
    /// `inner_shapes` (outermost first; one for a shard of chunks), elements of `elem` bytes, in
    /// the order [`nested_origins`] lists them.
    fn new(elem: u64, shard_shape: &[u64], inner_shapes: &[&[u64]]) -> Result<Self, GpuError> {
        let inner_shape = *inner_shapes.last().ok_or_else(|| GpuError::Unsupported("no sharding level".into()))?;
        // Every level's grid, multiplied: the innermost chunks of the shard (nested order).
        let mut count = Some(1u64);
        let mut outer = shard_shape;
        for shape in inner_shapes {
            for (&s, &c) in outer.iter().zip(*shape) {
                count = count.and_then(|n| n.checked_mul(s / c.max(1)));
            }
            outer = shape;
        }
        let bytes = inner_shape.iter().try_fold(elem, |n, &c| n.checked_mul(c));
        let (Some(count), Some(bytes)) = (count.filter(|n| n.checked_mul(INDEX_ENTRY).is_some()), bytes) else {
            return Err(GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem));
        };
        let slot = bytes
            .checked_next_multiple_of(SLOT_ALIGN)
            .ok_or_else(|| GpuError::bytes_overflow("inner chunks of shape", inner_shape, elem))?;
        let count = usize::try_from(count)
            .map_err(|_| GpuError::Unsupported(format!("{count} inner chunks in a shard of shape {shard_shape:?}")))?;
        Ok(Self {
            count,
            bytes,
            slot,
            elem,
            shard_shape: shard_shape.to_vec(),
            inner_shapes: inner_shapes.iter().map(|s| s.to_vec()).collect(),
        })
    }

    /// Where innermost chunk `k` (in the order [`nested_origins`] lists them) starts in the shard.
    fn origin(&self, mut k: u64) -> Vec<u64> {
        let mut origin = vec![0u64; self.shard_shape.len()];
        let mut outer = self.shard_shape.as_slice();
        for (level, shape) in self.inner_shapes.iter().enumerate() {
            let grid: Vec<u64> = outer.iter().zip(shape).map(|(&s, &c)| s / c.max(1)).collect();
            // Innermost chunks in each of this level's inner shards.
            let mut below = 1u64;
            let mut o = shape.as_slice();
            for deeper in &self.inner_shapes[level + 1..] {
                below *= o.iter().zip(deeper).map(|(&s, &c)| s / c.max(1)).product::<u64>();
                o = deeper;
            }
            let mut index = k / below.max(1);
            k %= below.max(1);
            for d in (0..grid.len()).rev() {
                let g = grid[d].max(1);
                origin[d] += (index % g) * shape[d];
                index /= g;
            }
            outer = shape;
        }
        origin
    }

    /// The copies that gather innermost chunk `k` from the shard's raw bytes (C order of its
    /// shape) into slot `k`.
    pub(super) fn copies(&self, k: usize) -> Result<Vec<Copy3D>, GpuError> {
        let inner_shape = self.inner_shapes.last().expect("a level, checked when made");
        let start = self.origin(k as u64);
        let indices: Vec<u64> = start.iter().zip(inner_shape).map(|(&o, &c)| o / c.max(1)).collect();
        let shard = ArraySubset::new_with_shape(self.shard_shape.clone());
        let chunk =
            ArraySubset::new_with_start_shape(start, inner_shape.clone()).map_err(|e| GpuError::Array(e.into()))?;
        let key = StoreKey::new("inner").expect("a valid key");
        let placement = plan_chunks(self.elem, &shard, [(indices, key, chunk)])?.pop().expect("inside the shard");
        // A read's copies (chunk to shard), reversed into slot k.
        let base = self
            .slot
            .checked_mul(k as u64)
            .ok_or_else(|| GpuError::bytes_overflow("a shard of", &self.shard_shape, self.elem))?;
        Ok(placement.copies.iter().map(|c| reversed(c, base + placement.byte_start)).collect())
    }
}

/// The inner chunks of `inner_shape` of a shard at `shard` (unbounded) that `subset` meets, with
/// their parts within the array (bounded by its `shape`), in C order of the inner grid: each one's
/// index in that order and its part. Only those met are listed (a write of one element into a
/// shard of millions of inner chunks plans one).
fn inner_parts_met(
    shard: &ArraySubset,
    inner_shape: &[u64],
    shape: &[u64],
    subset: &ArraySubset,
) -> Result<Vec<(usize, ArraySubset)>, GpuError> {
    let grid: Vec<u64> = shard.shape().iter().zip(inner_shape).map(|(&s, &c)| s / c.max(1)).collect();
    // Per dimension, the inner indices the subset (within the array) meets.
    let mut met = Vec::with_capacity(grid.len());
    for d in 0..grid.len() {
        let c = inner_shape[d].max(1);
        let origin = shard.start()[d];
        let lo = subset.start()[d].max(origin);
        let hi = (subset.start()[d] + subset.shape()[d]).min(shape[d]).min(origin + grid[d] * c);
        if lo >= hi {
            return Ok(Vec::new());
        }
        met.push((lo - origin) / c..(hi - origin).div_ceil(c));
    }
    let region = ArraySubset::new_with_ranges(&met);
    let mut parts = Vec::new();
    for indices in &region.indices() {
        let mut ranges = Vec::with_capacity(indices.len());
        let mut k = 0u64;
        for (d, &i) in indices.iter().enumerate() {
            // Within the shard, whose end was checked.
            let start = shard.start()[d] + i * inner_shape[d];
            ranges.push(start..(start + inner_shape[d]).min(shape[d]));
            k = k * grid[d] + i;
        }
        let k = usize::try_from(k).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        parts.push((k, ArraySubset::new_with_ranges(&ranges)));
    }
    Ok(parts)
}

/// Inner chunks of `inner_shape` in a shard at `shard` (past the array's edge too), None when
/// their number does not fit.
fn inner_parts_count(shard: &ArraySubset, inner_shape: &[u64]) -> Option<usize> {
    shard
        .shape()
        .iter()
        .zip(inner_shape)
        .try_fold(1usize, |n, (&s, &c)| n.checked_mul(usize::try_from(s / c.max(1)).ok()?))
}

/// Whether two subsets share an element.
#[cfg(test)]
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
                for (k, part) in inner_parts_met(&chunk, level.inner_shape(), array.shape(), subset)? {
                    touched.push(k);
                    if !covers(subset, &part) {
                        olds.push(old(part)?);
                    }
                }
                // Every inner chunk met: nothing to keep (the shard is encoded whole).
                let count = inner_parts_count(&chunk, level.inner_shape());
                (olds, (Some(touched.len()) != count).then_some(touched))
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
    use crate::pipeline::shard::nested_origins;

    /// The parts of the inner chunks of a shard that `subset` meets, as (index, part).
    fn met(shard: &ArraySubset, inner: &[u64], shape: &[u64], subset: &ArraySubset) -> Vec<(usize, ArraySubset)> {
        inner_parts_met(shard, inner, shape, subset).unwrap()
    }

    #[test]
    fn inner_parts_of_edge_shards_and_the_inner_chunks_a_tile_meets() {
        let sub = |r: &[std::ops::Range<u64>]| ArraySubset::new_with_ranges(r);
        // A shard of 8 x 16 in 4 x 8 inner chunks, at the array's edge (14 x 30).
        let parts = met(&sub(&[8..16, 16..32]), &[4, 8], &[14, 30], &sub(&[0..14, 0..30]));
        let want = [sub(&[8..12, 16..24]), sub(&[8..12, 24..30]), sub(&[12..14, 16..24]), sub(&[12..14, 24..30])];
        assert_eq!(parts, want.into_iter().enumerate().collect::<Vec<_>>());
        // Inner chunks wholly past the edge are not met.
        let parts = met(&sub(&[8..16, 16..32]), &[4, 8], &[12, 24], &sub(&[0..12, 0..24]));
        assert_eq!(parts, vec![(0, sub(&[8..12, 16..24]))]);
        // Of those within, only those the subset meets, by their index in the shard's grid.
        let parts = met(&sub(&[8..16, 16..32]), &[4, 8], &[14, 30], &sub(&[13..14, 20..25]));
        assert_eq!(parts, vec![(2, sub(&[12..14, 16..24])), (3, sub(&[12..14, 24..30]))]);
        assert!(meets(&sub(&[0..4, 0..4]), &sub(&[3..9, 3..9])) && !meets(&sub(&[0..4, 0..4]), &sub(&[4..9, 0..9])));
        assert!(
            covers(&sub(&[0..10, 0..10]), &sub(&[3..10, 0..1])) && !covers(&sub(&[0..10, 1..10]), &sub(&[3..9, 0..2]))
        );
        // The GPU test's tile (5..37, 20..70, 33..90 of 40 x 70 x 90) in shards of 16 x 32 x 64
        // and inner chunks of 8 x 16 x 32 meets 5 x 4 x 2 inner chunks and covers 3 x 3 x 1 of
        // their parts within the array whole (z 8..32, y 32..70, x 64..90): 31 are read first.
        let tile = sub(&[5..37, 20..70, 33..90]);
        let (mut n, mut covered) = (0, 0);
        for (z, y, x) in (0..3u64).flat_map(|z| (0..3u64).flat_map(move |y| (0..2u64).map(move |x| (z, y, x)))) {
            let shard = sub(&[z * 16..z * 16 + 16, y * 32..y * 32 + 32, x * 64..x * 64 + 64]);
            for (_, part) in met(&shard, &[8, 16, 32], &[40, 70, 90], &tile) {
                assert!(meets(&part, &tile));
                n += 1;
                covered += usize::from(covers(&tile, &part));
            }
        }
        assert_eq!((n, covered), (40, 9));
    }

    #[test]
    fn a_one_element_write_into_a_shard_of_a_huge_inner_grid_plans_one_inner_chunk() {
        // A shard of 2^20 x 2^20 one-element inner chunks (2^40 of them): planning enumerated
        // every one (terabytes of plans) before; now one, and the layout keeps nothing per chunk.
        let side = 1u64 << 20;
        let shard = ArraySubset::new_with_shape(vec![side, side]);
        let one = ArraySubset::new_with_ranges(&[5..6, 7..8]);
        let start = std::time::Instant::now();
        let parts = met(&shard, &[1, 1], &[side, side], &one);
        assert_eq!(parts, vec![(usize::try_from(5 * side + 7).unwrap(), one.clone())]);
        let inner = InnerChunks::new(1, &[side, side], &[&[1, 1]]).unwrap();
        assert_eq!(inner.count, 1 << 40);
        assert_eq!(inner.copies(parts[0].0).unwrap().len(), 1);
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "planning took {:?}", start.elapsed());
        // A count whose index cannot be addressed is an error naming the shape, not a panic.
        let huge = u64::MAX / 2;
        let err = InnerChunks::new(1, &[huge, 4], &[&[1, 1]]).err().expect("an index past 2^64 bytes");
        assert!(err.to_string().contains("[1, 1]"), "{err}");
    }

    #[test]
    fn each_inner_chunk_is_gathered_from_where_nested_origins_puts_it() {
        // Nested shards: 8 x 12 of 4 x 6 of 2 x 3, elements of 2 bytes.
        let inner = InnerChunks::new(2, &[8, 12], &[&[4, 6], &[2, 3]]).unwrap();
        let origins = nested_origins(&[8, 12], &[&[4, 6], &[2, 3]]);
        assert_eq!(inner.count, origins.len());
        for (k, want) in origins.iter().enumerate() {
            assert_eq!(&inner.origin(k as u64), want, "inner chunk {k}");
            // Two rows of 3 elements, from row `want[0]`, column `want[1]` of the shard.
            let copies = inner.copies(k).unwrap();
            let from: u64 = copies.iter().map(|c| c.src_offset).min().unwrap();
            assert_eq!(from, (want[0] * 12 + want[1]) * 2, "inner chunk {k}");
            assert!(copies
                .iter()
                .all(|c| c.dst_offset >= k as u64 * inner.slot && c.dst_offset < (k as u64 + 1) * inner.slot));
        }
    }
}
