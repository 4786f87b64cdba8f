//! One level of sharding: the inner chunk shape, the index's codecs and place, and the geometry
//! reads and writes share (inner chunks per shard, the index's encoded size).

use std::num::NonZeroU64;
use std::sync::Arc;

use zarrs::array::codec::{CodecChain, ShardingCodec, ShardingCodecConfiguration, ShardingIndexLocation};
use zarrs::array::{ArrayToBytesCodecTraits, BytesRepresentation, FillValue};

/// One level of sharding: the inner chunk shape and how to find and decode the index.
#[derive(Clone, Debug)]
pub(crate) struct ShardLevel {
    pub(super) inner_shape: Vec<u64>,
    /// Decodes the index (its `decode_index`); the inner codecs are planned separately.
    pub(super) codec: Arc<ShardingCodec>,
    pub(super) index_codecs: Arc<CodecChain>,
    pub(super) location: ShardingIndexLocation,
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
    /// Inner chunks per shard of `shard_shape` along each dimension.
    pub(super) fn chunks_per_shard(&self, shard_shape: &[u64]) -> Result<Vec<NonZeroU64>, String> {
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
    pub(super) fn index_len(&self, chunks_per_shard: &[NonZeroU64]) -> Result<u64, String> {
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
