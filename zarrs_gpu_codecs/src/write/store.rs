//! A batch's encoded chunks stored: all-fill chunks erased (as zarrs does), crc32c appended, a
//! shard covered in part laid out again with the inner chunks it keeps, the files written by the
//! store (a `GdsStore` writes them as one, from the pinned buffer).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;
use zarrs::array::Array;
use zarrs::array::ArrayToBytesCodecTraits;
use zarrs_gds_store::{Expected, GdsStore};
use zarrs_storage::store::MemoryStore;
use zarrs_storage::{Bytes, ReadableWritableStorageTraits, StoreKey, WritableStorageTraits};

use super::codec::WriteChain;
use super::encode::{EncodedBatch, CRC_ROOM};
use super::plan::WriteUnit;
use crate::codecs::blosc::encode::is_memcpyed;
use crate::codecs::blosc::header::HEADER_LEN as BLOSC_HEADER;
use crate::codecs::encode::WriteCodec;
use crate::error::GpuError;
use crate::pipeline::shard::{encode_shards, ShardLevel};
use crate::reader::ReadSource;
use crate::report::WriteReport;

/// What a shard covered in part keeps of its stored value: the value and where each inner
/// chunk's stored bytes lie in it (None: missing); None for a shard not stored yet (or a unit
/// that keeps nothing).
pub(super) type Kept = Option<(Bytes, Vec<Option<std::ops::Range<usize>>>)>;

/// The stored values a batch's units read before they are written again (chunks and shards
/// covered in part), each read once: the old values that are modified and the inner chunks a
/// shard keeps come from one version of it, whose identity the store compares just before the
/// new value replaces it.
pub(super) struct Olds {
    /// Per unit: what a shard covered in part keeps.
    pub(super) kept: Vec<Kept>,
    /// Per unit: the version of its file read (`Some(None)`: missing; None: not read, or a store
    /// without file versions).
    pub(super) expected: Vec<Expected>,
    /// The values read, in a store of their own: the old values are decoded from these bytes,
    /// not read again.
    pub(super) values: Arc<MemoryStore>,
}

/// The `GdsStore` behind `storage`, when it is one (or an `AnyStore` of one).
pub(super) fn gds_of<S: ?Sized + 'static>(storage: &Arc<S>) -> Option<&GdsStore> {
    ReadSource::recognise(storage).and_then(ReadSource::gds)
}

/// Read the stored values of the units that modify them (covered in part: chunks, shards), on
/// host threads, each once (a `GdsStore` says which version of the file it read); decode the
/// indexes of the shards covered in part: a damaged one is an error naming the shard, never a
/// shard rewritten without its other inner chunks.
pub(super) fn read_olds<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    units: &[WriteUnit],
    chain: &WriteChain,
) -> Result<Olds, GpuError> {
    let storage = array.storage();
    let gds = gds_of(&storage);
    // Units keep inner chunks only with one level of sharding.
    let level = match chain.shards.as_slice() {
        [level] => Some(level),
        _ => None,
    };
    let read: Vec<(Kept, Expected, Option<Bytes>)> = units
        .par_iter()
        .map(|unit| {
            if unit.touched.is_none() && unit.olds.is_empty() {
                return Ok((None, None, None));
            }
            let key = &unit.placement.key;
            let named = |reason: String| GpuError::chunk(key.to_string(), reason);
            let (bytes, expected) = match gds {
                Some(store) => {
                    let (bytes, version) =
                        store.get_versioned(key).map_err(|e| named(format!("reading it to modify: {e}")))?;
                    (bytes, Some(version))
                }
                None => (storage.get(key).map_err(|e| named(format!("reading it to modify: {e}")))?, None),
            };
            let kept = match (&bytes, level, &unit.touched) {
                (Some(bytes), Some(level), Some(_)) => {
                    let ranges = level
                        .stored_chunks(&unit.placement.chunk_shape, bytes)
                        .map_err(|e| named(format!("the stored shard: {e}")))?;
                    Some((bytes.clone(), ranges))
                }
                _ => None,
            };
            Ok((kept, expected, bytes))
        })
        .collect::<Result<_, GpuError>>()?;
    let values = Arc::new(MemoryStore::new());
    let mut olds = Olds { kept: Vec::with_capacity(units.len()), expected: Vec::with_capacity(units.len()), values };
    for (unit, (kept, expected, bytes)) in units.iter().zip(read) {
        if let Some(bytes) = bytes {
            olds.values
                .set(&unit.placement.key, bytes)
                .map_err(|e| GpuError::chunk(unit.placement.key.to_string(), e.to_string()))?;
        }
        olds.kept.push(kept);
        olds.expected.push(expected);
    }
    Ok(olds)
}

/// What storing a batch did: chunks written, erased, the bytes stored, and the seconds it took.
pub(super) type Stored = (usize, usize, u64, f64);

impl WriteReport {
    pub(super) fn add(&mut self, (written, erased, bytes, seconds): Stored) {
        self.written += written;
        self.erased += erased;
        self.bytes_stored += bytes;
        self.store_seconds += seconds;
    }
}

/// Store one batch's encoded chunks (`encoded`, in the units' order): those all fill value are
/// erased (zarrs' behaviour, unless `store_empty`: then a chunk of fill value is stored as any
/// other, and a shard's inner chunks of fill value are left out of it as zarrs leaves them), the
/// others stored with their crc32c where the chain has one. Values read before (`olds`) are
/// replaced only if their files are still the versions read.
pub(super) fn store_batch<S: ReadableWritableStorageTraits + 'static>(
    array: &Array<S>,
    units: &[WriteUnit],
    (mut encoded, olds): (EncodedBatch, Olds),
    chain: &WriteChain,
    store_empty: bool,
) -> Result<Stored, GpuError> {
    let start = Instant::now();
    // The fill value as stored (its words swapped where the chunk's are).
    let mut fill = array.fill_value().as_ne_bytes().to_vec();
    if let Some(swap) =
        chain.layout.as_ref().map(|l| l.swap as usize).filter(|&w| w > 1 && fill.len().is_multiple_of(w))
    {
        fill.chunks_exact_mut(swap).for_each(<[u8]>::reverse);
    }
    let all_fill =
        |raw: &[u8], len: u64| raw.len() as u64 == len && raw.chunks_exact(fill.len().max(1)).all(|e| *e == *fill);
    // An encoded chunk can be all fill value only when it compressed to a small fraction of its
    // size (or is small, when its frame's overhead weighs): only those are decoded again to check,
    // by the codec's host decoder. A memcpyed Blosc chunk holds its raw bytes.
    let is_fill = |bytes: &[u8], len: u64| -> bool {
        let Some(decoder) = &chain.decoder else { return all_fill(bytes, len) };
        if matches!(chain.codec, Some(WriteCodec::Blosc(_))) && is_memcpyed(bytes) {
            return all_fill(&bytes[BLOSC_HEADER..], len);
        }
        if bytes.len() as u64 * 32 > len && len > 1 << 16 {
            return false;
        }
        let mut raw = vec![0u8; len as usize];
        decoder.decode_host(bytes, &mut raw).is_ok_and(|n| n as u64 == len && all_fill(&raw, len))
    };
    // Each chunk's bytes with the room after them, in turn (the frames lie in order).
    let host = encoded.buffer.as_mut().expect("held until dropped").as_mut_slice();
    let mut slots = Vec::with_capacity(encoded.frames.len());
    let mut rest = host;
    let mut at = 0;
    for &(start, len) in &encoded.frames {
        let (slot, tail) = std::mem::take(&mut rest)[start - at..].split_at_mut(len + CRC_ROOM);
        slots.push(slot);
        rest = tail;
        at = start + len + CRC_ROOM;
    }
    // The raw length of each encoded chunk (a shard's are its inner chunks).
    let raw_lens: Vec<u64> = units
        .iter()
        .flat_map(|u| {
            let (count, bytes) = u.encoded();
            std::iter::repeat_n(bytes, count)
        })
        .collect();
    if raw_lens.len() != slots.len() {
        return Err(GpuError::Unsupported(format!("{} chunks encoded for {} to store", slots.len(), raw_lens.len())));
    }
    // Each chunk's stored bytes (its crc32c appended), or None where it is all fill value.
    let chunks: Vec<Option<&[u8]>> = slots
        .into_par_iter()
        .zip(raw_lens)
        .map(|(slot, raw_len)| {
            let len = slot.len() - CRC_ROOM;
            // A shard's inner chunks of fill value are left out of it whatever the setting.
            if (!store_empty || !chain.shards.is_empty()) && is_fill(&slot[..len], raw_len) {
                return None;
            }
            if !chain.crc32c {
                return Some(&slot[..len]);
            }
            let crc = crc32c::crc32c(&slot[..len]);
            slot[len..].copy_from_slice(&crc.to_le_bytes());
            Some(&*slot)
        })
        .collect();
    // Each unit's value: the chunk's bytes as they are, a shard laid out with its index; None
    // (erased) where all of it is fill value.
    let values: Vec<Option<Cow<'_, [u8]>>> = match chain.shards.as_slice() {
        [] => chunks.into_iter().map(|c| c.map(Cow::Borrowed)).collect(),
        levels => {
            let shards = shard_values(levels, units, &olds.kept, chunks)?;
            let mut values = Vec::with_capacity(shards.len());
            for (unit, shard) in units.iter().zip(shards) {
                values.push(match shard {
                    Some(shard) => Some(Cow::Owned(shard)),
                    // A shard of fill value kept as zarrs keeps it: its index, every entry missing.
                    None if store_empty => Some(Cow::Owned(fill_shard(array, unit)?)),
                    None => None,
                });
            }
            values
        }
    };
    let storage = array.storage();
    let named = |key: &StoreKey| {
        let key = key.to_string();
        move |e: zarrs_storage::StorageError| GpuError::chunk(key, format!("storing it: {e}"))
    };
    let gds = gds_of(&storage);
    let (sets, erases): (Vec<_>, Vec<_>) = units
        .iter()
        .map(|u| &u.placement.key)
        .zip(values)
        .zip(&olds.expected)
        .partition(|((_, value), _)| value.is_some());
    // A GdsStore erases a value only if it is still the version read.
    erases.par_iter().try_for_each(|((key, _), &expected)| match gds {
        Some(store) => store.erase_checked(key, expected).map_err(named(key)),
        None => storage.erase(key).map_err(named(key)),
    })?;
    let (sets, expected): (Vec<KeyedValue<'_>>, Vec<Expected>) =
        sets.into_iter().filter_map(|((key, value), &expected)| value.map(|v| (((*key).clone(), v), expected))).unzip();
    // A GdsStore writes them as one, from the pinned buffer: every file flushed in parallel, each
    // directory once, each replaced only if still the version read. Other stores take owned
    // bytes.
    match gds {
        Some(store) => store.set_many_checked(&sets, &expected).map_err(|e| GpuError::Array(e.into()))?,
        None => sets
            .par_iter()
            .try_for_each(|(key, value)| storage.set(key, Bytes::copy_from_slice(value)).map_err(named(key)))?,
    }
    let bytes = sets.iter().map(|(_, v)| v.len() as u64).sum();
    Ok((sets.len(), erases.len(), bytes, start.elapsed().as_secs_f64()))
}

/// A value to store under its key.
type KeyedValue<'a> = (StoreKey, Cow<'a, [u8]>);

/// The stored value of `unit`'s shard when all of it is fill value and empty chunks are stored:
/// zarrs' own encoding of it (an index whose every entry is missing).
fn fill_shard<S: ?Sized>(array: &Array<S>, unit: &WriteUnit) -> Result<Vec<u8>, GpuError> {
    let key = &unit.placement.key;
    let named = |reason: String| GpuError::chunk(key.to_string(), reason);
    let shape: Vec<std::num::NonZeroU64> = unit
        .placement
        .chunk_shape
        .iter()
        .map(|&n| std::num::NonZeroU64::new(n).ok_or_else(|| named("a shard of zero elements".into())))
        .collect::<Result<_, _>>()?;
    let elements = unit.placement.chunk_shape.iter().product::<u64>();
    let fill = zarrs::array::ArrayBytes::new_fill_value(array.data_type(), elements, array.fill_value())
        .map_err(|e| named(format!("a shard of fill value: {e}")))?;
    let options = zarrs::config::global_config().codec_options().with_store_empty_chunks(true);
    let encoded = array
        .codecs()
        .encode(fill, &shape, array.data_type(), array.fill_value(), &options)
        .map_err(|e| named(format!("encoding a shard of fill value: {e}")))?;
    Ok(encoded.into_owned())
}

/// Each shard's value from its encoded inner chunks `chunks` (the units' in order; None: fill
/// value): a shard covered in part with its other inner chunks as `kept`, laid out by `levels`;
/// None where all of it is missing (erased).
fn shard_values(
    levels: &[ShardLevel],
    units: &[WriteUnit],
    kept: &[Kept],
    mut chunks: Vec<Option<&[u8]>>,
) -> Result<Vec<Option<Vec<u8>>>, GpuError> {
    let mut parts = Vec::with_capacity(units.len());
    for (unit, kept) in units.iter().zip(kept) {
        let rest = chunks.split_off(unit.encoded().0);
        parts.push((unit, kept, std::mem::replace(&mut chunks, rest)));
    }
    parts
        .into_par_iter()
        .map(|(unit, kept, new)| {
            let named = |reason: String| GpuError::chunk(unit.placement.key.to_string(), reason);
            // A shard covered in part: its other inner chunks as stored, the ones encoded
            // again in their places.
            let inner = match (&unit.touched, &unit.inner) {
                (Some(touched), Some(inner)) => {
                    let mut all: Vec<Option<&[u8]>> = match kept {
                        Some((bytes, ranges)) => ranges.iter().map(|r| r.clone().map(|r| &bytes[r])).collect(),
                        None => vec![None; inner.count],
                    };
                    if all.len() != inner.count {
                        return Err(named(format!("{} inner chunks stored, {} planned", all.len(), inner.count)));
                    }
                    for (&k, chunk) in touched.iter().zip(new) {
                        all[k] = chunk;
                    }
                    all
                }
                _ => new,
            };
            let shard = encode_shards(levels, &unit.placement.chunk_shape, &inner).map_err(named)?;
            Ok(shard)
        })
        .collect()
}
