//! Planning of device reads: which chunks meet a subset, which bytes of each to read, and where
//! each lands in the output, as strided copies of at most three dimensions.

use zarrs::array::ArraySubset;
use zarrs_storage::StoreKey;

use crate::error::GpuError;

/// Bytes of a C-order buffer of `shape` elements of `elem` bytes, None when that overflows u64.
#[must_use]
pub fn checked_bytes(shape: &[u64], elem: u64) -> Option<u64> {
    shape.iter().try_fold(elem, |acc, &n| acc.checked_mul(n))
}

fn invalid(reason: String) -> GpuError {
    GpuError::Array(zarrs::array::ArrayError::Other(reason))
}

/// Whether the box of `shape` at `start` ends within u64 in every dimension (and, given a
/// `bound`, within it). No allocation: this runs for every chunk, inner chunks included.
pub(crate) fn end_fits(start: &[u64], shape: &[u64], bound: Option<&[u64]>) -> bool {
    start.iter().zip(shape).enumerate().all(|(d, (&a, &n))| {
        a.checked_add(n).is_some_and(|end| bound.is_none_or(|b| b.get(d).is_some_and(|&limit| end <= limit)))
    })
}

/// A strided copy of at most three dimensions between two buffers, in bytes: `depth` slices of
/// `height` rows of `width` contiguous bytes (what `cuMemcpy3D` takes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy3D {
    /// Offset of the first byte in the source.
    pub src_offset: u64,
    /// Offset of the first byte in the destination.
    pub dst_offset: u64,
    /// Contiguous bytes per row.
    pub width: u64,
    /// Rows per slice.
    pub height: u64,
    /// Slices.
    pub depth: u64,
    /// Source bytes from one row to the next.
    pub src_pitch: u64,
    /// Source rows from one slice to the next (slice stride = `src_pitch * src_height`).
    pub src_height: u64,
    /// Destination bytes from one row to the next.
    pub dst_pitch: u64,
    /// Destination rows from one slice to the next.
    pub dst_height: u64,
}

impl Copy3D {
    /// Whether source and destination are both one contiguous run.
    #[must_use]
    pub fn is_contiguous(&self) -> bool {
        self.height == 1 && self.depth == 1
    }

    /// The bytes it copies.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.width * self.height * self.depth
    }

    /// One past the last source byte touched.
    #[must_use]
    pub fn src_end(&self) -> u64 {
        self.src_offset + ((self.depth - 1) * self.src_height + (self.height - 1)) * self.src_pitch + self.width
    }

    /// Apply on host buffers: the reference for the device copy, used by tests.
    pub fn apply_host(&self, src: &[u8], dst: &mut [u8]) {
        for z in 0..self.depth {
            for y in 0..self.height {
                let s = (self.src_offset + (z * self.src_height + y) * self.src_pitch) as usize;
                let d = (self.dst_offset + (z * self.dst_height + y) * self.dst_pitch) as usize;
                let w = self.width as usize;
                dst[d..d + w].copy_from_slice(&src[s..s + w]);
            }
        }
    }
}

/// Lower the copy of box `extent` at `src_start` of a C-order buffer of shape `src_shape` to
/// `dst_start` of one of shape `dst_shape` (elements of `elem` bytes) into 3-D copies: adjacent
/// dimensions that are contiguous in both buffers merge, and dimensions beyond three loop.
///
/// # Errors
/// Returns an error when the arguments differ in length, `elem` is 0, the box leaves either
/// buffer, or a buffer's size overflows u64 (within those bounds no offset can overflow).
pub fn region_copies(
    elem: u64,
    src_shape: &[u64],
    src_start: &[u64],
    dst_shape: &[u64],
    dst_start: &[u64],
    extent: &[u64],
) -> Result<Vec<Copy3D>, GpuError> {
    let n = extent.len();
    if [src_shape.len(), src_start.len(), dst_shape.len(), dst_start.len()].iter().any(|&l| l != n) || elem == 0 {
        return Err(invalid(format!(
            "a copy of box {extent:?} of {elem}-byte elements from {src_start:?} of {src_shape:?} to {dst_start:?} of {dst_shape:?} does not fit its buffers"
        )));
    }
    let inside = |start: &[u64], shape: &[u64]| end_fits(start, extent, Some(shape));
    if !inside(src_start, src_shape) || !inside(dst_start, dst_shape) {
        return Err(invalid(format!(
            "a copy of box {extent:?} from {src_start:?} of {src_shape:?} to {dst_start:?} of {dst_shape:?} leaves its buffers"
        )));
    }
    for (what, shape) in [("copy source of shape", src_shape), ("copy destination of shape", dst_shape)] {
        if checked_bytes(shape, elem).is_none() {
            return Err(GpuError::bytes_overflow(what, shape, elem));
        }
    }
    if extent.contains(&0) {
        return Ok(Vec::new());
    }
    let strides = |shape: &[u64]| -> Vec<u64> {
        let mut strides = vec![elem; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * shape[i + 1];
        }
        strides
    };
    let (src_strides, dst_strides) = (strides(src_shape), strides(dst_shape));
    let dot = |start: &[u64], strides: &[u64]| start.iter().zip(strides).map(|(a, b)| a * b).sum::<u64>();
    let (src_base, dst_base) = (dot(src_start, &src_strides), dot(dst_start, &dst_strides));
    // Dimensions as (extent, src stride, dst stride), innermost last, merged where contiguous.
    let mut dims: Vec<(u64, u64, u64)> = Vec::new();
    for i in 0..extent.len() {
        dims.push((extent[i], src_strides[i], dst_strides[i]));
    }
    dims.retain(|d| d.0 != 1);
    dims.push((1, elem, elem)); // a unit innermost dimension so even a single element has one
    let mut merged: Vec<(u64, u64, u64)> = Vec::new();
    for &(n, s, d) in dims.iter().rev() {
        match merged.last_mut() {
            Some(inner) if s == inner.0 * inner.1 && d == inner.0 * inner.2 => inner.0 *= n,
            _ => merged.push((n, s, d)),
        }
    }
    merged.reverse(); // outermost first again; the last is contiguous (strides elem)
    let inner = merged.pop().unwrap_or((1, elem, elem)); // never empty: the unit dimension
    let width = inner.0 * elem;
    let row = merged.pop().unwrap_or((1, width, width));
    let slice = merged.pop().unwrap_or((1, row.0 * row.1, row.0 * row.2));
    let outer = merged; // loop over these
    let copy = |src_offset: u64, dst_offset: u64| Copy3D {
        src_offset,
        dst_offset,
        width,
        height: row.0,
        depth: slice.0,
        src_pitch: row.1,
        src_height: slice.1 / row.1,
        dst_pitch: row.2,
        dst_height: slice.2 / row.2,
    };
    let count: u64 = outer.iter().map(|d| d.0).product();
    // One copy per outer position, at most one per element of the box: reserved fallibly, so
    // that a box of billions of tiny rows is an error rather than an abort.
    let mut copies = Vec::new();
    usize::try_from(count).ok().and_then(|n| copies.try_reserve_exact(n).ok()).ok_or_else(|| {
        invalid(format!("a copy of box {extent:?} needs {count} strided copies, more than memory holds"))
    })?;
    copies.extend((0..count).map(|mut linear| {
        let (mut s, mut d) = (src_base, dst_base);
        for &(n, ss, ds) in outer.iter().rev() {
            let i = linear % n;
            linear /= n;
            s += i * ss;
            d += i * ds;
        }
        copy(s, d)
    }));
    Ok(copies)
}

/// How one chunk contributes to a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkPlacement {
    /// The chunk's grid indices.
    pub chunk_indices: Vec<u64>,
    /// The chunk's key.
    pub key: StoreKey,
    /// The chunk's full shape (as stored).
    pub chunk_shape: Vec<u64>,
    /// Bytes of the whole decoded chunk (`chunk_shape` elements), checked against overflow once
    /// here.
    pub chunk_bytes: u64,
    /// The parts of the chunk that land in the output: one per subset of the request that the
    /// chunk meets (see [`ChunkPlacement::absorb`]).
    pub parts: Vec<PlacementPart>,
    /// The bytes of the chunk's decoded form to read: `byte_start..byte_end`.
    pub byte_start: u64,
    /// One past the last byte to read.
    pub byte_end: u64,
    /// Copies from the bytes read (offsets relative to `byte_start`) into the output.
    pub copies: Vec<Copy3D>,
}

/// One part of a chunk placed in the output: the box of the chunk that meets one subset, and
/// where it lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementPart {
    /// The part of the chunk that meets the subset, relative to the chunk.
    pub chunk_region: ArraySubset,
    /// Where that part lands, relative to the subset.
    pub output_region: ArraySubset,
    /// The subset's shape: its output is C order of this shape.
    pub output_shape: Vec<u64>,
    /// Where the subset's output starts in the request's output, in bytes.
    pub output_base: u64,
}

impl ChunkPlacement {
    /// Move the placement to a subset whose output starts `base` bytes into the request's
    /// output (the copies' destinations shift by as much).
    ///
    /// # Errors
    /// Returns an error when a destination then overflows u64.
    pub fn shift_output(&mut self, base: u64) -> Result<(), GpuError> {
        let overflow = || GpuError::Overflow(format!("chunk {}: an output offset + {base} overflows", self.key));
        for copy in &mut self.copies {
            copy.dst_offset = copy.dst_offset.checked_add(base).ok_or_else(overflow)?;
        }
        for part in &mut self.parts {
            part.output_base = part.output_base.checked_add(base).ok_or_else(overflow)?;
        }
        Ok(())
    }

    /// Take `other`, the same chunk placed for another subset of the request, into this one: the
    /// bytes read become the span of both, and every copy and part of both is kept, so that the
    /// chunk is read and decoded once and placed wherever the request needs it.
    ///
    /// # Errors
    /// Returns an error when `other` is another chunk (key, indices or shape).
    pub fn absorb(&mut self, other: ChunkPlacement) -> Result<(), GpuError> {
        if other.key != self.key || other.chunk_indices != self.chunk_indices || other.chunk_shape != self.chunk_shape {
            return Err(invalid(format!("chunk {} cannot take the placement of chunk {}", self.key, other.key)));
        }
        let start = self.byte_start.min(other.byte_start);
        let end = self.byte_end.max(other.byte_end);
        // Copies' sources are relative to byte_start, which moves to the span's start.
        for copy in &mut self.copies {
            copy.src_offset += self.byte_start - start;
        }
        self.copies.extend(
            other.copies.into_iter().map(|c| Copy3D { src_offset: c.src_offset + (other.byte_start - start), ..c }),
        );
        self.parts.extend(other.parts);
        self.byte_start = start;
        self.byte_end = end;
        Ok(())
    }

    /// Bytes to read.
    #[must_use]
    pub fn read_len(&self) -> u64 {
        self.byte_end - self.byte_start
    }

    /// Whether the bytes read are exactly the bytes of one contiguous run of the output, so that
    /// they can be read straight into it.
    #[must_use]
    pub fn is_direct(&self) -> bool {
        self.copies.len() == 1 && self.copies[0].is_contiguous() && self.copies[0].width == self.read_len()
    }

    /// Where a direct read lands in the output.
    #[must_use]
    pub fn direct_output_offset(&self) -> u64 {
        self.copies[0].dst_offset
    }
}

/// Plan the read of `subset` from chunks of a regular grid.
///
/// `chunks` lists, for each chunk meeting the subset, its indices, key and the subset of the
/// array it covers (unbounded: the full chunk shape, as stored). Chunks that do not meet the
/// subset are skipped.
///
/// # Errors
/// Returns an error when a chunk's dimensionality differs from the subset's, or the subset's or
/// a chunk's end or byte size overflows u64 (all later offsets then fit).
pub fn plan_chunks(
    elem: u64,
    subset: &ArraySubset,
    chunks: impl IntoIterator<Item = (Vec<u64>, StoreKey, ArraySubset)>,
) -> Result<Vec<ChunkPlacement>, GpuError> {
    if !end_fits(subset.start(), subset.shape(), None) {
        return Err(GpuError::Overflow(format!(
            "the subset {:?} + {:?} ends past 2^64",
            subset.start(),
            subset.shape()
        )));
    }
    if checked_bytes(subset.shape(), elem).is_none() {
        return Err(GpuError::bytes_overflow("the subset of shape", subset.shape(), elem));
    }
    let mut placements = Vec::new();
    for (chunk_indices, key, chunk_subset) in chunks {
        let chunk_shape = chunk_subset.shape().to_vec();
        if chunk_subset.dimensionality() != subset.dimensionality() {
            return Err(invalid(format!(
                "chunk {key} has {} dimensions, the subset {}",
                chunk_subset.dimensionality(),
                subset.dimensionality()
            )));
        }
        if !end_fits(chunk_subset.start(), &chunk_shape, None) {
            return Err(GpuError::Overflow(format!(
                "chunk {key} at {:?} of shape {chunk_shape:?} ends past 2^64",
                chunk_subset.start()
            )));
        }
        let chunk_bytes = checked_bytes(&chunk_shape, elem)
            .ok_or_else(|| GpuError::bytes_overflow(&format!("chunk {key} of shape"), &chunk_shape, elem))?;
        // Both ends fit in u64, so zarrs' overlap arithmetic cannot overflow.
        let overlap = chunk_subset.overlap(subset).map_err(|e| GpuError::Array(e.into()))?;
        if overlap.is_empty() {
            continue;
        }
        let chunk_region = overlap.relative_to(chunk_subset.start()).map_err(|e| GpuError::Array(e.into()))?;
        let output_region = overlap.relative_to(subset.start()).map_err(|e| GpuError::Array(e.into()))?;
        let mut copies = region_copies(
            elem,
            &chunk_shape,
            chunk_region.start(),
            subset.shape(),
            output_region.start(),
            chunk_region.shape(),
        )?;
        let byte_start = copies.first().map_or(0, |c| c.src_offset);
        let byte_end = copies.iter().map(Copy3D::src_end).max().unwrap_or(0);
        for copy in &mut copies {
            copy.src_offset -= byte_start;
        }
        placements.push(ChunkPlacement {
            chunk_indices,
            key,
            chunk_shape,
            chunk_bytes,
            parts: vec![PlacementPart {
                chunk_region,
                output_region,
                output_shape: subset.shape().to_vec(),
                output_base: 0,
            }],
            byte_start,
            byte_end,
            copies,
        });
    }
    Ok(placements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(clippy::too_many_arguments)]
    fn reference_copy(
        elem: usize,
        src_shape: &[u64],
        src_start: &[u64],
        dst_shape: &[u64],
        dst_start: &[u64],
        extent: &[u64],
        src: &[u8],
        dst: &mut [u8],
    ) {
        let region = ArraySubset::new_with_shape(extent.to_vec());
        let lin = |shape: &[u64], idx: &[u64]| idx.iter().zip(shape).fold(0u64, |acc, (i, n)| acc * n + i) as usize;
        for idx in &region.indices() {
            let s: Vec<u64> = idx.iter().zip(src_start).map(|(a, b)| a + b).collect();
            let d: Vec<u64> = idx.iter().zip(dst_start).map(|(a, b)| a + b).collect();
            let (s, d) = (lin(src_shape, &s) * elem, lin(dst_shape, &d) * elem);
            dst[d..d + elem].copy_from_slice(&src[s..s + elem]);
        }
    }

    #[test]
    fn region_copies_match_elementwise_copy() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..400 {
            let ndim = rng.random_range(1..=5);
            let elem = [1u64, 2, 4, 8, 16][rng.random_range(0..5)];
            let src_shape: Vec<u64> = (0..ndim).map(|_| rng.random_range(1..6)).collect();
            let dst_shape: Vec<u64> = (0..ndim).map(|_| rng.random_range(1..6)).collect();
            let extent: Vec<u64> = (0..ndim).map(|i| rng.random_range(1..=src_shape[i].min(dst_shape[i]))).collect();
            let src_start: Vec<u64> = (0..ndim).map(|i| rng.random_range(0..=src_shape[i] - extent[i])).collect();
            let dst_start: Vec<u64> = (0..ndim).map(|i| rng.random_range(0..=dst_shape[i] - extent[i])).collect();
            let n = |s: &[u64]| s.iter().product::<u64>() as usize * elem as usize;
            let src: Vec<u8> = (0..n(&src_shape)).map(|_| rng.random()).collect();
            let mut want = vec![0u8; n(&dst_shape)];
            let mut got = want.clone();
            reference_copy(elem as usize, &src_shape, &src_start, &dst_shape, &dst_start, &extent, &src, &mut want);
            let copies = region_copies(elem, &src_shape, &src_start, &dst_shape, &dst_start, &extent).unwrap();
            for c in &copies {
                assert!(c.width > 0 && c.height > 0 && c.depth > 0);
                assert!(c.src_pitch >= c.width || c.height == 1, "{c:?}");
                c.apply_host(&src, &mut got);
            }
            assert_eq!(got, want, "src {src_shape:?}@{src_start:?} dst {dst_shape:?}@{dst_start:?} extent {extent:?}");
        }
    }

    #[test]
    fn whole_chunks_of_full_rows_merge_to_one_contiguous_copy() {
        // chunk (4, 8, 8) inside an array (16, 8, 8): every chunk is one contiguous run.
        let copies = region_copies(4, &[4, 8, 8], &[0, 0, 0], &[16, 8, 8], &[8, 0, 0], &[4, 8, 8]).unwrap();
        assert_eq!(copies.len(), 1);
        assert!(copies[0].is_contiguous());
        assert_eq!((copies[0].dst_offset, copies[0].width), (8 * 64 * 4, 4 * 64 * 4));
        // chunk (64, 256, 256) inside (512, 2048, 2048): 64 slices of 256 rows of 1 KiB.
        let c =
            region_copies(4, &[64, 256, 256], &[0; 3], &[512, 2048, 2048], &[64, 256, 512], &[64, 256, 256]).unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!((c[0].width, c[0].height, c[0].depth), (1024, 256, 64));
        assert_eq!((c[0].dst_pitch, c[0].dst_height), (8192, 2048));
    }

    /// Extents anywhere in u64, edges weighted.
    fn extent() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![Just(0u64), Just(1), Just(u64::MAX), Just(1 << 32), Just(1 << 63), any::<u64>(), 1..9u64]
    }

    /// Box extents that are small or too large to fit with another dimension: four or more of
    /// them never make billions of strided copies (with up to three any extent is one copy).
    fn box_extent() -> impl proptest::strategy::Strategy<Value = u64> {
        use proptest::prelude::*;
        prop_oneof![Just(0u64), Just(u64::MAX), Just(1 << 63), 1..9u64]
    }

    /// `(subset start, subset shape, chunk start, chunk shape)` per dimension: any extents in up
    /// to three dimensions, small or huge ones in four and five.
    fn boxes() -> impl proptest::strategy::Strategy<Value = Vec<(u64, u64, u64, u64)>> {
        use proptest::prelude::*;
        prop_oneof![
            proptest::collection::vec((extent(), extent(), extent(), extent()), 1..4),
            proptest::collection::vec((extent(), box_extent(), extent(), box_extent()), 4..6),
        ]
    }

    proptest::proptest! {
        /// Whatever the subset and chunk boxes (huge, overflowing, mismatched), planning never
        /// panics; a plan it returns stays within the chunk's and the output's bytes.
        #[test]
        fn plan_chunks_never_panics_and_stays_in_bounds(
            elem in proptest::prop_oneof![proptest::strategy::Just(0u64), 1..17u64],
            dims in boxes(),
            extra_dim in proptest::bool::weighted(0.05),
        ) {
            let subset = ArraySubset::new_with_start_shape(
                dims.iter().map(|d| d.0).collect(), dims.iter().map(|d| d.1).collect()).unwrap();
            let mut start: Vec<u64> = dims.iter().map(|d| d.2).collect();
            let mut shape: Vec<u64> = dims.iter().map(|d| d.3).collect();
            if extra_dim {
                start.push(0);
                shape.push(1);
            }
            let chunk = ArraySubset::new_with_start_shape(start, shape).unwrap();
            let key = StoreKey::new("c/0").unwrap();
            if let Ok(plan) = plan_chunks(elem, &subset, [(vec![0], key, chunk.clone())]) {
                let out = checked_bytes(subset.shape(), elem).unwrap();
                for p in &plan {
                    proptest::prop_assert_eq!(Some(p.chunk_bytes), checked_bytes(chunk.shape(), elem));
                    proptest::prop_assert!(p.byte_start <= p.byte_end && p.byte_end <= p.chunk_bytes);
                    for c in &p.copies {
                        proptest::prop_assert!(c.src_end() <= p.read_len());
                        let dst_end = c.dst_offset + ((c.depth - 1) * c.dst_height + (c.height - 1)) * c.dst_pitch + c.width;
                        proptest::prop_assert!(dst_end <= out, "{c:?} past {out}");
                    }
                }
            }
        }

        /// region_copies refuses boxes that leave their buffers or buffers whose size
        /// overflows; it never panics.
        #[test]
        fn region_copies_never_panic(
            elem in 0..9u64,
            dims in proptest::collection::vec((extent(), extent(), extent(), extent(), box_extent()), 0..6),
        ) {
            let col = |k: usize| -> Vec<u64> {
                dims.iter().map(|d| [d.0, d.1, d.2, d.3, d.4][k]).collect()
            };
            let _ = region_copies(elem, &col(0), &col(1), &col(2), &col(3), &col(4));
        }
    }
}
