//! The sharded read: every innermost chunk of a sharded array that meets a subset becomes a
//! decode unit, its byte range in the shard's value (from its index) or missing, and the version
//! of the value its index came from.

use std::num::NonZeroU64;

use rayon::prelude::*;
use zarrs::array::ArraySubset;
use zarrs_storage::StoreKey;

use super::index::{inner_source, read_index, ReadIndex, ShardRef};
use super::level::ShardLevel;
use crate::error::GpuError;
use crate::pipeline::plan::plan_chunks;
use crate::pipeline::unit::{Source, Unit};
use crate::reader::ReadSource;
use crate::shard_index_cache::ShardIndexCache;

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

/// The inner chunks of `shard` meeting `subset`: (indices within the shard, their subset).
pub(super) fn inner_chunks_meeting(
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
pub(super) fn ravel(idx: &[u64], shape: &[NonZeroU64]) -> u64 {
    idx.iter().zip(shape).fold(0, |acc, (&i, n)| acc * n.get() + i)
}

/// The decode units of `subset` of a sharded array: every innermost chunk meeting it, with its
/// byte range (or missing). `shards` are the array's chunks meeting the subset: (indices, key,
/// unbounded subset). Indexes are read in parallel on the current rayon pool (the caller's
/// reader's), a level at a time. Returns the units and the index bytes read.
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
        let at = LevelRead { level, innermost: depth + 1 == levels.len(), elem, subset };
        let indexes: Vec<Option<ReadIndex>> =
            open.par_iter().map(|shard| read_index(source, depth, level, shard)).collect::<Result<_, _>>()?;
        let mut next = Vec::new();
        for (shard, index) in open.iter().zip(indexes) {
            index_bytes += index.as_ref().map_or(0, |i| i.read);
            for inner in at.inner_chunks(shard, index.as_ref())? {
                match inner {
                    Inner::Unit(unit) => units.push(unit),
                    Inner::Nested(nested) => next.push(nested),
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

/// One level of a sharded read: its sharding, whether its inner chunks are the innermost, the
/// element size and the subset read.
struct LevelRead<'a> {
    level: &'a ShardLevel,
    innermost: bool,
    elem: u64,
    subset: &'a ArraySubset,
}

/// What an inner chunk of an open shard becomes: a decode unit (innermost chunks), or a nested
/// shard for the next level.
enum Inner {
    Unit(Unit),
    Nested(NestedShard),
}

impl LevelRead<'_> {
    /// The inner chunks of `shard` that meet the subset, from its index (None: the shard does
    /// not exist, so they are missing).
    fn inner_chunks(&self, shard: &ShardRef, index: Option<&ReadIndex>) -> Result<Vec<Inner>, GpuError> {
        let per_shard = self
            .level
            .chunks_per_shard(shard.subset.shape())
            .map_err(|reason| GpuError::chunk(shard.key.to_string(), reason))?;
        let mut out = Vec::new();
        for (idx, inner_subset) in inner_chunks_meeting(self.level, &shard.subset, self.subset)? {
            // ravel < the index's entries, whose count index_len checked.
            let k = ravel(&idx, &per_shard) as usize;
            out.extend(self.inner_chunk(shard, index, k, inner_subset)?);
        }
        Ok(out)
    }

    /// Inner chunk `k` (in C order) of `shard`, which covers `inner_subset`; None where it
    /// places nothing of the subset.
    fn inner_chunk(
        &self,
        shard: &ShardRef,
        index: Option<&ReadIndex>,
        k: usize,
        inner_subset: ArraySubset,
    ) -> Result<Option<Inner>, GpuError> {
        let name = named_from(&shard.origin, &inner_subset, self.level);
        let label = || format!("{} (inner chunk {name:?})", shard.key);
        // Planned first: its decoded size is checked there, once. Nested shards hold an index
        // of their own: only innermost chunks have a bound.
        let placement = if self.innermost {
            plan_chunks(self.elem, self.subset, [(name.clone(), shard.key.clone(), inner_subset.clone())])?.pop()
        } else {
            None
        };
        let decoded = placement.as_ref().map(|p| p.chunk_bytes);
        let source = match index.map(|i| (i.index.get(2 * k).zip(i.index.get(2 * k + 1)), i.shard_len)) {
            None => Source::Missing,
            Some((None, _)) => return Err(GpuError::chunk(label(), "its shard index is too short")),
            Some((Some((&offset, &len)), shard_len)) => match inner_source((offset, len), shard_len, decoded) {
                Ok(Source::Range { offset, len }) => {
                    let offset = shard.base.checked_add(offset).ok_or_else(|| {
                        GpuError::chunk(label(), format!("shard at byte {} + offset {offset} overflows", shard.base))
                    })?;
                    Source::Range { offset, len }
                }
                Ok(source) => source,
                Err(reason) => return Err(GpuError::chunk(label(), reason)),
            },
        };
        let version = index.and_then(|i| i.version.clone());
        if !self.innermost {
            // A nested shard: opened at the next level (from the version of the value this
            // index came from), or wholly missing.
            let (key, origin) = (shard.key.clone(), shard.origin.clone());
            return Ok(Some(Inner::Nested(match source {
                Source::Range { offset, len } => NestedShard::Stored(ShardRef {
                    key,
                    base: offset,
                    len: Some(len),
                    subset: inner_subset,
                    origin,
                    version,
                }),
                Source::Missing => NestedShard::Missing { key, subset: inner_subset, origin },
                Source::Whole => return Err(GpuError::chunk(label(), "an index entry of another kind")),
            })));
        }
        // A missing inner chunk reads nothing: no version to check.
        let version = version.filter(|_| source != Source::Missing);
        Ok(placement.map(|placement| {
            Inner::Unit(Unit {
                placement,
                source,
                inner: Some(name),
                narrowed: false,
                value_len: None,
                direct: None,
                rows: None,
                version,
            })
        }))
    }
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
