//! The units the decode pipeline works on: a chunk, an inner chunk of a shard, or a missing one,
//! with where its stored bytes are and where its decoded bytes go.

use crate::plan::{ChunkPlacement, Copy3D};
use crate::GpuError;

/// A chunk read plane by plane is at most this many units (more, thinner planes: read whole).
const MAX_PLANES: u64 = 4096;

/// Check `len` stored bytes of a unit that decodes to `decoded` bytes against the most any
/// encoding the device decodes could take (zstd's and gzip's worst cases are a few bytes in a
/// thousand over, crc32c adds four): far longer is an error, before a buffer is sized to it (a
/// sparse file of 100 GB would otherwise be pinned whole).
pub(crate) fn check_stored_len(len: u64, decoded: u64) -> Result<(), String> {
    if len > decoded.saturating_mul(2).saturating_add(64 << 10) {
        return Err(format!("{len} stored bytes for {decoded} decoded bytes"));
    }
    Ok(())
}

/// Where a unit's stored bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// The whole value at the unit's key (its size is asked batch by batch).
    Whole,
    /// `len` bytes from `offset` of the value at the unit's key (an inner chunk of a shard).
    Range { offset: u64, len: u64 },
    /// Not stored: filled with the fill value.
    Missing,
}

/// What the pipeline decodes: a chunk, or an inner chunk of a shard.
#[derive(Clone, Debug)]
pub(crate) struct Unit {
    /// Where its decoded bytes go; its key is the value its stored bytes are read from.
    pub(crate) placement: ChunkPlacement,
    pub(crate) source: Source,
    /// For an inner chunk, its indices within its shard (named in errors).
    pub(crate) inner: Option<Vec<u64>>,
    /// Only the placement's `byte_start..byte_end` of the chunk is read (uncompressed chunks).
    pub(crate) narrowed: bool,
    /// The whole value's size, when the chain fixes it (an uncompressed chunk is its elements):
    /// a value of another size is an error, not this chunk.
    pub(crate) value_len: Option<u64>,
    /// Where in the output the read lands, for an uncompressed chunk whose needed bytes are one
    /// run of the output: read straight there, nothing to stage or place.
    pub(crate) direct: Option<u64>,
    /// A plane of a chunk after its first ([`Unit::raw_planes`]): not counted as a chunk again.
    pub(crate) part: bool,
}

impl Unit {
    /// Each chunk a whole stored value.
    pub(crate) fn whole(placement: ChunkPlacement) -> Self {
        Self {
            placement,
            source: Source::Whole,
            inner: None,
            narrowed: false,
            value_len: None,
            direct: None,
            part: false,
        }
    }

    /// An uncompressed chunk in the platform's byte order (its own value): only the bytes the
    /// subset needs are read, straight into the output where they are one run of it.
    pub(crate) fn raw(placement: ChunkPlacement) -> Self {
        let source = Source::Range { offset: placement.byte_start, len: placement.read_len() };
        let direct = placement.is_direct().then(|| placement.direct_output_offset());
        let value_len = Some(placement.chunk_bytes);
        Self { placement, source, inner: None, narrowed: true, value_len, direct, part: false }
    }

    /// An uncompressed chunk as [`Unit::raw`], or, where most of the bytes between the first and
    /// the last one a subset needs are not needed (a tile that takes part of each plane of a
    /// chunk reads four times its size), one unit per plane of each of its copies: only the
    /// planes' rows are read (ranges close together still become one read), each plane that is
    /// one run of the output straight into it.
    pub(crate) fn raw_planes(placement: ChunkPlacement) -> Vec<Unit> {
        let needed: u64 = placement.copies.iter().map(|c| c.width * c.height * c.depth).sum();
        let planes: u64 = placement.copies.iter().map(|c| c.depth).sum();
        if placement.is_direct()
            || !(2..=MAX_PLANES).contains(&planes)
            || needed.saturating_mul(2) > placement.read_len()
        {
            return vec![Unit::raw(placement)];
        }
        let mut units = Vec::with_capacity(planes as usize);
        for copy in &placement.copies {
            for z in 0..copy.depth {
                // Within the chunk: offsets below byte_end, which fits in u64.
                let start = placement.byte_start + copy.src_offset + z * copy.src_height * copy.src_pitch;
                let dst_offset = copy.dst_offset + z * copy.dst_height * copy.dst_pitch;
                let plane = Copy3D { src_offset: 0, dst_offset, depth: 1, ..*copy };
                let part = ChunkPlacement {
                    byte_start: start,
                    byte_end: start + plane.src_end(),
                    copies: vec![plane],
                    ..placement.clone()
                };
                units.push(Unit { part: !units.is_empty(), ..Unit::raw(part) });
            }
        }
        units
    }

    /// The whole decoded chunk's bytes (checked once, by `plan_chunks`).
    pub(crate) fn decoded_len(&self) -> u64 {
        self.placement.chunk_bytes
    }

    /// The bytes read for an uncompressed chunk: all of it, or the placement's part.
    pub(crate) fn raw_len(&self) -> u64 {
        if self.narrowed {
            self.placement.read_len()
        } else {
            self.decoded_len()
        }
    }

    /// The chunk's name in errors: its key, and for an inner chunk its indices in the shard.
    pub(crate) fn label(&self) -> String {
        match &self.inner {
            Some(inner) => format!("{} (inner chunk {inner:?})", self.placement.key),
            None => self.placement.key.to_string(),
        }
    }

    pub(crate) fn error(&self, reason: impl Into<String>) -> GpuError {
        GpuError::chunk(self.label(), reason)
    }

    /// This unit's error with a typed cause, kept as the error's `source()`.
    pub(crate) fn error_from(&self, cause: Box<dyn std::error::Error + Send + Sync>) -> GpuError {
        GpuError::Chunk { key: self.label(), reason: cause.to_string(), source: Some(cause) }
    }
}

#[cfg(test)]
mod tests {
    use super::{check_stored_len, Source, Unit};
    use crate::plan::plan_chunks;
    use zarrs::array::ArraySubset;
    use zarrs_storage::StoreKey;

    /// Place `units` (reading their ranges of `chunk`) into an output of `out_len` bytes.
    fn place(units: &[Unit], chunk: &[u8], out_len: usize) -> Vec<u8> {
        let mut out = vec![0u8; out_len];
        for u in units {
            let Source::Range { offset, len } = u.source else { panic!("a range") };
            let read = &chunk[offset as usize..(offset + len) as usize];
            for c in &u.placement.copies {
                c.apply_host(read, &mut out);
            }
        }
        out
    }

    #[test]
    fn tiles_of_uncompressed_chunks_read_plane_by_plane_the_same_bytes() {
        // A 64 x 256 x 256 chunk of u32 at the array's origin; tiles meeting part of it.
        let shape = [64u64, 256, 256];
        let chunk: Vec<u8> = (0..shape.iter().product::<u64>() * 4).map(|i| (i * 7 % 251) as u8).collect();
        let key = StoreKey::new("c/0/0/0").unwrap();
        let whole = ArraySubset::new_with_shape(shape.to_vec());
        for (ranges, split) in [
            ([40..104, 100..356, 180..436], true), // a corner of the chunk: 24 x 156 x 76 of it
            ([0..64, 0..256, 0..256], false),      // the whole chunk, one run
            ([10..20, 0..256, 0..256], false),     // whole planes: one run of the output
            ([0..64, 10..12, 0..256], false),      // needs more than half of what lies between
        ] {
            let subset = ArraySubset::new_with_ranges(&ranges);
            let placement =
                plan_chunks(4, &subset, [(vec![0, 0, 0], key.clone(), whole.clone())]).unwrap().pop().unwrap();
            let out_len = (subset.num_elements() * 4) as usize;
            let want = place(&[Unit::raw(placement.clone())], &chunk, out_len);
            let units = Unit::raw_planes(placement.clone());
            assert_eq!(units.len() > 1, split, "{ranges:?}: {} units", units.len());
            assert_eq!(place(&units, &chunk, out_len), want, "{ranges:?}");
            assert!(!units[0].part && units[1..].iter().all(|u| u.part));
            let read: u64 = units.iter().map(Unit::raw_len).sum();
            assert!(read <= placement.read_len(), "{ranges:?}: {read} read, {} before", placement.read_len());
            if split {
                // The rows of 24 planes (156 of 256 each), not the 24 planes whole.
                assert_eq!(read, 24 * (155 * 1024 + 76 * 4), "{ranges:?}");
            }
        }
    }

    #[test]
    fn stored_sizes_are_bounded_by_the_decoded_size() {
        let mib = 1u64 << 20;
        assert!(check_stored_len(mib + 100, mib).is_ok());
        assert!(check_stored_len(2 * mib + (64 << 10), mib).is_ok());
        assert!(check_stored_len(0, 0).is_ok() && check_stored_len(64 << 10, 0).is_ok());
        let err = check_stored_len(64 << 30, mib).unwrap_err();
        assert_eq!(err, format!("{} stored bytes for {mib} decoded bytes", 64u64 << 30));
        assert!(check_stored_len(u64::MAX, u64::MAX).is_ok() && check_stored_len(u64::MAX, 1).is_err());
    }
}
