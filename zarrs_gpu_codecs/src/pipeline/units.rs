//! The units a request decodes: its chunks, or the inner chunks of the shards meeting its
//! subsets, each read and decoded once however many subsets meet it.

use std::collections::HashMap;

use zarrs::array::{Array, ArrayError};
use zarrs_gds_store::{ValueChanged, ValueVersion};
use zarrs_storage::{ReadableStorageTraits, StoreKey};

use crate::config::GpuConfig;
use crate::error::GpuError;
use crate::pipeline::plan::plan_chunks;
use crate::pipeline::request::{merge_placements, merge_units, Request};
use crate::pipeline::route::{ChunkRef, DevicePlan};
use crate::pipeline::shard::{sharded_units, ShardSource};
use crate::pipeline::unit::{Source, Unit};
use crate::reader::{DeviceReadError, DeviceReader, ReadSource};
use crate::shard_index_cache::ShardIndexCache;

/// The units of `request` (`chunks`: each subset's), stored as `plan` says, read from `source`:
/// chunks, or the inner chunks meeting the subsets (their shards' indexes read through `reader`);
/// uncompressed inner chunks narrowed to the bytes the subsets need, and uncompressed units read
/// as rows where the source's reads allow. With the bytes read for shard indexes.
pub(crate) fn units_of<S: ReadableStorageTraits + ?Sized + 'static>(
    array: &Array<S>,
    request: &Request,
    chunks: Vec<Vec<ChunkRef>>,
    source: ReadSource<'_>,
    config: &GpuConfig,
    reader: &DeviceReader,
    plan: &DevicePlan,
) -> Result<(Vec<Unit>, u64), GpuError> {
    let elem = array.data_type().fixed_size().expect("checked before the read (element_size)") as u64;
    // Rows of uncompressed chunks are read with preadv on a GdsStore's files where its device
    // reads would go through preads anyway. Asked only for raw chains (checked ones read to host
    // memory, whatever the backend; asking would open cuFile's driver for nothing).
    let rows = config.row_reads() && plan.chain.is_raw() && source.reads_rows(config.backend())?;
    if plan.shards.is_empty() {
        let mut placements = Vec::new();
        for ((subset, base), chunks) in request.parts().zip(chunks) {
            for mut placement in plan_chunks(elem, subset, chunks)? {
                placement.shift_output(base)?;
                placements.push(placement);
            }
        }
        let unit = if plan.chain.is_raw() { Unit::raw } else { Unit::whole };
        let mut units: Vec<Unit> = merge_placements(placements)?.into_iter().map(unit).collect();
        if rows {
            units.iter_mut().for_each(Unit::read_as_rows);
        }
        return Ok((units, 0));
    }
    // A request of several subsets reads each shard's index once: through the caller's cache,
    // else one of its own.
    let own_cache;
    let cache = match config.shard_index_cache() {
        Some(cache) => Some(cache),
        None if request.subsets.len() > 1 => {
            own_cache = ShardIndexCache::new();
            Some(&own_cache)
        }
        None => None,
    };
    if let Some(cache) = cache {
        cache.bind(&array.storage());
    }
    let shards = ShardSource { source, cache };
    let mut units = Vec::new();
    let mut index_bytes = 0;
    for ((subset, base), refs) in request.parts().zip(chunks) {
        let (part, read) = reader.install(|| sharded_units(&shards, &plan.shards, elem, subset, refs))?;
        index_bytes += read;
        for mut unit in part {
            unit.placement.shift_output(base)?;
            units.push(unit);
        }
    }
    one_version_per_value(&units)?;
    let mut units = if request.subsets.len() > 1 { merge_units(units)? } else { units };
    if plan.chain.is_raw() {
        narrow_raw(&mut units)?;
        if rows {
            units.iter_mut().for_each(Unit::read_as_rows);
        }
    }
    Ok((units, index_bytes))
}

/// The units of one value carry one version of it (their offsets come from its index, read
/// once per subset where not cached): two versions (a writer replaced the shard between two
/// reads of its index) have the read planned again.
fn one_version_per_value(units: &[Unit]) -> Result<(), GpuError> {
    let mut seen: HashMap<&StoreKey, &ValueVersion> = HashMap::new();
    for unit in units {
        let Some(version) = &unit.version else { continue };
        if seen.insert(&unit.placement.key, version).is_some_and(|held| held != version) {
            let changed = ValueChanged::new(unit.placement.key.to_string(), "its index was read from two versions");
            return Err(unit.error_from(Box::new(changed)));
        }
    }
    Ok(())
}

/// The change of a value (a shard replaced between the read of its index and the read of its
/// inner chunks) that `err` reports, wherever in the pipeline it was found.
pub(crate) fn value_changed(err: &GpuError) -> Option<&ValueChanged> {
    match err {
        GpuError::Read(DeviceReadError::Read(err)) => err.value_changed(),
        GpuError::Array(ArrayError::StorageError(err)) => ValueChanged::in_storage_error(err),
        GpuError::Chunk { source: Some(source), .. } => source.downcast_ref(),
        _ => None,
    }
}

/// Run `read` (a read planned from shard indexes, then made), and once more where a shard
/// changed between its index and its inner chunks: planned again from the indexes as they are
/// then. A shard that changed during both is an error naming it: its index and its chunks are
/// never taken from two versions.
///
/// # Errors
/// `read`'s error; a [`GpuError::Chunk`] naming the shard when it changed during both reads.
pub(crate) fn replanned_once<T>(mut read: impl FnMut() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match read() {
        Err(err) if value_changed(&err).is_some() => read().map_err(|err| match value_changed(&err) {
            Some(changed) => GpuError::Chunk {
                key: changed.what.clone(),
                reason: format!(
                    "it was replaced while it was read, twice: its index and its chunks would come from \
                     two versions ({})",
                    changed.reason
                ),
                source: Some(Box::new(changed.clone())),
            },
            None => err,
        }),
        done => done,
    }
}

/// Uncompressed inner chunks in the platform's byte order are their elements: read only the bytes
/// a subset needs (`byte_start..byte_end` of each) rather than whole inner chunks. An index entry
/// of another length than the chunk's is an error.
fn narrow_raw(units: &mut [Unit]) -> Result<(), GpuError> {
    for unit in units {
        if let Source::Range { offset, len } = unit.source {
            let full = unit.decoded_len();
            if len != full {
                return Err(unit.error(format!("{len} bytes stored, {full} expected")));
            }
            unit.source = Source::Range { offset: offset + unit.placement.byte_start, len: unit.placement.read_len() };
            unit.narrowed = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::plan::plan_chunks;
    use zarrs::array::ArraySubset;

    /// Units of one value from two versions of its index (a writer between two reads of it) are
    /// a change, which `replanned_once` plans again once; other errors are not retried.
    #[test]
    fn one_version_per_value_and_one_more_plan() {
        let key = StoreKey::new("s/c/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0], vec![8]).unwrap();
        let placement = plan_chunks(4, &chunk, [(vec![0], key, chunk.clone())]).unwrap().pop().unwrap();
        let unit = |tag: &str| Unit { version: Some(ValueVersion::ETag(tag.into())), ..Unit::whole(placement.clone()) };
        assert!(one_version_per_value(&[unit("a"), unit("a"), Unit::whole(placement.clone())]).is_ok());
        let err = one_version_per_value(&[unit("a"), unit("b")]).unwrap_err();
        assert!(value_changed(&err).is_some() && err.to_string().contains("s/c/0"), "{err}");
        // A change once: planned again; every time: an error naming the value; another error:
        // returned as it is, not retried.
        let mut calls = 0;
        let once = replanned_once(|| {
            calls += 1;
            if calls == 1 {
                one_version_per_value(&[unit("a"), unit("b")])
            } else {
                Ok(())
            }
        });
        assert!(once.is_ok() && calls == 2);
        let err = replanned_once(|| one_version_per_value(&[unit("a"), unit("b")])).unwrap_err();
        assert!(err.to_string().contains("s/c/0") && err.to_string().contains("twice"), "{err}");
        calls = 0;
        let err = replanned_once(|| -> Result<(), GpuError> {
            calls += 1;
            Err(GpuError::Unsupported("no".into()))
        });
        assert!(err.is_err() && calls == 1);
    }

    #[test]
    fn uncompressed_inner_chunks_read_only_the_bytes_a_subset_needs() {
        // Inner chunk [4, 8] of u32 at offset 1000 of its shard; the subset wants rows 1..3.
        let key = StoreKey::new("s/c/0").unwrap();
        let chunk = ArraySubset::new_with_start_shape(vec![0, 0], vec![4, 8]).unwrap();
        let subset = ArraySubset::new_with_ranges(&[1..3, 0..8]);
        let placement = plan_chunks(4, &subset, [(vec![0, 0], key, chunk)]).unwrap().pop().unwrap();
        let unit = |len| Unit { source: Source::Range { offset: 1000, len }, ..Unit::whole(placement.clone()) };
        let mut units = vec![unit(128), Unit { source: Source::Missing, ..unit(128) }];
        narrow_raw(&mut units).unwrap();
        assert_eq!(units[0].source, Source::Range { offset: 1032, len: 64 });
        assert!(units[0].narrowed && units[0].raw_len() == 64);
        assert_eq!(units[1].source, Source::Missing);
        // An index entry of another length than the chunk's.
        let err = narrow_raw(&mut [unit(100)]).unwrap_err();
        assert!(err.to_string().contains("100 bytes stored, 128 expected"), "{err}");
    }
}
