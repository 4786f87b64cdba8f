//! The sharded write's layout: a shard's file from its inner chunks' encoded bytes (nested levels
//! too), and where a stored shard's inner chunks lie (what a write keeps of a shard it changes in
//! part).

use std::num::NonZeroU64;

use zarrs::array::codec::ShardingIndexLocation;
use zarrs::array::{ArraySubset, ArrayToBytesCodecTraits, CodecOptions, FillValue};

use super::index::inner_source;
use super::level::ShardLevel;
use crate::pipeline::unit::Source;

impl ShardLevel {
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
