//! The units the decode pipeline works on: a chunk, an inner chunk of a shard, or a missing one,
//! with where its stored bytes are and where its decoded bytes go.

use zarrs_gds_store::ValueVersion;

use crate::error::GpuError;
use crate::pipeline::plan::{ChunkPlacement, Copy3D};

/// Check `len` stored bytes of a unit that decodes to `decoded` bytes against the most any
/// encoding the device decodes could take (zstd's and gzip's worst cases are a few bytes in a
/// thousand over, crc32c adds four): far longer is an error, before a buffer is sized to it (a
/// sparse file of 100 GB would otherwise be pinned whole).
pub(crate) fn check_stored_len(len: u64, decoded: u64) -> Result<(), String> {
    if len > max_stored_len(decoded) {
        return Err(format!("{len} stored bytes for {decoded} decoded bytes"));
    }
    Ok(())
}

/// The most stored bytes [`check_stored_len`] lets a unit of `decoded` bytes take.
pub(crate) fn max_stored_len(decoded: u64) -> u64 {
    decoded.saturating_mul(2).saturating_add(64 << 10)
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
    /// For an uncompressed chunk read row by row ([`Unit::read_as_rows`]): its copies as they lie
    /// in the bytes `source` names, whose rows are read packed one after another; the
    /// placement's copies then take them from there.
    pub(crate) rows: Option<Vec<Copy3D>>,
    /// For an inner chunk, the version of its shard's value that its index was read from: its
    /// bytes are read from that version or not at all (a shard replaced since its index was read
    /// has other bytes at the same offsets).
    pub(crate) version: Option<ValueVersion>,
}

/// Rows narrower than this are not read one by one (a `preadv` entry each).
const MIN_ROW: u64 = 256;

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
            rows: None,
            version: None,
        }
    }

    /// An uncompressed chunk in the platform's byte order (its own value): only the bytes the
    /// subset needs are read, straight into the output where they are one run of it.
    pub(crate) fn raw(placement: ChunkPlacement) -> Self {
        let source = Source::Range { offset: placement.byte_start, len: placement.read_len() };
        let direct = placement.is_direct().then(|| placement.direct_output_offset());
        let value_len = Some(placement.chunk_bytes);
        Self { placement, source, inner: None, narrowed: true, value_len, direct, rows: None, version: None }
    }

    /// Read only the rows this uncompressed chunk's part needs, packed, where that is at most
    /// half of its narrowed range (a tile's part of a chunk: the gaps between its rows are most
    /// of the range) and its rows are at least [`MIN_ROW`] bytes; the placement's copies then
    /// read the packed rows. Other units stay as they are.
    pub(crate) fn read_as_rows(&mut self) {
        let copies = &self.placement.copies;
        let needed = copies.iter().map(Copy3D::bytes).sum::<u64>();
        if !self.narrowed
            || self.direct.is_some()
            || self.rows.is_some()
            || !matches!(self.source, Source::Range { .. })
            || needed.saturating_mul(2) > self.placement.read_len()
            || copies.iter().any(|c| c.width < MIN_ROW)
        {
            return;
        }
        let mut packed = Vec::with_capacity(copies.len());
        let mut at = 0u64;
        for c in copies {
            packed.push(Copy3D { src_offset: at, src_pitch: c.width, src_height: c.height, ..*c });
            at += c.bytes();
        }
        self.rows = Some(std::mem::replace(&mut self.placement.copies, packed));
    }

    /// The whole decoded chunk's bytes (checked once, by `plan_chunks`).
    pub(crate) fn decoded_len(&self) -> u64 {
        self.placement.chunk_bytes
    }

    /// The bytes read for an uncompressed chunk: all of it, the placement's part, or (read as
    /// rows) its rows, packed.
    pub(crate) fn raw_len(&self) -> u64 {
        match &self.rows {
            Some(rows) => rows.iter().map(Copy3D::bytes).sum(),
            None if self.narrowed => self.placement.read_len(),
            None => self.decoded_len(),
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
    use super::check_stored_len;

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
