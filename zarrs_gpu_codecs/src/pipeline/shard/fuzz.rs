//! For fuzzing only (the `shard_index` target of `fuzz/`), not part of the API: the index checks
//! on one entry, and the index size a read checks before it reads.

use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::codec::{CodecChain, ShardingCodec, ShardingIndexLocation};

use super::index::inner_source;
use super::level::ShardLevel;
use crate::pipeline::unit::Source;

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
