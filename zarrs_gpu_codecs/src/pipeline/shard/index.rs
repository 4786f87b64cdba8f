//! A shard's index: read with a partial read (start or end of the shard, through one descriptor
//! on a `GdsStore`, `If-Match` on an object store), decoded with its own codecs, checked entry by
//! entry before any inner chunk is read, and kept in the caller's [`ShardIndexCache`].

use std::sync::Arc;

use zarrs::array::codec::ShardingIndexLocation;
use zarrs::array::{ArraySubset, CodecOptions};
use zarrs_gds_store::{ValueChanged, ValueVersion};
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::StoreKey;

use super::level::ShardLevel;
use super::read::ShardSource;
use crate::error::GpuError;
use crate::pipeline::unit::Source;
use crate::shard_index_cache::{settled, Stamp};

/// A shard to open: where its bytes are and which part of the array it holds.
pub(super) struct ShardRef {
    pub(super) key: StoreKey,
    /// Where the shard starts in the value (nonzero for nested shards).
    pub(super) base: u64,
    /// Its length, when known (nested shards); None for a whole value.
    pub(super) len: Option<u64>,
    /// The part of the array it covers (unbounded: full shard shape).
    pub(super) subset: ArraySubset,
    /// Where the outermost shard holding it starts: its innermost chunks are named by their
    /// indices from there, so those of two nested shards of one value never share a name.
    pub(super) origin: Vec<u64>,
    /// For a nested shard, the version of its value that the outer index naming it was read
    /// from: its own index is read from that version or not at all.
    pub(super) version: Option<ValueVersion>,
}

/// Indexes larger than this (65536 inner chunks) of values of unknown length are checked
/// against the value's size before they are read.
const LARGE_INDEX: u64 = 1 << 20;

/// A decoded shard index (offset and length per inner chunk), the bytes read for it (0 when
/// cached), the shard's length where known (nested shards; `GdsStore` files and objects), and
/// the version of the value it was read from (`GdsStore` files; objects with an ETag).
pub(super) struct ReadIndex {
    pub(super) index: Arc<Vec<u64>>,
    pub(super) read: u64,
    pub(super) shard_len: Option<u64>,
    pub(super) version: Option<ValueVersion>,
}

/// An index read from a shard that changed meanwhile, or from a version other than the one its
/// outer index came from: the error (naming the shard) that has the read planned again.
fn changed(label: String, reason: impl Into<String>) -> GpuError {
    let changed = ValueChanged::new(label, reason);
    GpuError::Chunk { key: changed.what.clone(), reason: changed.reason.clone(), source: Some(Box::new(changed)) }
}

/// Read and decode one shard's index (or take it from `cache`): None when the shard does not
/// exist. On a `GdsStore` the index is read through one descriptor, whose version (`fstat`,
/// before and after the read) it carries; on an object store with ETags, the ETag of a HEAD,
/// the index read with `If-Match`. A nested shard's index comes from the version its outer
/// index came from, or the read is planned again ([`ValueChanged`]).
pub(super) fn read_index(
    source: &ShardSource<'_>,
    depth: usize,
    level: &ShardLevel,
    shard: &ShardRef,
) -> Result<Option<ReadIndex>, GpuError> {
    let ShardSource { source, cache } = *source;
    let storage = source.storage();
    let shard_shape = shard.subset.shape();
    let label = || format!("{} (shard at byte {})", shard.key, shard.base);
    let error = |reason: String| GpuError::chunk(label(), reason);
    let per_shard = level.chunks_per_shard(shard_shape).map_err(&error)?;
    let index_len = level.index_len(&per_shard).map_err(&error)?;
    // A nested shard whose value is gone, or another version than its outer index's.
    let check_version = |found: Option<&Stamp>| match (&shard.version, found) {
        (None, _) => Ok(()),
        (Some(_), None) => Err(changed(label(), "it was removed after its outer index was read")),
        (Some(expected), Some(found)) if found.version().as_ref() == Some(expected) => Ok(()),
        (Some(_), Some(_)) => Err(changed(label(), "it was replaced after its outer index was read")),
    };
    // The value's identity, asked before the cache, so that an index cached from an older
    // version is not used: a GdsStore file's stamp (its path's), an object's from a HEAD
    // (nested shards without a cache need neither: their length and version are known).
    let asked = if let Some(store) = source.gds().filter(|_| cache.is_some()) {
        let path = store.key_to_fspath(&shard.key);
        match std::fs::metadata(&path) {
            Ok(meta) => Some(Some(Stamp::of_file(&meta))),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Some(None),
            Err(err) => return Err(error(format!("{}: {err}", path.display()))),
        }
    } else if let Some(store) = source.remote().filter(|_| shard.len.is_none() || cache.is_some()) {
        // An object's identity (its ETag, size and modification time): a shard rewritten in the
        // bucket is not read through an index cached from the old one, nor its chunks with the
        // old one's offsets.
        match store.stamp_and_e_tag(&shard.key) {
            Ok(object) => Some(object.map(|(id, e_tag)| Stamp::Object { id, e_tag: e_tag.map(Arc::from) })),
            Err(err) => return Err(error(format!("asking its version: {err}"))),
        }
    } else {
        None
    };
    if let Some(found) = &asked {
        check_version(found.as_ref())?;
        if found.is_none() {
            return Ok(None);
        }
    }
    let stamp = asked.flatten();
    let cache_key = cache.map(|_| (depth, shard.key.clone(), shard.base, shard.len, per_shard.clone()));
    if let (Some(c), Some(key)) = (cache, &cache_key) {
        if let Some((index, shard_len, cached_stamp)) = c.get(key) {
            if cached_stamp.is_some() && cached_stamp == stamp {
                let version = stamp.as_ref().and_then(Stamp::version);
                return Ok(Some(ReadIndex { index, read: 0, shard_len, version }));
            }
        }
    }
    // When the index is read: a file changed within two seconds before this may be rewritten
    // within the same tick afterwards (taken before the read, not at the insert).
    let read_at = std::time::SystemTime::now();
    let (bytes, shard_len, stamp) = if let Some(store) = source.gds() {
        let path = store.key_to_fspath(&shard.key);
        let Some((bytes, shard_len, stamp)) = read_file_index(&path, level.location, shard, index_len, &error)? else {
            check_version(None)?;
            return Ok(None);
        };
        check_version(Some(&stamp))?;
        (bytes.into(), Some(shard_len), Some(stamp))
    } else {
        // The shard's length: known for nested shards, and for a whole object from its HEAD.
        let mut shard_len = shard.len.or(stamp.as_ref().filter(|_| shard.len.is_none()).map(Stamp::size));
        // A large index of a value of unknown length (another store): ask its size before
        // reading, so that hostile metadata cannot size a host buffer beyond the value.
        if shard_len.is_none() && index_len > LARGE_INDEX {
            match storage.size_key(&shard.key) {
                Ok(Some(size)) => shard_len = Some(size),
                Ok(None) => return Ok(None),
                Err(err) => return Err(error(format!("asking its size: {err}"))),
            }
        }
        if let Some(len) = shard_len.filter(|&len| len < index_len) {
            return Err(error(format!("{len} bytes cannot hold its {index_len}-byte index")));
        }
        let range = match (level.location, shard_len) {
            (ShardingIndexLocation::Start, _) => ByteRange::FromStart(shard.base, Some(index_len)),
            // base + len lies within the outer shard (checked when its index entry was read).
            (ShardingIndexLocation::End, Some(len)) => {
                ByteRange::FromStart(shard.base + len - index_len, Some(index_len))
            }
            (ShardingIndexLocation::End, None) => ByteRange::Suffix(index_len),
        };
        // An object with an ETag: the index of that version only (If-Match).
        let version = stamp.as_ref().and_then(Stamp::version).or_else(|| shard.version.clone());
        let got = match (source.remote(), &version, range) {
            (Some(store), Some(ValueVersion::ETag(e_tag)), ByteRange::FromStart(offset, Some(len))) => {
                store.get_if_match(&shard.key, offset, len, e_tag)
            }
            _ => storage.get_partial(&shard.key, range),
        };
        let bytes = match got {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(None),
            Err(err) => match ValueChanged::in_storage_error(&err) {
                Some(was) => return Err(changed(label(), was.reason.clone())),
                None => return Err(error(format!("reading its index: {err}"))),
            },
        };
        (bytes, shard_len, stamp)
    };
    if bytes.len() as u64 != index_len {
        return Err(error(format!("{} bytes where its index takes {index_len}", bytes.len())));
    }
    let index = level
        .codec
        .decode_index(&bytes, &per_shard, &CodecOptions::default())
        .map_err(|e| error(format!("decoding its index: {e}")))?;
    let index = Arc::new(index);
    let version = stamp.as_ref().and_then(Stamp::version).or_else(|| shard.version.clone());
    if let (Some(c), Some(key)) = (cache, cache_key) {
        // A stamp that may not tell this version from the next is not worth keeping.
        if stamp.as_ref().is_none_or(|s| settled(s, read_at)) {
            c.insert(key, index.clone(), shard_len, stamp);
        }
    }
    Ok(Some(ReadIndex { index, read: index_len, shard_len, version }))
}

/// A `GdsStore` shard's index, read through one descriptor: its bytes, the shard's length and
/// the file's stamp (`fstat` of that descriptor, the same before and after the read); None when
/// the file does not exist. A file rewritten while its index was read is a [`ValueChanged`]
/// error.
fn read_file_index(
    path: &std::path::Path,
    location: ShardingIndexLocation,
    shard: &ShardRef,
    index_len: u64,
    error: &dyn Fn(String) -> GpuError,
) -> Result<Option<(Vec<u8>, u64, Stamp)>, GpuError> {
    use std::os::unix::fs::FileExt;
    let io = |err: std::io::Error| error(format!("{}: {err}", path.display()));
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io(err)),
    };
    let stamp = Stamp::of_file(&file.metadata().map_err(io)?);
    // Known for nested shards; a whole file's is its size.
    let shard_len = shard.len.unwrap_or(stamp.size());
    if shard_len < index_len {
        return Err(error(format!("{shard_len} bytes cannot hold its {index_len}-byte index")));
    }
    // Within the file: base + len lies within the outer shard, which lies within this version
    // of the file (checked when its index entry was read).
    let at = match location {
        ShardingIndexLocation::Start => shard.base,
        ShardingIndexLocation::End => shard.base + shard_len - index_len,
    };
    // index_len <= shard_len, a length within the file.
    let mut bytes = vec![0u8; usize::try_from(index_len).map_err(|e| error(e.to_string()))?];
    file.read_exact_at(&mut bytes, at).map_err(io)?;
    if Stamp::of_file(&file.metadata().map_err(io)?) != stamp {
        let label = format!("{} (shard at byte {})", shard.key, shard.base);
        return Err(changed(label, "it was rewritten while its index was read"));
    }
    Ok(Some((bytes, shard_len, stamp)))
}

/// Where an inner chunk's stored bytes are, from its index entry `(offset, len)` in a shard of
/// `shard_len` bytes (when known): missing for the all-ones entry (the spec's marker); an error
/// for an entry with one half all ones, a range that overflows, leaves the shard, or is far
/// longer than any encoding of `decoded` bytes (innermost chunks only) that the device decodes
/// could be (zstd's worst case is a few bytes in a thousand over), before a buffer is sized to
/// it.
pub(super) fn inner_source(entry: (u64, u64), shard_len: Option<u64>, decoded: Option<u64>) -> Result<Source, String> {
    let (offset, len) = entry;
    if entry == (u64::MAX, u64::MAX) {
        return Ok(Source::Missing);
    }
    // Half the missing marker: no stored range starts or ends there (a file holds less than
    // 2^63 bytes), and taken for a range it would read as an empty one at the end of the
    // address space, in a store of unknown size.
    if offset == u64::MAX || len == u64::MAX {
        return Err(format!("its index entry ({offset}, {len}) is neither a byte range nor the missing marker"));
    }
    let end = offset.checked_add(len).ok_or_else(|| format!("its index entry {offset} + {len} overflows"))?;
    if let Some(shard_len) = shard_len {
        if end > shard_len {
            return Err(format!("bytes {offset}..{end} lie outside its shard of {shard_len} bytes"));
        }
    }
    if let Some(decoded) = decoded {
        crate::pipeline::unit::check_stored_len(len, decoded)?;
    }
    Ok(Source::Range { offset, len })
}
