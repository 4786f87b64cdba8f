//! Sharded arrays (`sharding_indexed`, nested too) on the device: each shard's index is read with
//! a partial read (start or end of the shard, decoded on the host with its own codecs, crc32c
//! included; kept between reads in a [`ShardIndexCache`] the caller holds), and every inner
//! chunk that meets the subset becomes a decode unit: its byte range in the shard file, or
//! missing. Each unit carries the version of the shard's value its index came from (a
//! `GdsStore` file's `fstat`, an object's ETag), which the read of its bytes checks: a shard
//! replaced in between is read again from its new index ([`replanned_once`]), never through the
//! old one's offsets.
//!
//! [`replanned_once`]: crate::pipeline::units::replanned_once

use std::num::NonZeroU64;
use std::sync::Arc;

use rayon::prelude::*;
use zarrs::array::codec::{CodecChain, ShardingCodec, ShardingCodecConfiguration, ShardingIndexLocation};
use zarrs::array::{ArraySubset, ArrayToBytesCodecTraits, BytesRepresentation, CodecOptions, FillValue};
use zarrs_gds_store::{ValueChanged, ValueVersion};
use zarrs_storage::byte_range::ByteRange;
use zarrs_storage::StoreKey;

use crate::error::GpuError;
use crate::pipeline::plan::plan_chunks;
use crate::pipeline::unit::{Source, Unit};
use crate::reader::ReadSource;
use crate::shard_index_cache::{settled, ShardIndexCache, Stamp};

/// One level of sharding: the inner chunk shape and how to find and decode the index.
#[derive(Clone, Debug)]
pub(crate) struct ShardLevel {
    inner_shape: Vec<u64>,
    /// Decodes the index (its `decode_index`); the inner codecs are planned separately.
    codec: Arc<ShardingCodec>,
    index_codecs: Arc<CodecChain>,
    location: ShardingIndexLocation,
}

impl ShardLevel {
    /// The sharding level of a `sharding_indexed` configuration, and its inner codec chain.
    pub(crate) fn new(configuration: &ShardingCodecConfiguration) -> Result<(Self, CodecChain), String> {
        let ShardingCodecConfiguration::V1(c) = configuration else {
            return Err("this sharding_indexed configuration version is not supported".into());
        };
        let index_codecs = CodecChain::from_metadata(&c.index_codecs).map_err(|e| e.to_string())?;
        let inner = CodecChain::from_metadata(&c.codecs).map_err(|e| e.to_string())?;
        let codec = ShardingCodec::new_with_configuration(configuration).map_err(|e| e.to_string())?;
        let level = Self {
            inner_shape: c.chunk_shape.iter().map(|n| n.get()).collect(),
            codec: Arc::new(codec),
            index_codecs: Arc::new(index_codecs),
            location: c.index_location,
        };
        Ok((level, inner))
    }

    /// The inner chunks' shape.
    pub(crate) fn inner_shape(&self) -> &[u64] {
        &self.inner_shape
    }

    /// The file of a shard of `shard_shape` whose inner chunks (in C order) have the encoded
    /// bytes `chunks`, None for a missing one (all fill value): the chunks one after another in
    /// that order, and the index, encoded with the index codecs, where the codec puts it. None
    /// when every chunk is missing (the shard is erased, as zarrs does).
    ///
    /// # Errors
    /// Returns an error when the shard's shape does not fit the inner chunks, `chunks` is not one
    /// per inner chunk, or the index does not encode to its fixed size.
    pub(crate) fn encode_shard(
        &self,
        shard_shape: &[u64],
        chunks: &[Option<&[u8]>],
    ) -> Result<Option<Vec<u8>>, String> {
        let per = self.chunks_per_shard(shard_shape)?;
        let count = per.iter().try_fold(1usize, |n, p| usize::try_from(p.get()).ok().and_then(|p| n.checked_mul(p)));
        if count != Some(chunks.len()) {
            return Err(format!("a shard of {per:?} inner chunks given {} of them", chunks.len()));
        }
        if chunks.iter().all(Option::is_none) {
            return Ok(None);
        }
        let index_len = self.index_len(&per)?;
        let index_usize = usize::try_from(index_len).map_err(|e| e.to_string())?;
        let data_len = chunks.iter().flatten().map(|c| c.len()).sum::<usize>();
        let mut shard = Vec::with_capacity(data_len + index_usize);
        if self.location == ShardingIndexLocation::Start {
            shard.resize(index_usize, 0);
        }
        // Offsets are from the start of the shard; u64::MAX twice marks a missing chunk.
        let mut index = vec![u64::MAX; chunks.len() * 2];
        for (k, chunk) in chunks.iter().enumerate() {
            if let Some(chunk) = chunk {
                index[2 * k] = shard.len() as u64;
                index[2 * k + 1] = chunk.len() as u64;
                shard.extend_from_slice(chunk);
            }
        }
        let mut shape = per;
        shape.push(NonZeroU64::new(2).expect("2"));
        let encoded = self
            .index_codecs
            .encode(
                zarrs::array::ArrayBytes::from(bytemuck::cast_slice::<u64, u8>(&index).to_vec()),
                &shape,
                &zarrs::array::data_type::uint64(),
                &FillValue::from(u64::MAX),
                &CodecOptions::default(),
            )
            .map_err(|e| format!("encoding the shard index: {e}"))?;
        if encoded.len() != index_usize {
            return Err(format!("the shard index encoded to {} bytes, not {index_len}", encoded.len()));
        }
        match self.location {
            ShardingIndexLocation::Start => shard[..index_usize].copy_from_slice(&encoded),
            ShardingIndexLocation::End => shard.extend_from_slice(&encoded),
        }
        Ok(Some(shard))
    }

    /// Where each inner chunk's stored bytes lie in `shard` (a whole shard of `shard_shape`, as
    /// read from its file), in C order of the inner grid, None for a missing one: the index
    /// decoded (its checksum verified) and every entry checked against the shard's length.
    /// What a write keeps of a shard it changes in part.
    ///
    /// # Errors
    /// Returns an error when the shard cannot hold its index, the index does not decode, or an
    /// entry overflows or leaves the shard.
    pub(crate) fn stored_chunks(
        &self,
        shard_shape: &[u64],
        shard: &[u8],
    ) -> Result<Vec<Option<std::ops::Range<usize>>>, String> {
        let per = self.chunks_per_shard(shard_shape)?;
        let index_len = usize::try_from(self.index_len(&per)?).map_err(|e| e.to_string())?;
        if shard.len() < index_len {
            return Err(format!("{} bytes cannot hold its {index_len}-byte index", shard.len()));
        }
        let bytes = match self.location {
            ShardingIndexLocation::Start => &shard[..index_len],
            ShardingIndexLocation::End => &shard[shard.len() - index_len..],
        };
        let index = self
            .codec
            .decode_index(bytes, &per, &CodecOptions::default())
            .map_err(|e| format!("decoding its index: {e}"))?;
        index
            .chunks_exact(2)
            .enumerate()
            .map(|(k, entry)| match inner_source((entry[0], entry[1]), Some(shard.len() as u64), None) {
                Ok(Source::Missing) => Ok(None),
                // Within the shard's length, so within usize.
                Ok(Source::Range { offset, len }) => Ok(Some(offset as usize..(offset + len) as usize)),
                Ok(_) => Err(format!("inner chunk {k}: an index entry of another kind")),
                Err(reason) => Err(format!("inner chunk {k}: {reason}")),
            })
            .collect()
    }

    /// Inner chunks per shard of `shard_shape` along each dimension.
    fn chunks_per_shard(&self, shard_shape: &[u64]) -> Result<Vec<NonZeroU64>, String> {
        if shard_shape.len() != self.inner_shape.len() {
            return Err(format!(
                "inner chunk shape {:?} and shard shape {shard_shape:?} differ in dimensionality",
                self.inner_shape
            ));
        }
        shard_shape
            .iter()
            .zip(&self.inner_shape)
            .map(|(&s, &c)| {
                NonZeroU64::new(s / c).filter(|_| s % c == 0).ok_or_else(|| {
                    format!("inner chunk shape {:?} does not divide shard shape {shard_shape:?}", self.inner_shape)
                })
            })
            .collect()
    }

    /// Bytes of the encoded index of a shard with `chunks_per_shard` inner chunks.
    fn index_len(&self, chunks_per_shard: &[NonZeroU64]) -> Result<u64, String> {
        // zarrs sizes the index unchecked: 16 bytes per inner chunk must fit in u64, with room
        // to spare (fixed-size index codecs after `bytes` add a few bytes, crc32c 4).
        let entries = chunks_per_shard.iter().try_fold(1u64, |acc, n| acc.checked_mul(n.get()));
        if entries.and_then(|n| n.checked_mul(32)).is_none() {
            let per: Vec<u64> = chunks_per_shard.iter().map(|n| n.get()).collect();
            return Err(format!("a shard of {per:?} inner chunks has an index too large for 64-bit sizes"));
        }
        let mut shape = chunks_per_shard.to_vec();
        shape.push(NonZeroU64::new(2).expect("2"));
        match self
            .index_codecs
            .encoded_representation(&shape, &zarrs::array::data_type::uint64(), &FillValue::from(u64::MAX))
            .map_err(|e| e.to_string())?
        {
            BytesRepresentation::FixedSize(size) => Ok(size),
            _ => Err("the shard index codecs do not give a fixed size".into()),
        }
    }
}

/// A shard of `shard_shape` laid out by `levels` (outermost first: nested shards), from its
/// innermost chunks' encoded bytes `chunks` (None: missing) in nested order: the innermost chunks
/// of the first inner shard in C order of its grid, then the second's, and so on, as
/// [`nested_origins`] lists them. None when every chunk is missing.
///
/// # Errors
/// As [`ShardLevel::encode_shard`] at any level, or when `chunks` does not fill the levels.
pub(crate) fn encode_shards(
    levels: &[ShardLevel],
    shard_shape: &[u64],
    chunks: &[Option<&[u8]>],
) -> Result<Option<Vec<u8>>, String> {
    let Some((level, rest)) = levels.split_first() else {
        return Err("no sharding level".into());
    };
    if rest.is_empty() {
        return level.encode_shard(shard_shape, chunks);
    }
    // Each inner shard takes an equal run of the innermost chunks.
    let inner_shards = level.chunks_per_shard(shard_shape)?.iter().map(|n| n.get() as usize).product::<usize>();
    if inner_shards == 0 || !chunks.len().is_multiple_of(inner_shards) {
        return Err(format!("{} innermost chunks for {inner_shards} inner shards", chunks.len()));
    }
    let inner: Vec<Option<Vec<u8>>> = chunks
        .chunks(chunks.len() / inner_shards)
        .map(|run| encode_shards(rest, level.inner_shape(), run))
        .collect::<Result<_, _>>()?;
    let inner: Vec<Option<&[u8]>> = inner.iter().map(Option::as_deref).collect();
    level.encode_shard(shard_shape, &inner)
}

/// The origins (within a shard of `shard_shape`) of its innermost chunks, whose levels' inner
/// shapes are `inner_shapes` (outermost first), in nested order (see [`encode_shards`]).
// The order's definition: the writer computes one origin at a time (its tests check it here).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) fn nested_origins(shard_shape: &[u64], inner_shapes: &[&[u64]]) -> Vec<Vec<u64>> {
    let Some((inner, rest)) = inner_shapes.split_first() else {
        return vec![vec![0; shard_shape.len()]];
    };
    let grid: Vec<u64> = shard_shape.iter().zip(*inner).map(|(&s, &c)| s / c.max(1)).collect();
    let below = nested_origins(inner, rest);
    ArraySubset::new_with_shape(grid)
        .indices()
        .into_iter()
        .flat_map(|indices| {
            let origin: Vec<u64> = indices.iter().zip(*inner).map(|(&i, &c)| i * c).collect();
            below.iter().map(move |b| origin.iter().zip(b).map(|(o, b)| o + b).collect()).collect::<Vec<_>>()
        })
        .collect()
}

/// A shard to open: where its bytes are and which part of the array it holds.
struct ShardRef {
    key: StoreKey,
    /// Where the shard starts in the value (nonzero for nested shards).
    base: u64,
    /// Its length, when known (nested shards); None for a whole value.
    len: Option<u64>,
    /// The part of the array it covers (unbounded: full shard shape).
    subset: ArraySubset,
    /// Where the outermost shard holding it starts: its innermost chunks are named by their
    /// indices from there, so those of two nested shards of one value never share a name.
    origin: Vec<u64>,
    /// For a nested shard, the version of its value that the outer index naming it was read
    /// from: its own index is read from that version or not at all.
    version: Option<ValueVersion>,
}

/// What an outer shard's index entry says of a nested shard.
enum NestedShard {
    /// Stored in a range of the value: its own index is read at the next level.
    Stored(ShardRef),
    /// Missing (the spec's all-ones entry): every inner chunk of it is the fill value.
    Missing { key: StoreKey, subset: ArraySubset, origin: Vec<u64> },
}

/// Where a read's shards come from: the array's store and the caller's index cache.
pub(crate) struct ShardSource<'a> {
    pub(crate) source: ReadSource<'a>,
    /// The caller's cache, bound to the source's store.
    pub(crate) cache: Option<&'a ShardIndexCache>,
}

/// Indexes larger than this (65536 inner chunks) of values of unknown length are checked
/// against the value's size before they are read.
const LARGE_INDEX: u64 = 1 << 20;

/// A decoded shard index (offset and length per inner chunk), the bytes read for it (0 when
/// cached), the shard's length where known (nested shards; `GdsStore` files and objects), and
/// the version of the value it was read from (`GdsStore` files; objects with an ETag).
struct ReadIndex {
    index: Arc<Vec<u64>>,
    read: u64,
    shard_len: Option<u64>,
    version: Option<ValueVersion>,
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
fn read_index(
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
fn inner_source(entry: (u64, u64), shard_len: Option<u64>, decoded: Option<u64>) -> Result<Source, String> {
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

/// For fuzzing only (the `shard_index` target of `fuzz/`), not part of the API: [`inner_source`]
/// on one index entry, as None (missing) or `Some((offset, len))`.
#[doc(hidden)]
pub fn fuzz_shard_index_entry(
    offset: u64,
    len: u64,
    shard_len: Option<u64>,
    decoded: Option<u64>,
) -> Result<Option<(u64, u64)>, String> {
    match inner_source((offset, len), shard_len, decoded)? {
        Source::Range { offset, len } => Ok(Some((offset, len))),
        Source::Missing => Ok(None),
        Source::Whole => Err("an index entry never gives a whole value".into()),
    }
}

/// For fuzzing only (the `shard_index` target of `fuzz/`), not part of the API: the encoded
/// index size (`bytes` and `crc32c` index codecs) of a shard of `shard_shape` with inner chunks
/// of `inner_shape`, as [`read_index`] sizes it before any read.
#[doc(hidden)]
pub fn fuzz_shard_index_len(inner_shape: &[u64], shard_shape: &[u64]) -> Result<u64, String> {
    use zarrs::array::codec::{BytesCodec, Crc32cCodec};
    let chunk_shape: Vec<NonZeroU64> = inner_shape
        .iter()
        .map(|&n| NonZeroU64::new(n))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("inner chunk shape {inner_shape:?} has a zero extent"))?;
    let index_codecs =
        Arc::new(CodecChain::new(vec![], Arc::<BytesCodec>::default(), vec![Arc::new(Crc32cCodec::new())]));
    let inner_codecs = Arc::new(CodecChain::new(vec![], Arc::<BytesCodec>::default(), vec![]));
    let codec = ShardingCodec::new(chunk_shape, inner_codecs, index_codecs.clone(), ShardingIndexLocation::End);
    let level = ShardLevel {
        inner_shape: inner_shape.to_vec(),
        codec: Arc::new(codec),
        index_codecs,
        location: ShardingIndexLocation::End,
    };
    level.index_len(&level.chunks_per_shard(shard_shape)?)
}

/// The inner chunks of `shard` meeting `subset`: (indices within the shard, their subset).
fn inner_chunks_meeting(
    level: &ShardLevel,
    shard: &ArraySubset,
    subset: &ArraySubset,
) -> Result<Vec<(Vec<u64>, ArraySubset)>, GpuError> {
    let inner = &level.inner_shape;
    if shard.dimensionality() != inner.len() || subset.dimensionality() != inner.len() {
        let reason = format!("inner chunk shape {inner:?} does not match the shard's {:?}", shard.shape());
        return Err(GpuError::Array(zarrs::array::ArrayError::Other(reason)));
    }
    // The shard's and the subset's ends fit in u64 (checked by plan_chunks and chunk_subset), so
    // no sum below overflows.
    let ranges: Vec<std::ops::Range<u64>> = (0..inner.len())
        .map(|d| {
            let (s0, n) = (shard.start()[d], shard.shape()[d]);
            let (a, b) = (subset.start()[d], subset.start()[d] + subset.shape()[d]);
            let lo = a.saturating_sub(s0) / inner[d];
            let hi = (b.saturating_sub(s0).div_ceil(inner[d])).min(n / inner[d]);
            lo..hi.max(lo)
        })
        .collect();
    let mut out = Vec::new();
    if ranges.iter().any(std::ops::Range::is_empty) {
        return Ok(out);
    }
    let mut idx: Vec<u64> = ranges.iter().map(|r| r.start).collect();
    loop {
        let start: Vec<u64> = (0..idx.len()).map(|d| shard.start()[d] + idx[d] * inner[d]).collect();
        let sub = ArraySubset::new_with_start_shape(start, inner.clone()).expect("same dimensionality");
        out.push((idx.clone(), sub));
        let mut d = idx.len();
        loop {
            if d == 0 {
                return Ok(out);
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < ranges[d].end {
                break;
            }
            idx[d] = ranges[d].start;
        }
    }
}

/// Row-major position of `idx` in a grid of `shape`.
fn ravel(idx: &[u64], shape: &[NonZeroU64]) -> u64 {
    idx.iter().zip(shape).fold(0, |acc, (&i, n)| acc * n.get() + i)
}

/// The decode units of `subset` of a sharded array: every innermost chunk meeting it, with its
/// byte range (or missing). `shards` are the array's chunks meeting the subset: (indices, key,
/// unbounded subset). Indexes are read in parallel on the current rayon pool (the caller's
/// reader's). Returns the units and the index bytes read.
pub(crate) fn sharded_units(
    source: &ShardSource<'_>,
    levels: &[ShardLevel],
    elem: u64,
    subset: &ArraySubset,
    shards: Vec<(Vec<u64>, StoreKey, ArraySubset)>,
) -> Result<(Vec<Unit>, u64), GpuError> {
    let mut open: Vec<ShardRef> = shards
        .into_iter()
        .map(|(_, key, subset)| ShardRef {
            key,
            base: 0,
            len: None,
            origin: subset.start().to_vec(),
            subset,
            version: None,
        })
        .collect();
    let mut units = Vec::new();
    let mut index_bytes = 0;
    for (depth, level) in levels.iter().enumerate() {
        let innermost = depth + 1 == levels.len();
        let indexes: Vec<Option<ReadIndex>> =
            open.par_iter().map(|shard| read_index(source, depth, level, shard)).collect::<Result<_, _>>()?;
        let mut next = Vec::new();
        for (shard, index) in open.iter().zip(indexes) {
            let per_shard = level
                .chunks_per_shard(shard.subset.shape())
                .map_err(|reason| GpuError::chunk(shard.key.to_string(), reason))?;
            let (index, shard_len, version) = match index {
                Some(ReadIndex { index, read, shard_len, version }) => {
                    index_bytes += read;
                    (Some(index), shard_len, version)
                }
                None => (None, None, None),
            };
            for (idx, inner_subset) in inner_chunks_meeting(level, &shard.subset, subset)? {
                let name = named_from(&shard.origin, &inner_subset, level);
                let label = || format!("{} (inner chunk {name:?})", shard.key);
                // Planned first: its decoded size is checked there, once.
                let placement = if innermost {
                    plan_chunks(elem, subset, [(name.clone(), shard.key.clone(), inner_subset.clone())])?.pop()
                } else {
                    None
                };
                // Nested shards hold an index of their own: only innermost chunks have a bound.
                let decoded = placement.as_ref().map(|p| p.chunk_bytes);
                // ravel < the index's entries, whose count index_len checked.
                let k = ravel(&idx, &per_shard) as usize;
                let entry = index.as_ref().map(|index| index.get(2 * k).zip(index.get(2 * k + 1)));
                let source = match entry {
                    None => Source::Missing,
                    Some(None) => return Err(GpuError::chunk(label(), "its shard index is too short")),
                    Some(Some((&offset, &len))) => match inner_source((offset, len), shard_len, decoded) {
                        Ok(Source::Range { offset, len }) => {
                            let offset = shard.base.checked_add(offset).ok_or_else(|| {
                                GpuError::chunk(
                                    label(),
                                    format!("shard at byte {} + offset {offset} overflows", shard.base),
                                )
                            })?;
                            Source::Range { offset, len }
                        }
                        Ok(source) => source,
                        Err(reason) => return Err(GpuError::chunk(label(), reason)),
                    },
                };
                if !innermost {
                    // A nested shard: opened at the next level (from the version of the value
                    // this index came from), or wholly missing.
                    next.push(match source {
                        Source::Range { offset, len } => NestedShard::Stored(ShardRef {
                            key: shard.key.clone(),
                            base: offset,
                            len: Some(len),
                            subset: inner_subset,
                            origin: shard.origin.clone(),
                            version: version.clone(),
                        }),
                        Source::Missing => NestedShard::Missing {
                            key: shard.key.clone(),
                            subset: inner_subset,
                            origin: shard.origin.clone(),
                        },
                        Source::Whole => return Err(GpuError::chunk(label(), "an index entry of another kind")),
                    });
                    continue;
                }
                if let Some(placement) = placement {
                    // A missing inner chunk reads nothing: no version to check.
                    let version = version.clone().filter(|_| source != Source::Missing);
                    units.push(Unit {
                        placement,
                        source,
                        inner: Some(name),
                        narrowed: false,
                        value_len: None,
                        direct: None,
                        rows: None,
                        version,
                    });
                }
            }
        }
        // Wholly missing nested shards yield missing inner chunks at the next level.
        open = Vec::new();
        for shard in next {
            match shard {
                NestedShard::Stored(shard) => open.push(shard),
                NestedShard::Missing { key, subset: shard_subset, origin } => {
                    let missing = MissingShard { key: &key, subset: &shard_subset, origin: &origin };
                    units.extend(missing_units(levels, depth + 1, elem, subset, &missing)?);
                }
            }
        }
    }
    Ok((units, index_bytes))
}

/// An inner chunk's indices counted from the outermost shard's start (`origin`), in chunks of
/// its level: within one shard its indices there; below nested shards, unique within the value.
fn named_from(origin: &[u64], inner_subset: &ArraySubset, level: &ShardLevel) -> Vec<u64> {
    // The inner chunk lies within the outer shard, so the difference never underflows.
    inner_subset.start().iter().zip(origin).zip(&level.inner_shape).map(|((s, o), c)| (s - o) / c).collect()
}

/// A nested shard its outer index marks missing: its value's key, the part of the array it
/// covers, and where the outermost shard holding it starts.
struct MissingShard<'a> {
    key: &'a StoreKey,
    subset: &'a ArraySubset,
    origin: &'a [u64],
}

/// The innermost units of a missing nested shard at level `depth` of `levels`: all missing.
fn missing_units(
    levels: &[ShardLevel],
    depth: usize,
    elem: u64,
    subset: &ArraySubset,
    shard: &MissingShard<'_>,
) -> Result<Vec<Unit>, GpuError> {
    let level = &levels[depth];
    let mut out = Vec::new();
    for (_, inner_subset) in inner_chunks_meeting(level, shard.subset, subset)? {
        if depth + 1 < levels.len() {
            let nested = MissingShard { key: shard.key, subset: &inner_subset, origin: shard.origin };
            out.extend(missing_units(levels, depth + 1, elem, subset, &nested)?);
        } else if let Some(placement) = plan_chunks(
            elem,
            subset,
            [(named_from(shard.origin, &inner_subset, level), shard.key.clone(), inner_subset)],
        )?
        .pop()
        {
            let name = placement.chunk_indices.clone();
            out.push(Unit { source: Source::Missing, inner: Some(name), ..Unit::whole(placement) });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(inner: &[u64]) -> ShardLevel {
        let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
            "chunk_shape": inner,
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
        }))
        .unwrap();
        ShardLevel::new(&configuration).unwrap().0
    }

    /// Shards laid out by `encode_shard` read back by zarrs' own sharding codec: inner chunks
    /// raw and zstd-compressed, some missing, the index (with crc32c) at either end, an edge shard.
    #[test]
    fn encoded_shards_read_back_by_zarrs() {
        use zarrs::array::{ArrayBuilder, FillValue};
        use zarrs_storage::WritableStorageTraits;
        for location in ["start", "end"] {
            for compressed in [false, true] {
                let inner_codecs = if compressed {
                    serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}},
                        {"name": "zstd", "configuration": {"level": 3, "checksum": false}}])
                } else {
                    serde_json::json!([{"name": "bytes", "configuration": {"endian": "little"}}])
                };
                let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
                    "chunk_shape": [4, 8],
                    "codecs": inner_codecs,
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                    "index_location": location,
                }))
                .unwrap();
                let (level, _) = ShardLevel::new(&configuration).unwrap();
                let store = Arc::new(zarrs::storage::store::MemoryStore::new());
                let a2b = Arc::new(ShardingCodec::new_with_configuration(&configuration).unwrap());
                // 12 x 24 in shards of 8 x 16: the shards of the last row and column reach past
                // the edge.
                let array = ArrayBuilder::new(
                    vec![12, 24],
                    vec![8, 16],
                    zarrs::array::data_type::float32(),
                    FillValue::from(0.0f32),
                )
                .array_to_bytes_codec(a2b)
                .build(store.clone(), "/")
                .unwrap();
                let mut want = vec![0.0f32; 12 * 24];
                for (shard_index, shard_origin) in [([0u64, 0u64], [0u64, 0u64]), ([1, 1], [8, 16])] {
                    // Inner chunks in C order of the 2 x 2 grid; [0, 1] missing (fill value).
                    let mut chunks = Vec::new();
                    for k in 0..4u64 {
                        if k == 1 {
                            chunks.push(None);
                            continue;
                        }
                        let (row, col) = (shard_origin[0] + (k / 2) * 4, shard_origin[1] + (k % 2) * 8);
                        let values: Vec<f32> = (0..32u64).map(|e| (row * 100 + col + e) as f32 + 0.5).collect();
                        for e in 0..32u64 {
                            let (r, c) = (row + e / 8, col + e % 8);
                            if r < 12 && c < 24 {
                                want[(r * 24 + c) as usize] = values[e as usize];
                            }
                        }
                        let raw: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
                        chunks.push(Some(if compressed { zstd::bulk::compress(&raw, 3).unwrap() } else { raw }));
                    }
                    let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
                    let shard = level.encode_shard(&[8, 16], &parts).unwrap().expect("not all missing");
                    store.set(&array.chunk_key(&shard_index), shard.into()).unwrap();
                }
                let got: Vec<f32> = array.retrieve_array_subset(&array.subset_all()).unwrap();
                assert_eq!(got, want, "index at the {location}, compressed {compressed}");
                // Every inner chunk missing: no shard at all.
                assert_eq!(level.encode_shard(&[8, 16], &[None; 4]).unwrap(), None);
                assert!(level.encode_shard(&[8, 16], &[None; 3]).is_err(), "one entry per inner chunk");
            }
        }
    }

    /// A shard laid out by `encode_shard` (and one by zarrs) gives back each inner chunk's bytes;
    /// a damaged index or an entry past the end is an error.
    #[test]
    fn stored_chunks_are_what_encode_shard_laid_out() {
        for location in ["start", "end"] {
            let configuration: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
                "chunk_shape": [4, 8],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": location,
            }))
            .unwrap();
            let (level, _) = ShardLevel::new(&configuration).unwrap();
            let chunks: Vec<Option<Vec<u8>>> =
                (0..4u8).map(|k| (k != 2).then(|| (0..(10 + k)).map(|b| b * 3 + k).collect())).collect();
            let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
            let shard = level.encode_shard(&[8, 16], &parts).unwrap().unwrap();
            let ranges = level.stored_chunks(&[8, 16], &shard).unwrap();
            let back: Vec<Option<&[u8]>> = ranges.iter().map(|r| r.clone().map(|r| &shard[r])).collect();
            assert_eq!(back, parts, "index at the {location}");
            // zarrs' own shard of the same chunks.
            let store = Arc::new(zarrs::storage::store::MemoryStore::new());
            let a2b = Arc::new(ShardingCodec::new_with_configuration(&configuration).unwrap());
            let array = zarrs::array::ArrayBuilder::new(
                vec![8, 16],
                vec![8, 16],
                zarrs::array::data_type::uint8(),
                FillValue::from(0u8),
            )
            .array_to_bytes_codec(a2b)
            .build(store.clone(), "/")
            .unwrap();
            let values: Vec<u8> = (0..128u32).map(|i| if i < 64 { 0 } else { (i % 7) as u8 + 1 }).collect();
            array.store_chunk(&[0, 0], values.clone()).unwrap();
            let stored =
                zarrs_storage::ReadableStorageTraits::get(&*store, &array.chunk_key(&[0, 0])).unwrap().unwrap();
            let ranges = level.stored_chunks(&[8, 16], &stored).unwrap();
            // Rows 0..4 (inner chunks 0 and 1) are fill value: zarrs leaves them out.
            assert_eq!(ranges.iter().map(Option::is_some).collect::<Vec<_>>(), [false, false, true, true]);
            for (k, range) in ranges.iter().enumerate().skip(2) {
                let (row, col) = (4 * (k / 2), 8 * (k % 2));
                let want: Vec<u8> = (0..32).map(|e| values[(row + e / 8) * 16 + col + e % 8]).collect();
                assert_eq!(&stored[range.clone().unwrap()], &want[..], "zarrs' inner chunk {k}");
            }
            // A damaged index (its crc32c fails), a truncated shard: errors.
            let mut damaged = shard.clone();
            let at = if location == "start" { 3 } else { damaged.len() - 7 };
            damaged[at] ^= 0x40;
            assert!(level.stored_chunks(&[8, 16], &damaged).is_err(), "index at the {location}");
            assert!(level.stored_chunks(&[8, 16], &shard[..20]).is_err());
        }
    }

    /// Nested shards laid out by `encode_shards` (innermost chunks in `nested_origins`' order)
    /// read back by zarrs: an outer shard of 8 x 16 in inner shards of 4 x 8, each of 2 x 4
    /// chunks; one inner shard all missing, single chunks missing in others.
    #[test]
    fn nested_shards_read_back_by_zarrs() {
        use zarrs::array::{ArrayBuilder, FillValue};
        use zarrs_storage::WritableStorageTraits;
        let inner_json = serde_json::json!({
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [2, 4],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}],
                "index_location": "start",
            },
        });
        let outer: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
            "chunk_shape": [4, 8],
            "codecs": [inner_json],
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "index_location": "end",
        }))
        .unwrap();
        let (outer_level, middle) = ShardLevel::new(&outer).unwrap();
        let middle_configuration: ShardingCodecConfiguration = middle
            .array_to_bytes_codec()
            .configuration_v3(&zarrs::array::CodecMetadataOptions::default())
            .unwrap()
            .to_typed()
            .unwrap();
        let (middle_level, _) = ShardLevel::new(&middle_configuration).unwrap();
        let levels = [outer_level, middle_level];
        let origins = nested_origins(&[8, 16], &[&[4, 8], &[2, 4]]);
        assert_eq!(origins.len(), 16);
        assert_eq!(&origins[..5], &[vec![0, 0], vec![0, 4], vec![2, 0], vec![2, 4], vec![0, 8]]);
        let mut want = vec![0.0f32; 8 * 16];
        let chunks: Vec<Option<Vec<u8>>> = origins
            .iter()
            .enumerate()
            // Inner shard 3 (origins 12..16) all missing; chunk 5 missing.
            .map(|(k, o)| {
                if k >= 12 || k == 5 {
                    return None;
                }
                let values: Vec<f32> = (0..8u64).map(|e| (k as u64 * 10 + e) as f32 + 0.25).collect();
                for e in 0..8u64 {
                    want[((o[0] + e / 4) * 16 + o[1] + e % 4) as usize] = values[e as usize];
                }
                Some(bytemuck::cast_slice(&values).to_vec())
            })
            .collect();
        let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| c.as_deref()).collect();
        let shard = encode_shards(&levels, &[8, 16], &parts).unwrap().unwrap();
        let store = Arc::new(zarrs::storage::store::MemoryStore::new());
        let a2b = Arc::new(ShardingCodec::new_with_configuration(&outer).unwrap());
        let array =
            ArrayBuilder::new(vec![8, 16], vec![8, 16], zarrs::array::data_type::float32(), FillValue::from(0.0f32))
                .array_to_bytes_codec(a2b)
                .build(store.clone(), "/")
                .unwrap();
        store.set(&array.chunk_key(&[0, 0]), shard.into()).unwrap();
        let got: Vec<f32> = array.retrieve_array_subset(&array.subset_all()).unwrap();
        assert_eq!(got, want);
        assert_eq!(encode_shards(&levels, &[8, 16], &[None; 16]).unwrap(), None);
        assert!(encode_shards(&levels, &[8, 16], &[None; 15]).is_err());
    }

    /// An outer index entry `(u64::MAX, 0)` (half the missing marker) in a store of unknown
    /// size: an error naming the shard, not a nested shard read as fill values (it was, while a
    /// missing nested shard was marked by a base of `u64::MAX`).
    #[test]
    fn a_corrupt_nested_shard_entry_is_an_error_naming_the_shard() {
        use zarrs_storage::{ReadableStorageTraits, WritableStorageTraits};
        let inner = |location: &str| {
            serde_json::json!({
                "name": "sharding_indexed",
                "configuration": {
                    "chunk_shape": [2, 4],
                    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                    "index_location": location,
                },
            })
        };
        for location in ["start", "end"] {
            let outer: ShardingCodecConfiguration = serde_json::from_value(serde_json::json!({
                "chunk_shape": [4, 8],
                "codecs": [inner(location)],
                "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_location": "end",
            }))
            .unwrap();
            let (outer_level, middle) = ShardLevel::new(&outer).unwrap();
            let middle: ShardingCodecConfiguration = middle
                .array_to_bytes_codec()
                .configuration_v3(&zarrs::array::CodecMetadataOptions::default())
                .unwrap()
                .to_typed()
                .unwrap();
            let levels = [outer_level, ShardLevel::new(&middle).unwrap().0];
            let chunks: Vec<Vec<u8>> = (0..16u8).map(|k| (0..32).map(|b| b ^ k.wrapping_mul(37)).collect()).collect();
            let parts: Vec<Option<&[u8]>> = chunks.iter().map(|c| Some(&c[..])).collect();
            let mut shard = encode_shards(&levels, &[8, 16], &parts).unwrap().unwrap();
            // The outer index (4 entries of 16 bytes, at the end): inner shard 0's entry.
            let at = shard.len() - 64;
            shard[at..at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
            shard[at + 8..at + 16].copy_from_slice(&0u64.to_le_bytes());
            let store = zarrs::storage::store::MemoryStore::new();
            let key = StoreKey::new("arr/c/0/0").unwrap();
            store.set(&key, shard.into()).unwrap();
            let source = ShardSource { source: ReadSource::Store(&store as &dyn ReadableStorageTraits), cache: None };
            let all = ArraySubset::new_with_shape(vec![8, 16]);
            let err = sharded_units(&source, &levels, 4, &all, vec![(vec![0, 0], key.clone(), all.clone())])
                .err()
                .unwrap_or_else(|| panic!("read as fill values (index at the {location})"));
            let message = err.to_string();
            assert!(message.contains("arr/c/0/0") && message.contains("inner chunk [0, 0]"), "{message}");
            // Inner shard 1 alone (columns 8..16) reads, its chunks where they are.
            let right = ArraySubset::new_with_ranges(&[0..4, 8..16]);
            let (units, _) = sharded_units(&source, &levels, 4, &right, vec![(vec![0, 0], key, all)]).unwrap();
            assert_eq!(units.len(), 4);
            assert!(units.iter().all(|u| matches!(u.source, Source::Range { len: 32, .. })));
        }
    }

    #[test]
    fn inner_chunks_meeting_a_subset() {
        let level = level(&[4, 8]);
        let shard = ArraySubset::new_with_ranges(&[8..16, 16..32]);
        // Rows 9..13 meet inner rows 0 and 1; columns 20..21 inner column 0 only.
        let got: Vec<Vec<u64>> = inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[9..13, 20..21]))
            .unwrap()
            .into_iter()
            .map(|(idx, sub)| {
                assert_eq!(sub.shape(), &[4, 8]);
                idx
            })
            .collect();
        assert_eq!(got, vec![vec![0, 0], vec![1, 0]]);
        // A subset covering the shard meets all four; one outside it meets none.
        assert_eq!(
            inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[0..100, 0..100])).unwrap().len(),
            4
        );
        assert!(inner_chunks_meeting(&level, &shard, &ArraySubset::new_with_ranges(&[0..8, 0..100]))
            .unwrap()
            .is_empty());
        // Another dimensionality than the inner chunks' is an error, never an index out of bounds.
        assert!(inner_chunks_meeting(&level, &ArraySubset::new_with_shape(vec![8]), &shard).is_err());
        assert_eq!(ravel(&[1, 1], &[NonZeroU64::new(2).unwrap(), NonZeroU64::new(2).unwrap()]), 3);
    }

    #[test]
    fn index_size_and_shape_checks() {
        let level = level(&[4, 8]);
        let per = level.chunks_per_shard(&[8, 16]).unwrap();
        // 2 x 2 entries of two u64, then the crc32c.
        assert_eq!(level.index_len(&per).unwrap(), 4 * 16 + 4);
        assert!(level.chunks_per_shard(&[8, 12]).unwrap_err().contains("does not divide"));
    }

    #[test]
    fn index_entries_are_checked_before_any_read() {
        assert_eq!(inner_source((u64::MAX, u64::MAX), Some(10), Some(100)), Ok(Source::Missing));
        assert_eq!(inner_source((4, 6), Some(10), Some(100)), Ok(Source::Range { offset: 4, len: 6 }));
        assert_eq!(inner_source((4, 6), None, Some(100)), Ok(Source::Range { offset: 4, len: 6 }));
        assert!(inner_source((4, 7), Some(10), Some(100)).unwrap_err().contains("outside its shard of 10 bytes"));
        assert!(inner_source((u64::MAX - 1, 5), None, None).unwrap_err().contains("overflows"));
        // Half the missing marker is neither missing nor a range.
        for entry in [(u64::MAX, 0), (u64::MAX, 7), (0, u64::MAX)] {
            assert!(inner_source(entry, None, None).unwrap_err().contains("neither"), "{entry:?}");
        }
        // Incompressible data grows a little under zstd; a corrupt index claims far more.
        assert!(inner_source((0, 1 << 20), None, Some(1 << 20)).is_ok());
        assert!(inner_source((0, 3 << 20), None, Some(1 << 20)).unwrap_err().contains("stored bytes for"));
        // A nested shard (its own index inside) has no such bound.
        assert!(inner_source((0, 3 << 20), None, None).is_ok());
    }

    #[test]
    fn fuzzing_wrappers_match_the_checks() {
        assert_eq!(fuzz_shard_index_len(&[4, 8], &[8, 16]), Ok(4 * 16 + 4));
        assert!(fuzz_shard_index_len(&[0, 8], &[8, 16]).unwrap_err().contains("zero extent"));
        assert!(fuzz_shard_index_len(&[1, 1], &[1 << 40, 1 << 40]).unwrap_err().contains("too large"));
        assert_eq!(fuzz_shard_index_entry(u64::MAX, u64::MAX, Some(10), None), Ok(None));
        assert_eq!(fuzz_shard_index_entry(4, 6, Some(10), Some(100)), Ok(Some((4, 6))));
        assert!(fuzz_shard_index_entry(u64::MAX - 1, 5, None, None).is_err());
        assert!(fuzz_shard_index_entry(u64::MAX, 0, None, None).is_err());
    }

    #[test]
    fn huge_shards_are_refused_before_zarrs_sizes_their_index() {
        // 2^40 x 2^40 inner chunks of 1 x 1: 2^80 entries.
        let level = level(&[1, 1]);
        let per = level.chunks_per_shard(&[1 << 40, 1 << 40]).unwrap();
        assert!(level.index_len(&per).unwrap_err().contains("too large for 64-bit sizes"));
        // 2^59 entries (2^63 bytes) are refused too; 2^50 fit (then too large for any shard).
        let per = level.chunks_per_shard(&[1 << 59, 1]).unwrap();
        assert!(level.index_len(&per).is_err());
        let per = level.chunks_per_shard(&[1 << 50, 1]).unwrap();
        assert_eq!(level.index_len(&per).unwrap(), (1 << 54) + 4);
        assert!(level.chunks_per_shard(&[8]).unwrap_err().contains("dimensionality"));
    }

    proptest::proptest! {
        /// Index entries are hostile input: any (offset, len) with any shard length and decoded
        /// size is missing, a range inside the shard, or an error; never a panic.
        #[test]
        fn index_entries_never_panic(
            offset in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..1024u64],
            len in proptest::prop_oneof![proptest::strategy::Just(u64::MAX), proptest::prelude::any::<u64>(), 0..1024u64],
            shard_len in proptest::option::of(proptest::prelude::any::<u64>()),
            decoded in proptest::option::of(proptest::prop_oneof![proptest::prelude::any::<u64>(), 0..4096u64]),
        ) {
            if let Ok(Source::Range { offset: o, len: l }) = inner_source((offset, len), shard_len, decoded) {
                proptest::prop_assert_eq!((o, l), (offset, len));
                let end = o.checked_add(l);
                proptest::prop_assert!(end.is_some());
                proptest::prop_assert!(shard_len.is_none_or(|s| end.is_some_and(|e| e <= s)));
            }
        }

        /// Shard and inner chunk shapes from metadata: the index size is a number or an error.
        #[test]
        fn index_sizes_never_panic(
            shard in proptest::collection::vec(proptest::prop_oneof![proptest::prelude::any::<u64>(), 1..64u64], 1..4),
        ) {
            let level = level(&vec![1; shard.len()]);
            if let Ok(per) = level.chunks_per_shard(&shard) {
                let _ = level.index_len(&per);
            }
        }
    }
}

#[cfg(test)]
#[path = "shard_consistency.rs"]
mod consistency_tests;
